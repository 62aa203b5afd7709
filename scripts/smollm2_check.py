#!/usr/bin/env python3
"""fastgen against two references on SmolLM2-135M-Instruct (scripts/smollm2-check.sh runs it).

1. Token ids: every string of tests/data/tokenizer-corpus.json through
   `fastgen tokenize`, llama.cpp (llama-cpp-python, special tokens parsed)
   and Hugging Face `tokenizers` built from the GGUF's own vocabulary and
   merges (Digits + ByteLevel pre-tokenizer, the control tokens added).
2. Greedy ids: each prompt of tests/data/smollm2-prompts.json, generated
   greedily for --steps tokens by `fastgen generate --policy full` and by
   llama.cpp from the same prompt ids. Where they part, the gap between
   llama.cpp's two best logits there says how close the call was.

The two differ in rounding: both quantize the activations to 8 bits for
their q4_1 products (fastgen's default; --f32-activations multiplies f32
activations by the dequantized weights instead), but llama.cpp rounds Q and
the attention probabilities to f16 against its f16 KV cache and sums in
another order. So greedy ids may part where two tokens are nearly tied. Exit status 1 when a
tokenization differs, when fewer than --min-prompts prompts agree on all
--steps greedy ids, or when they part anywhere but at a near tie (fastgen's
pick --max-gap or more below llama.cpp's, in llama.cpp's logits).
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np


def fastgen_ids(fastgen, model, text):
    out = subprocess.run([fastgen, "tokenize", "--ids", "-m", model, "-f", "-"], input=text.encode(), capture_output=True,
                         check=True)
    return [int(t) for t in out.stdout.split()]


def hf_tokenizer(model):
    """Hugging Face tokenizers built from the GGUF's vocabulary and merges."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    r = GGUFReader(model)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens, merges = strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges")
    f = r.fields["tokenizer.ggml.token_type"]
    types = [int(f.parts[i][0]) for i in f.data]
    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    if pre != "smollm":
        sys.exit(f"smollm2_check: the GGUF names pre-tokenizer {pre!r}; this oracle is built for 'smollm'")
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges])
    tk = Tokenizer(bpe)
    # SmolLM2's tokenizer.json: single digits, then GPT-2's byte-level split
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == 3])
    return tk


