"""fastgen inside transformers: model.generate() with FastGen's per-head compressed cache.

SmolLM2-135M-Instruct loaded by transformers from the GGUF file scripts/get-models.sh fetches ($FASTGEN_MODEL,
or the default cache); one document and question, answered with transformers' own attention and then with
fastgen's engine at half and a quarter of the cache, with the KV bytes each holds.

Run: python examples/python/transformers_generate.py   (needs torch, transformers, gguf)
"""

import os

import fastgen.transformers as fgt

model, tok = fgt.from_gguf()  # SmolLM2 from scripts/get-models.sh's cache, or $FASTGEN_MODEL

for path in ("/usr/share/common-licenses/GPL-3", os.path.join(os.path.dirname(os.__file__), "LICENSE.txt")):
    if os.path.isfile(path):  # Debian's copy of the GPL, else Python's own license text
        doc = open(path, encoding="utf-8").read()[:4000]
        break
messages = [{"role": "user", "content": f"{doc}\n\nWhich license is this text, and who wrote it?"}]
inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
n = inputs["input_ids"].shape[1]


def answer() -> str:
    out = model.generate(**inputs, max_new_tokens=32, do_sample=False)
    return tok.decode(out[0, n:], skip_special_tokens=True).strip()


print(f"prompt: {n} tokens")
print(f"{'transformers sdpa':24s} KV 100.0%  {answer()!r}")
for method, budget in (("fastgen-adaptive", 0.5), ("fastgen-adaptive", 0.25)):
    engine = fgt.enable(model, tok, method, budget=budget)
    text = answer()
    mem = engine.memory()
    print(f"{method + f' {budget}':24s} KV {100 * mem['kv_bytes_held'] / mem['kv_bytes_full']:5.1f}%  {text!r}")
    heads = engine.heads()
    fgt.disable(model)
print("policies of the last run's heads:", sorted({c for row in heads["components"] for c in row}))
