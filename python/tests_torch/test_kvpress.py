"""fastgen's methods as kvpress presses, on SmolLM2-135M-Instruct loaded by transformers from our GGUF file.

Needs torch, transformers, gguf and kvpress (.ci/run installs them from PyPI); never skipped.
"""

import os
import sys

import numpy as np
import pytest
import torch
from transformers import DynamicCache, pipeline

import kvpress  # noqa: F401 (registers kvpress' pipeline and patches the attention functions)
import fastgen
import fastgen.transformers as fgt
from fastgen.kvpress import FastGenPress

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "scripts")
CONTEXT = ("The old lighthouse keeper lived alone on the rocky island. " * 8 + "The secret code is 48213. "
           + "Every evening he climbed the stairs to light the lamp. " * 8)
QUESTION = "What is the secret code?"


@pytest.mark.parametrize("method,ratio", [("fastgen-adaptive", 0.5), ("fastgen", 0.0)])
def test_press_masks_what_the_engine_drops(hf, model, method, ratio):
    """The press's head-wise masks are the complement of the rows fastgen's own engine keeps (through
    fastgen.transformers, f32 rows) on the same prompt, head for head."""
    m, tok = hf
    sys.path.insert(0, SCRIPTS)
    import long_prompts

    text = long_prompts.build(os.path.join(SCRIPTS, os.pardir, "tests", "data", "long-prompts.txt"))[0]
    ids = torch.tensor([model.tokenize(text)])
    n = ids.shape[1]
    press = FastGenPress(ratio, method=method, tokenizer=tok)
    with torch.no_grad(), press(m):
        m.model(input_ids=ids, past_key_values=DynamicCache(config=m.config))
    # the press's masks, read now: kvpress wraps every registered attention function, ours too when it is
    # imported after fastgen.transformers (conftest), and its wrapper clears them at the next prefill; then the
    # shared model is left without them
    modules = [layer.self_attn for layer in m.model.layers]
    masks = [module.masked_key_indices for module in modules]
    for module in modules:
        module.masked_key_indices = None
    engine = fgt.enable(m, tok, method, kv_dtype="f32", **({"budget": 1 - ratio} if ratio else {}))
    try:
        cache = engine.new_cache()
        with torch.no_grad():
            m(input_ids=ids, past_key_values=cache)
        ctx, seq = engine.context, cache.seqs[0]
        kept = 0
        for layer, mask in enumerate(masks):
            b, h, s = (x.numpy() for x in mask)
            assert (b == 0).all()
            for head in range(m.config.num_key_value_heads):
                want = np.setdiff1d(np.arange(n), ctx.positions(seq, layer, head))
                assert np.array_equal(np.sort(s[h == head]), want), (layer, head)
                kept += n - len(want)
    finally:
        fgt.disable(m)
    assert press.kept_share == pytest.approx(kept / (n * len(modules) * m.config.num_key_value_heads))
    if ratio:
        assert press.kept_share <= 1 - ratio + 0.05


def test_pipeline_answers(hf):
    """kvpress' pipeline: fastgen's full method is no press at all; fastgen-adaptive at half the context's
    rows still finds the code."""
    m, tok = hf
    pipe = pipeline("kv-press-text-generation", model=m, tokenizer=tok)
    plain = pipe(CONTEXT, question=QUESTION, max_new_tokens=16)["answer"]
    full = FastGenPress(0.0, method="full")
    assert pipe(CONTEXT, question=QUESTION, press=full, max_new_tokens=16)["answer"] == plain
    assert full.kept_share == 1.0
    press = FastGenPress(0.5, tokenizer=tok)
    answer = pipe(CONTEXT, question=QUESTION, press=press, max_new_tokens=16)["answer"]
    print(f"FastGenPress(0.5): {answer!r}, rows kept {press.kept_share:.3f}")
    assert "48213" in answer and press.kept_share <= 0.55


@pytest.mark.parametrize("method", ["snapkv", "adakv", "h2o", "tova", "streamingllm", "fastgen-adaptive"])
def test_compression_ratio_is_the_rows_dropped(method):
    """compression_ratio 0.5 keeps half the prompt's rows under every method (a budget, or a one-entry
    preset's ratios), as the engine counts them after a prefill."""
    ctx = fastgen.Context(2, 4, 2, 16, vocab_size=100, backend="ref", max_seqs=1, max_seq_len=2048)
    rng = np.random.default_rng(0)
    n = 1000
    seq = ctx.create(rng.integers(0, 100, n).astype(np.int32), FastGenPress(0.5, method=method).compression())
    for layer in range(2):
        ctx.prefill(seq, layer, *(rng.standard_normal((n, h, 16), dtype=np.float32) for h in (4, 2, 2)))
    mem = ctx.memory(seq)
    ctx.close()
    assert abs(mem["rows_kept"] / mem["rows_full"] - 0.5) <= 0.01


def test_errors(hf):
    m, _ = hf
    with pytest.raises(ValueError, match="compression_ratio must be in"):
        FastGenPress(1.0)
    with pytest.raises(ValueError, match="unknown"):
        FastGenPress(0.5, method="no-such-method")
    with pytest.raises(ValueError, match="unknown field 'windw'"):
        FastGenPress(0.5, options={"windw": 8})
    with pytest.raises(ValueError, match="fastgen sets its own memory"):
        FastGenPress(0.5, method="fastgen")  # the paper's threshold: compression_ratio=0 only
    press = FastGenPress(0.5)
    with pytest.raises(ValueError, match="input_ids"), torch.no_grad(), press(m):
        m.model(inputs_embeds=m.get_input_embeddings()(torch.tensor([[1, 2, 3]])),
                past_key_values=DynamicCache(config=m.config))
