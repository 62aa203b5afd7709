"""Writes small valid seed inputs for the fuzz targets (no real model data):
a tiny llama2.c checkpoint with a shared and one with a separate classifier,
and tiny tokenizers with a text to encode."""
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__) + "/corpus"


def checkpoint(dim, hidden, layers, heads, kv, vocab, seq, shared):
    head = dim // heads
    kv_dim = kv * head
    floats = (vocab * dim + layers * dim + layers * dim * dim + 2 * layers * kv_dim * dim
              + layers * dim * dim + layers * dim + 3 * layers * hidden * dim + dim + seq * head
              + (0 if shared else vocab * dim))
    header = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab if shared else -vocab, seq)
    return header + b"".join(struct.pack("<f", ((i * 37) % 101) / 101.0 - 0.5) for i in range(floats))


def tokenizer(pieces, text):
    body = struct.pack("<I", max(len(p) for p in pieces))
    for i, p in enumerate(pieces):
        body += struct.pack("<fi", -float(i), len(p)) + p
    head = struct.pack("<HH", len(pieces), len(text))
    return head + text + body


os.makedirs(out + "/model", exist_ok=True)
os.makedirs(out + "/tokenizer", exist_ok=True)
with open(out + "/model/seed_shared", "wb") as f:
    f.write(checkpoint(8, 12, 1, 2, 1, 16, 4, True))
with open(out + "/model/seed_separate", "wb") as f:
    f.write(checkpoint(8, 8, 2, 4, 2, 10, 3, False))
pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % b for b in range(256)] + [
    b" ", b"a", b"b", b"c", b"ab", b" a", b" ab", b".", b",", b"\xc3\xa9"]
with open(out + "/tokenizer/seed_bytes", "wb") as f:
    f.write(tokenizer(pieces, b"ab cab, a\xc3\xa9b.\x01"))
with open(out + "/tokenizer/seed_small", "wb") as f:
    f.write(tokenizer([b"<unk>", b"\n<s>\n", b"\n</s>\n", b" ", b"x", b" x"], b"x x xx"))