def greedy_llama(llm, prompt, steps, eos):
    """Greedy ids after prompt, and llama.cpp's logits at each step."""
    llm.reset()
    llm.eval(prompt)
    ids, logits = [], []
    for _ in range(steps):
        z = np.array(llm.scores[llm.n_tokens - 1])
        ids.append(int(np.argmax(z)))
        logits.append(z)
        if ids[-1] == eos:
            break
        llm.eval([ids[-1]])
    return ids, logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fastgen", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="tests/data")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--min-prompts", type=int, default=3, help="prompts whose greedy ids must all agree")
    ap.add_argument("--max-gap", type=float, default=0.5,
                    help="where greedy ids part, fastgen's pick must be less than this far below llama.cpp's "
                         "in llama.cpp's logits (a near tie, which rounding decides)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--no-llama", action="store_true",
                    help="without llama.cpp: token ids against HF tokenizers only, no greedy check")
    ap.add_argument("--fastgen-args", default="", help="more options for fastgen generate, e.g. --f32-activations")
    a = ap.parse_args()

    llm = None
    if not a.no_llama:
        import llama_cpp
        llm = llama_cpp.Llama(a.model, n_ctx=512, n_threads=a.threads, n_batch=512, logits_all=True, verbose=False)
    hf = hf_tokenizer(a.model)

    # 1. tokenizer
    corpus = json.load(open(os.path.join(a.data, "tokenizer-corpus.json"), encoding="utf-8"))
    tok_fail = 0
    print(f"== token ids: {len(corpus)} strings, fastgen vs "
          f"{'llama.cpp ' + llama_cpp.__version__ + ' vs ' if llm else ''}HF tokenizers")
    for i, text in enumerate(corpus):
        ours = fastgen_ids(a.fastgen, a.model, text)
        ref = hf.encode(text, add_special_tokens=False).ids
        cpp = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True) if llm else ref
        ok = ours == cpp == ref
        tok_fail += not ok
        if not ok:
            print(f"  DIFFER #{i} {text[:40]!r}\n    fastgen   {ours}\n    llama.cpp {cpp}\n    HF        {ref}")
    n_ids = sum(len(fastgen_ids(a.fastgen, a.model, t)) for t in corpus)
    print(f"  equal on {len(corpus) - tok_fail} of {len(corpus)} strings ({n_ids} ids)")

    if not llm:
        if a.json:
            json.dump({"tokenizer_strings": len(corpus), "tokenizer_equal": len(corpus) - tok_fail}, open(a.json, "w"))
        return 1 if tok_fail else 0

    # 2. greedy generation
    prompts = json.load(open(os.path.join(a.data, "smollm2-prompts.json"), encoding="utf-8"))
    eos = llm.token_eos()
    rows, agree, near = [], 0, 0
    print(f"\n== greedy ids: {len(prompts)} prompts x {a.steps} tokens, fastgen generate --policy full "
          f"{a.fastgen_args or '(default options: 8-bit activations)'} vs llama.cpp (q8 activations, f16 KV cache)")
    print(f"  {'#':>2} {'prompt':<34} {'ids':>5} {'equal':>5}  first difference")
    for i, p in enumerate(prompts):
        out = subprocess.run([a.fastgen, "generate", "-m", a.model, "-p", p, "-n", str(a.steps), "--temp", "0",
                              "--policy", "full", "--json"] + a.fastgen_args.split(), capture_output=True, check=True)
        g = json.loads(out.stdout)
        prompt_ids = g["tokens"][:g["n_prompt"]]
        ours = g["tokens"][g["n_prompt"]:]
        cpp, logits = greedy_llama(llm, prompt_ids, a.steps, eos)
        if len(ours) < len(cpp) and cpp[len(ours)] == eos:
            ours = ours + [eos]  # fastgen stops before EOS; llama.cpp's list ends with it
        n = min(len(ours), len(cpp))
        same = next((k for k in range(n) if ours[k] != cpp[k]), n)
        full = same == n and len(ours) == len(cpp)
        agree += full
        row = {"prompt": p, "fastgen": ours, "llama_cpp": cpp, "equal_prefix": same, "all_equal": full}
        if full:
            where = "none"
        else:  # where they part: how far fastgen's pick is below llama.cpp's in llama.cpp's own logits
            z = logits[same]
            pick = ours[same]
            row["gap"] = float(z[cpp[same]] - z[pick])
            row["rank"] = int((z > z[pick]).sum()) + 1
            near += row["gap"] < a.max_gap
            where = f"step {same}: fastgen {pick} vs llama.cpp {cpp[same]}: in llama.cpp's logits {row['gap']:.3f} " \
                f"below, its choice #{row['rank']}"
        label = p.replace("\n", "\\n")
        print(f"  {i:>2} {label[:34]:<34} {len(cpp):>5} {same:>5}  {where}")
        rows.append(row)
    print(f"  all {a.steps} greedy ids equal on {agree} of {len(prompts)} prompts; the other {len(prompts) - agree} "
          f"part where llama.cpp's logits put fastgen's pick {near} times less than {a.max_gap} below its own")
    if a.json:
        json.dump({"tokenizer_strings": len(corpus), "tokenizer_equal": len(corpus) - tok_fail, "greedy": rows},
                  open(a.json, "w"), indent=1)
    far = len(prompts) - agree - near
    if tok_fail or agree < a.min_prompts or far:
        print(f"smollm2_check: FAILED ({tok_fail} tokenizations differ; {agree} prompts agree throughout, "
              f"{a.min_prompts} needed; {far} part where llama.cpp is not near a tie)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
