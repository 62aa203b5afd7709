#!/usr/bin/env python3
"""Builds long ChatML prompts for `fastgen eval --prompts`, one per line (a
newline inside a prompt is written \\n, a backslash \\\\), from a recipe.

Each recipe line is `SOURCE | first-last | request`: the lines first..last
(1-based) of a text every Debian 12 system ships, quoted in a user turn with
the request after it, then the assistant's turn opening. SOURCE is
  NAME          /usr/share/common-licenses/NAME (base-files)
  py:MODULE     Debian's python3 standard library, /usr/lib/python3.X/MODULE.py
  doc:PATH      /usr/share/doc/PATH (read through gzip when it ends in .gz)
A line `chat: FILE` adds every conversation of FILE (tests/data/...; turns
`user:` / `assistant:`, conversations separated by `---`): the turns as
ChatML after the model's default system turn, then the assistant's turn
opening. The texts are not copied into the repository: they are read where
Debian installs them, so the prompts are the same on every Debian 12 machine.

Usage: long_prompts.py [RECIPE] > prompts.txt   (default tests/data/long-prompts.txt)"""
import glob
import gzip
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def source_path(source):
    if source.startswith("py:"):
        found = sorted(glob.glob(f"/usr/lib/python3.*/{source[3:]}.py"))
        if not found:
            sys.exit(f"long_prompts.py: {source}: no /usr/lib/python3.*/{source[3:]}.py (Debian's python3 installs it)")
        return found[-1]
    if source.startswith("doc:"):
        return os.path.join("/usr/share/doc", source[4:])
    return os.path.join("/usr/share/common-licenses", source)


def read_lines(path):
    if not os.path.exists(path):
        sys.exit(f"long_prompts.py: {path} is missing (a Debian 12 system ships it)")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.readlines()


def conversations(path):
    turns, out = [], []
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("#"):
            continue
        if line.strip() == "---":
            if turns:
                out.append(turns)
            turns = []
        elif line.startswith("user:") or line.startswith("assistant:"):
            role, text = line.split(":", 1)
            turns.append([role, text.strip()])
        elif line.strip() and turns:  # a turn goes on over several lines
            turns[-1][1] += "\n" + line
    if turns:
        out.append(turns)
    return out


def emit(prompt):
    print(prompt.replace("\\", "\\\\").replace("\n", "\\n"))


def build(recipe):
    """The prompts a recipe file describes (tests/data/long-prompts.txt's format), as text."""
    base = os.path.dirname(os.path.abspath(recipe))
    prompts = []
    for line in open(recipe, encoding="utf-8"):
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("chat:"):
            path = line[5:].strip()
            for conv in conversations(path if os.path.isabs(path) else os.path.join(base, path)):
                text = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
                for role, body in conv:
                    text += f"<|im_start|>{role}\n{body}<|im_end|>\n"
                prompts.append(text + "<|im_start|>assistant\n")
            continue
        source, span, request = (f.strip() for f in line.split("|", 2))
        first, last = (int(x) for x in span.split("-"))
        text = "".join(read_lines(source_path(source))[first - 1:last]).strip("\n")
        prompts.append(f"<|im_start|>user\n{text}\n\n{request}<|im_end|>\n<|im_start|>assistant\n")
    return prompts


def main():
    recipe = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "data", "long-prompts.txt")
    for prompt in build(recipe):
        emit(prompt)


if __name__ == "__main__":
    main()
