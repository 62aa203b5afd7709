#!/usr/bin/env python3
"""Builds the long prompts of tests/data/long-prompts.txt, one per line, for
`fastgen eval --prompts` (a newline inside a prompt is written \\n, a
backslash \\\\). Usage: long_prompts.py [RECIPE] > prompts.txt"""
import os
import sys

LICENSES = "/usr/share/common-licenses"


def main():
    recipe = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                                 "long-prompts.txt")
    for line in open(recipe, encoding="utf-8"):
        if not line.strip() or line.startswith("#"):
            continue
        name, span, request = (f.strip() for f in line.split("|", 2))
        first, last = (int(x) for x in span.split("-"))
        path = os.path.join(LICENSES, name)
        if not os.path.exists(path):
            sys.exit(f"long_prompts.py: {path} is missing (Debian's base-files package installs it)")
        text = "".join(open(path, encoding="utf-8").readlines()[first - 1:last]).strip("\n")
        prompt = f"<|im_start|>user\n{text}\n\n{request}<|im_end|>\n<|im_start|>assistant\n"
        print(prompt.replace("\\", "\\\\").replace("\n", "\\n"))


if __name__ == "__main__":
    main()
