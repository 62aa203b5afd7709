"""fastgen's methods in kvpress' pipeline, beside kvpress' own presses, on one needle-in-a-document question.

SmolLM2-135M-Instruct loaded by transformers from the GGUF file scripts/get-models.sh fetches ($FASTGEN_MODEL,
or the default cache). Each press compresses the context to half its rows, then answers the question.

Run: python examples/python/kvpress_pipeline.py   (needs torch, transformers, gguf, kvpress)
"""

from kvpress import SnapKVPress, TOVAPress
from transformers import pipeline

import fastgen.transformers as fgt
from fastgen.kvpress import FastGenPress

model, tok = fgt.from_gguf()  # SmolLM2 from scripts/get-models.sh's cache, or $FASTGEN_MODEL
pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok)

context = ("The old lighthouse keeper lived alone on the rocky island. " * 8 + "The secret code is 48213. "
           + "Every evening he climbed the stairs to light the lamp. " * 8)
question = "What is the secret code?"
presses = {
    "no press": None,
    "FastGenPress (fastgen-adaptive)": FastGenPress(0.5, tokenizer=tok),
    "FastGenPress (fastgen's snapkv)": FastGenPress(0.5, method="snapkv", tokenizer=tok),
    "kvpress SnapKVPress": SnapKVPress(0.5),
    "kvpress TOVAPress": TOVAPress(0.5),
}
for label, press in presses.items():
    answer = pipe(context, question=question, press=press, max_new_tokens=16)["answer"]
    kept = getattr(press, "kept_share", None)
    print(f"{label:32s} {'' if kept is None else f'rows kept {kept:.2f}':15s} {answer!r}")
