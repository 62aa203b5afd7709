#!/usr/bin/env python3
"""Passkey retrieval prompts for `fastgen eval --passkey` (one per line:
KEY<TAB>PROMPT, a newline in the prompt written \\n): a five-digit number
hidden at a depth of 10% to 90% in 500 to 2,000 tokens of filler, asked for
at the end, as a ChatML turn whose answer the assistant's turn starts.

Usage: passkey.py [--seed S] [--count N] [--plain] > passkey.txt
  --plain: no ChatML (models without a chat template)."""
import argparse
import random

FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
          "There and back again. ")  # about 25 tokens with SmolLM2's vocabulary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--plain", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    for i in range(args.count):
        tokens = 500 + (1500 * i) // max(1, args.count - 1)  # 500 .. 2000, evenly
        repeats = max(2, tokens // 25)
        depth = 0.1 + 0.8 * rng.random()
        key = str(rng.randint(10000, 99999))
        before = int(repeats * depth)
        body = (FILLER * before + f"The pass key is {key}. " + FILLER * (repeats - before)).strip()
        intro = "There is an important number hidden inside a lot of irrelevant text. Find it and remember it.\n\n"
        question = "\n\nWhat is the pass key?"
        if args.plain:
            prompt = f"{intro}{body}{question} The pass key is"
        else:
            prompt = (f"<|im_start|>user\n{intro}{body}{question}<|im_end|>\n"
                      f"<|im_start|>assistant\nThe pass key is")
        print(key + "\t" + prompt.replace("\\", "\\\\").replace("\n", "\\n"))


if __name__ == "__main__":
    main()
