"""fastgen.Model: one question answered with the full cache and with FastGen's adaptive mode at a quarter of it.

Run: python examples/python/generate.py [MODEL.gguf]   (default: SmolLM2-135M-Instruct from scripts/get-models.sh)
"""

import sys

import fastgen

model = fastgen.Model(sys.argv[1] if len(sys.argv) > 1 else None)
doc = open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()[:5000] if len(sys.argv) < 3 else ""
prompt = (f"<|im_start|>user\n{doc}\n\nWhich license is this text, and who wrote it?<|im_end|>\n"
          "<|im_start|>assistant\n")
for method, budget in (("full", None), ("fastgen-adaptive", 0.25), ("h2o", None)):
    g = model.generate(prompt, method=method, budget=budget, max_tokens=32)
    print(f"{method:17s} KV {100 * g.kv_share:5.1f}%  {g.tokens_per_s:6.1f} tok/s  {g.text.strip()!r}")
p = model.profile(prompt)
print("the paper's FastGen on this prompt:", {name: int((p.policy_index == i).sum())
                                              for i, name in enumerate(p.shortlist)}, "heads per policy")
