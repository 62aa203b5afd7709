"""fastgen inside transformers: SmolLM2-135M-Instruct loaded by transformers from our GGUF file (fp32).

Needs torch, transformers and gguf (.ci/run installs them from PyPI); never skipped.
"""

import copy
import os
import sys

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

import fastgen
import fastgen.transformers as fgt

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, os.pardir, os.pardir, "scripts")
SHORT = ["<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
         "Once upon a time, in a small village by the sea,",
         "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"]
STEPS = 32


@pytest.fixture(scope="module")
def long_prompts():
    sys.path.insert(0, SCRIPTS)
    import long_prompts

    return long_prompts.build(os.path.join(SCRIPTS, os.pardir, "tests", "data", "long-prompts.txt"))[:2]


def greedy(model, ids, **kw):
    x = torch.tensor([ids]) if isinstance(ids[0], int) else torch.tensor(ids)
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=STEPS, do_sample=False,
                         pad_token_id=2, **kw)
    return out[:, x.shape[1]:].tolist()


def test_full_is_transformers_attention(hf, model):
    """fastgen's full cache (f32 rows) in generate(): transformers' own greedy ids, 3 prompts x 32 tokens."""
    m, tok = hf
    for prompt in SHORT:
        ids = model.tokenize(prompt)
        want = greedy(m, ids)
        engine = fgt.enable(m, tok, "full", kv_dtype="f32")
        try:
            got = greedy(m, ids)
            mem = engine.memory()
        finally:
            fgt.disable(m)
        assert got == want, prompt
        assert mem["rows_kept"] == mem["rows_full"] == m.config.num_hidden_layers * m.config.num_key_value_heads * (
            len(ids) + len(got[0]) - 1)  # the last token is never fed
    assert m.config._attn_implementation == "sdpa"  # disable() gave transformers' attention back


def test_batch_and_next_turn_are_transformers(hf, model):
    """Two equal-length rows decoded as one batch; a next turn of several tokens appended onto a cache."""
    m, tok = hf
    a, b = model.tokenize(SHORT[1]), model.tokenize("Once upon a time, in a big city far away,")
    n = min(len(a), len(b))
    batch = [a[:n], b[:n]]
    want = greedy(m, batch)
    first, turn = torch.tensor([a]), torch.tensor([model.tokenize(" The end.\n\nAnother story:", bos=False)])
    ref = DynamicCache(config=m.config)
    with torch.no_grad():
        m(input_ids=first, past_key_values=ref)
        turn_ref = m(input_ids=turn, past_key_values=ref).logits
    engine = fgt.enable(m, tok, "full", kv_dtype="f32")
    try:
        assert greedy(m, batch) == want
        cache = engine.new_cache()
        with torch.no_grad():
            m(input_ids=first, past_key_values=cache)
            turn_got = m(input_ids=turn, past_key_values=cache).logits
        assert torch.allclose(turn_got, turn_ref, atol=2e-4), (turn_got - turn_ref).abs().max()
        assert cache.get_seq_length() == first.shape[1] + turn.shape[1]
    finally:
        fgt.disable(m)


def test_adaptive_is_the_engine_of_fastgen_eval(hf, model_path, long_prompts):
    """fastgen-adaptive at 0.5 in transformers: at most 55 % of the full cache's KV bytes, and its mean KL
    against the full cache (teacher-forced on the full cache's greedy tokens, as fastgen eval scores) within
    10 % of `fastgen eval --f32-activations` on the same prompts: the same engine under two runners."""
    m, tok = hf
    with fastgen.Model(model_path, f32_activations=True) as fm:
        rows = fm.eval(long_prompts, methods=["fastgen-adaptive"], budgets=[0.5], steps=STEPS)
        ids_all = [fm.tokenize(p) for p in long_prompts]
    cli_kl = rows[0]["kl_mean"]

    def run(method, ids, ref=None, **kw):
        engine = fgt.enable(m, tok, method, **kw)
        cache = engine.new_cache()
        logp, toks = [], []
        try:
            with torch.no_grad():
                out = m(input_ids=torch.tensor([ids]), past_key_values=cache)
                for t in range(STEPS):
                    lg = out.logits[0, -1].double()
                    logp.append(torch.log_softmax(lg, -1))
                    toks.append(int(lg.argmax()) if ref is None else ref[t])
                    if t + 1 < STEPS:
                        out = m(input_ids=torch.tensor([[toks[-1]]]), past_key_values=cache)
            return toks, logp, cache.memory()
        finally:
            cache.close()
            fgt.disable(m)

    kls = []
    for ids in ids_all:
        ref, full, _ = run("full", ids)
        _, comp, mem = run("fastgen-adaptive", ids, ref, budget=0.5)
        assert mem["kv_bytes_held"] <= 0.55 * mem["kv_bytes_full"], mem
        kls.append(sum(float((a.exp() * (a - b)).sum()) for a, b in zip(full, comp)) / STEPS)
    kl = sum(kls) / len(kls)
    print(f"mean KL: transformers + fastgen {kl:.6f}, fastgen eval --f32-activations {cli_kl:.6f}")
    assert cli_kl > 0 and abs(kl - cli_kl) <= 0.10 * cli_kl


