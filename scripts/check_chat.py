#!/usr/bin/env python3
"""Checks the JSON of `fastgen generate --chat tests/data/smollm2-chat.txt --json`
on SmolLM2 (CI): three turns, each answered, and FastGen holding less than the
full cache; with --paris, the first answer names Paris as well.

--paris is for a run with --f32-activations: with the default 8-bit
activations (ggml's products) the greedy answer to this system turn is
French prose that never names the city, as llama.cpp's own is (llama-cpp-python
0.3.36, greedy: "L'Étoile, la Cité, la Nation, ...")."""
import json
import sys

r = json.load(open(sys.argv[1]))
print(json.dumps(r, indent=1))
assert len(r["turns"]) == 3 and all(t["reply"].strip() for t in r["turns"]), "three turns, each answered"
if "--paris" in sys.argv[2:]:
    assert "Paris" in r["turns"][0]["reply"], "the first answer names Paris"
assert 0 < r["kv_bytes_held"] < r["kv_bytes_full"], "FastGen holds less than the full cache"
print("check_chat.py: ok")
