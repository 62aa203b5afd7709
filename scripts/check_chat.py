#!/usr/bin/env python3
"""Checks the JSON of `fastgen generate --chat tests/data/smollm2-chat.txt --json`
on SmolLM2 (CI): three turns, each answered, the first naming Paris, and
FastGen holding less than the full cache."""
import json
import sys

r = json.load(open(sys.argv[1]))
print(json.dumps(r, indent=1))
assert len(r["turns"]) == 3 and all(t["reply"].strip() for t in r["turns"]), "three turns, each answered"
assert "Paris" in r["turns"][0]["reply"], "the first answer names Paris"
assert 0 < r["kv_bytes_held"] < r["kv_bytes_full"], "FastGen holds less than the full cache"
print("check_chat.py: ok")