def test_predicted_rows_turn_as_the_model(hf, model):
    """observe="predicted" reads the model's RoPE: the description enable() gives the library turns lanes j and
    j + d/2 as transformers' rotary embedding does at every position; a generate() under it keeps its budget."""
    m, tok = hf
    d = m.config.hidden_size // m.config.num_attention_heads
    rope = fgt.model_rope(m, d)
    assert rope["rope_style"] == "halves" and rope["rope_dims"] == d and rope["rope_freq_factors"] is None
    theta = getattr(m.config, "rope_theta", None) or m.config.rope_parameters["rope_theta"]  # transformers 5: the latter
    assert rope["rope_theta"] == theta
    pos = torch.tensor([[0, 7, 1000, 8191]])
    cos, sin = m.model.rotary_emb(torch.zeros(1, 1, d), pos)
    pairs = torch.arange(d // 2, dtype=torch.float64)
    angle = pos[0, :, None].double() * rope["rope_theta"] ** (-pairs / (d // 2))
    for half in (0, 1):
        torch.testing.assert_close(cos[0, :, half * d // 2:(half + 1) * d // 2].double(), angle.cos(), atol=2e-3, rtol=0)
        torch.testing.assert_close(sin[0, :, half * d // 2:(half + 1) * d // 2].double(), angle.sin(), atol=2e-3, rtol=0)
    engine = fgt.enable(m, tok, "fastgen-adaptive", budget=0.25, observe="predicted")
    try:
        greedy(m, model.tokenize(SHORT[1] * 12))
        mem = engine.memory()
        assert mem["rows_kept"] < 0.35 * mem["rows_full"]  # a quarter at the prompt, the decoded rows kept after
    finally:
        fgt.disable(m)


def test_heads_and_memory_after_generate(hf, model):
    m, tok = hf
    engine = fgt.enable(m, tok, "fastgen", threshold=0.9)
    try:
        greedy(m, model.tokenize(SHORT[1] * 6))
        heads = engine.heads()
        shape = (m.config.num_hidden_layers, m.config.num_key_value_heads)
        assert heads["policy_index"].shape == shape and heads["recovery"].shape[:2] == shape
        mem = engine.memory()
        assert heads["kept"].sum() == mem["rows_kept"] < mem["rows_full"]
    finally:
        fgt.disable(m)


def test_a_loop_with_its_own_cache(hf, model):
    """The common hand-written loop: one transformers cache object passed forward after forward. fastgen
    stands one FastGenCache in for it, so the loop continues its sequence (transformers' greedy ids)."""
    m, tok = hf
    ids = model.tokenize(SHORT[1])
    want = greedy(m, ids)[0]

    def loop():
        cache, got, x = DynamicCache(config=m.config), [], torch.tensor([ids])
        with torch.no_grad():
            for _ in range(STEPS):
                nxt = int(m(input_ids=x, past_key_values=cache).logits[0, -1].argmax())
                got.append(nxt)
                x = torch.tensor([[nxt]])
        return got

    engine = fgt.enable(m, tok, "full", kv_dtype="f32")
    try:
        assert loop()[:len(want)] == want
        mem = engine.memory()
        assert mem["rows_kept"] == m.config.num_hidden_layers * m.config.num_key_value_heads * (len(ids) + STEPS - 1)
        assert mem["pool_bytes"] == engine.context.memory()["pool_bytes"]  # the pool counted once
    finally:
        fgt.disable(m)


def test_errors_say_what_is_wrong(hf, model):
    m, tok = hf
    with pytest.raises(ValueError, match="not enabled"):
        fgt.disable(m)
    with pytest.raises(ValueError, match="unknown field 'budgett'"):
        fgt.enable(m, tok, "fastgen-adaptive", budgett=0.5)
    assert m.config._attn_implementation == "sdpa"  # a refused enable() leaves the model as it was
    with pytest.raises(ValueError, match="model type 'gpt2' is not supported"):
        fgt.enable(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)))
    with pytest.raises(TypeError, match="PreTrainedModel"):
        fgt.enable(torch.nn.Linear(2, 2))
    engine = fgt.enable(m, tok, "fastgen-adaptive", budget=0.5)
    try:
        with pytest.raises(ValueError, match="already enabled"):
            fgt.enable(m, tok)
        with pytest.raises(ValueError, match="no forward has run"):
            engine.memory()
        ids = torch.tensor([model.tokenize(SHORT[1])] * 2)
        mask = torch.ones_like(ids)
        mask[1, 0] = 0
        with pytest.raises(ValueError, match="padded batch"):
            m.generate(ids, attention_mask=mask, max_new_tokens=2)
        with pytest.raises(ValueError, match="input_ids"):
            m(inputs_embeds=m.get_input_embeddings()(ids[:1]))
        fgt.disable(m)
        full = DynamicCache(config=m.config)
        m(input_ids=ids[:1], past_key_values=full)  # transformers' own cache, with rows
        engine = fgt.enable(m, tok)
        with pytest.raises(ValueError, match="DynamicCache that holds rows"):
            m(input_ids=ids[:1, -1:], past_key_values=full)
        with pytest.raises(NotImplementedError, match="beam search"):
            m.generate(ids[:1], attention_mask=mask[:1], max_new_tokens=2, num_beams=2, do_sample=False)
        fgt.disable(m)
        with pytest.raises(ValueError, match="observe='explicit'"):
            fgt.enable(m, tok, "fastgen-adaptive", observe="explicit")
        engine = fgt.enable(m, tok)
        stale = engine.new_cache()
        m(input_ids=ids[:1], past_key_values=stale)
        m.set_attn_implementation("sdpa")  # attention that is not fastgen's would see no past: refused
        with pytest.raises(RuntimeError, match="not taken by fastgen's attention"):
            m(input_ids=ids[:1, -1:], past_key_values=stale)
        m.set_attn_implementation("fastgen")
        fgt.disable(m)
        engine = fgt.enable(m, tok)
        with pytest.raises(ValueError, match="engine was disabled"):
            m(input_ids=ids[:1, -1:], past_key_values=stale)
        with pytest.raises(ValueError, match="holds 1 batch rows, the forward has 2"):
            c = engine.new_cache()
            m(input_ids=ids[:1], past_key_values=c)
            m(input_ids=ids[:, -1:], past_key_values=c)
        m.train()
        with pytest.raises(ValueError, match="for inference"):
            m(input_ids=ids[:1])
        m.eval()
        # a failed call left the engine usable
        assert len(greedy(m, model.tokenize(SHORT[0]))[0]) > 0
    finally:
        fgt.disable(m)


@pytest.mark.parametrize("dtype,act", [(torch.bfloat16, "bf16"), (torch.float16, "f16")])
def test_half_tensors_cross_the_binding(dtype, act):
    """fastgen.Context(act_dtype=...) takes torch half tensors through DLPack and returns them: the fp32 context's
    outputs on the same values, rounded to the tensors' dtype."""
    L, HQ, HKV, D, n = 1, 4, 2, 16, 12
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n + 1, h, D, generator=g).to(dtype) for h in (HQ, HKV, HKV))
    outs = {}
    for a in ("f32", act):
        with fastgen.Context(L, HQ, HKV, D, vocab_size=50, max_seqs=1, max_seq_len=32, act_dtype=a) as ctx:
            conv = (lambda x: x) if a == act else (lambda x: x.float())
            seq = ctx.create(list(range(n)))
            outs[a] = [ctx.prefill(seq, 0, *(conv(x[:n]) for x in (q, k, v))),
                       ctx.decode(0, [seq], [n], *(conv(x[n:]) for x in (q, k, v)))]
    for want, got in zip(outs["f32"], outs[act]):
        assert got.dtype == dtype
        assert torch.equal(want.to(dtype), got)
    with fastgen.Context(L, HQ, HKV, D, vocab_size=50, max_seqs=1, max_seq_len=32, act_dtype=act) as ctx:
        seq = ctx.create(list(range(n)))
        with pytest.raises(TypeError, match=f"q must be {str(dtype).split('.')[1]}"):
            ctx.prefill(seq, 0, q[:n].float(), k[:n], v[:n])


def test_a_bf16_model_hands_the_engine_bf16(hf):
    """A bfloat16 model's q, k, v reach the engine as bfloat16 (act_dtype "bf16": no fp32 copies on the way), and
    its prompt logits pick what transformers' own attention picks."""
    model, tok = copy.deepcopy(hf[0]).to(torch.bfloat16), hf[1]  # from_gguf(dtype=torch.bfloat16) takes 25 s more
    xs = [torch.tensor([tok(p)["input_ids"]]) for p in SHORT]
    with torch.no_grad():
        want = [model(x).logits[0].argmax(-1) for x in xs]
        engine = fgt.enable(model, tok, method="full")
        try:
            assert engine.act_dtype == "bf16" and engine.act_torch == torch.bfloat16
            got = [model(x).logits[0].argmax(-1) for x in xs]
        finally:
            fgt.disable(model)
    agree = torch.cat([(a == b).float() for a, b in zip(want, got)]).mean().item()
    assert agree >= 0.9, f"top-1 agreement {agree:.3f}"
