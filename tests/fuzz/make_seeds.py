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


# ---- GGUF seeds: a tiny llama model (mixed tensor types) and a file of K-quant tensors
def gguf(kvs, tensors, align=32):
    def s(x):
        return struct.pack("<Q", len(x)) + x
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, vtype, payload in kvs:
        out += s(key) + struct.pack("<I", vtype) + payload
    data, infos = b"", b""
    for name, dims, ttype, raw in tensors:
        infos += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", ttype, len(data))
        data += raw + b"\0" * (-len(raw) % align)
    out += infos
    out += b"\0" * (-len(out) % align)
    return out + data


def u32(key, v):
    return (key, 4, struct.pack("<I", v))


def f32(key, v):
    return (key, 6, struct.pack("<f", v))


def strs(key, items):
    return (key, 9, struct.pack("<IQ", 8, len(items)) + b"".join(struct.pack("<Q", len(x)) + x for x in items))


def nums(key, fmt, code, items):
    return (key, 9, struct.pack("<IQ", code, len(items)) + b"".join(struct.pack("<" + fmt, x) for x in items))


def pseudo(n, seed):
    return bytes(((i * 131 + seed * 17) ^ (i >> 3)) & 0xFF for i in range(n))


def f32_tensor(name, cols, rows, seed):
    return (name, [cols, rows], 0, b"".join(struct.pack("<f", ((i * 37 + seed) % 101) / 101.0 - 0.5)
                                             for i in range(cols * rows)))


def q8_0_tensor(name, cols, rows, seed):  # blocks of f16 scale 0.01 + 32 int8
    block = struct.pack("<e", 0.01) + bytes((i * 7 + seed) % 200 for i in range(32))
    return (name, [cols, rows], 8, block * (cols // 32 * rows))


os.makedirs(out + "/gguf", exist_ok=True)
dim, hidden, vocab = 32, 32, 8
tokens = [b"<unk>", b"<s>", b"</s>", b"\xe2\x96\x81", b"a", b"b", b"\xe2\x96\x81a", b"<0x41>"]
kvs = [("general.architecture".encode(), 8, struct.pack("<Q", 5) + b"llama"),
       u32(b"llama.context_length", 16), u32(b"llama.embedding_length", dim), u32(b"llama.block_count", 1),
       u32(b"llama.feed_forward_length", hidden), u32(b"llama.attention.head_count", 2),
       u32(b"llama.attention.head_count_kv", 1), f32(b"llama.rope.freq_base", 10000.0),
       f32(b"llama.attention.layer_norm_rms_epsilon", 1e-5),
       (b"tokenizer.ggml.model", 8, struct.pack("<Q", 5) + b"llama"), strs(b"tokenizer.ggml.tokens", tokens),
       nums(b"tokenizer.ggml.scores", "f", 6, [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -0.5, -4.0]),
       nums(b"tokenizer.ggml.token_type", "i", 5, [2, 3, 3, 1, 1, 1, 1, 6]),
       u32(b"tokenizer.ggml.bos_token_id", 1), u32(b"tokenizer.ggml.eos_token_id", 2)]
tensors = [q8_0_tensor(b"token_embd.weight", dim, vocab, 1), f32_tensor(b"output_norm.weight", dim, 1, 2),
           f32_tensor(b"blk.0.attn_norm.weight", dim, 1, 3), f32_tensor(b"blk.0.ffn_norm.weight", dim, 1, 4),
           q8_0_tensor(b"blk.0.attn_q.weight", dim, dim, 5), q8_0_tensor(b"blk.0.attn_k.weight", dim, 16, 6),
           f32_tensor(b"blk.0.attn_v.weight", dim, 16, 7), f32_tensor(b"blk.0.attn_output.weight", dim, dim, 8),
           q8_0_tensor(b"blk.0.ffn_gate.weight", dim, hidden, 9), f32_tensor(b"blk.0.ffn_down.weight", hidden, dim, 10),
           q8_0_tensor(b"blk.0.ffn_up.weight", dim, hidden, 11)]
with open(out + "/gguf/seed_llama", "wb") as f:
    f.write(gguf(kvs, tensors))
# one 256-value row of each block type, bytes made up (scales may be anything)
sizes = {2: 18, 3: 20, 6: 22, 7: 24, 10: 84, 11: 110, 12: 144, 13: 176, 14: 210, 20: 18, 23: 136, 30: 512, 1: 512}
quants = [(b"t%d" % t, [256, 1], t, pseudo(n * (256 // 32 if n in (18, 20, 22, 24) and t in (2, 3, 6, 7, 20) else 1), t))
          for t, n in sizes.items()]
with open(out + "/gguf/seed_quants", "wb") as f:
    f.write(gguf([u32(b"general.alignment", 64)], quants, 64))
