"""The binding of the library (fastgen.Context and friends) against a NumPy reference and the C library's rules."""

import ctypes
import threading

import numpy as np
import pytest

import fastgen

L, HQ, HKV, D = 2, 4, 2, 16


def attention(q, k, v):
    """Causal attention of the last len(q) rows over k, v (GQA: query head h reads KV head h // (HQ / HKV))."""
    n, t = q.shape[0], k.shape[0]
    g = q.shape[1] // k.shape[1]
    out = np.empty(q.shape, dtype=np.float64)
    for i in range(n):
        pos = t - n + i
        for h in range(q.shape[1]):
            s = k[: pos + 1, h // g].astype(np.float64) @ q[i, h].astype(np.float64) / np.sqrt(q.shape[2])
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v[: pos + 1, h // g]
    return out


def rows(rng, n, heads):
    return rng.standard_normal((n, heads, D), dtype=np.float32)


@pytest.fixture(params=["ref", "cpu"])
def backend(request):
    return request.param


def test_build():
    assert fastgen.__version__.count(".") == 2
    assert {"ref", "cpu"} <= set(fastgen.backends())
    assert fastgen.presets()[:3] == ["fastgen", "fastgen-budget", "fastgen-adaptive"]
    assert fastgen.kv_row_bytes("f16", 64) == 128
    assert fastgen.kv_row_bytes("q8_0", 64) == 68


def test_compression_presets_and_overrides():
    c = fastgen.compression("fastgen-adaptive", budget=0.25, window=48, defer=40)
    assert (c.allocation, c.budget, c.observation_window, c.defer_until) == ("adaptive", 0.25, 48, 40)
    assert c.shortlist[-1].components == "full"
    assert fastgen.compression("h2o").shortlist[0].components == "frequent+local"
    assert fastgen.Policy("local", ratio_local=0.3).rows(100) == (30, 0)
    with pytest.raises(ValueError, match="unknown field 'bugdet'"):
        fastgen.compression("fastgen", bugdet=0.5)
    with pytest.raises(ValueError, match="budget"):
        fastgen.compression("fastgen-adaptive", budget=1.5)
    with pytest.raises(ValueError, match="allocation: expected one of shortlist, adakv, adaptive"):
        fastgen.compression("fastgen", allocation="greedy")
    with pytest.raises(ValueError, match="no-such-preset"):
        fastgen.compression("no-such-preset")


def test_full_cache_is_attention(backend):
    """Prefill and decode with the full cache: exact causal attention (f32 cache), 2-D and 3-D shapes."""
    rng = np.random.default_rng(1)
    n = 37
    with fastgen.Context(L, HQ, HKV, D, vocab_size=100, backend=backend, kv_dtype="f32", max_seqs=2,
                         max_seq_len=64, method="full") as ctx:
        seq = ctx.create(np.arange(n, dtype=np.int32) % 100)
        ks, vs = [], []
        for layer in range(L):
            q, k, v = rows(rng, n, HQ), rows(rng, n, HKV), rows(rng, n, HKV)
            out = ctx.prefill(seq, layer, q, k, v)
            assert out.shape == (n, HQ, D) and out.dtype == np.float32
            np.testing.assert_allclose(out, attention(q, k, v), atol=2e-5)
            ks.append(k)
            vs.append(v)
        for step in range(3):
            for layer in range(L):
                q, k, v = rows(rng, 1, HQ), rows(rng, 1, HKV), rows(rng, 1, HKV)
                ks[layer] = np.concatenate([ks[layer], k])
                vs[layer] = np.concatenate([vs[layer], v])
                out = np.full((1, HQ * D), np.nan, dtype=np.float32)  # flattened: [n, heads * dim]
                got = ctx.decode(layer, [seq], [5], q.reshape(1, -1), k, v, out=out)
                assert got is out
                np.testing.assert_allclose(out.reshape(1, HQ, D), attention(q, ks[layer], vs[layer]), atol=2e-5)
        assert ctx.length(seq, 0) == n + 3
        mem = ctx.memory(seq)
        assert mem["rows_kept"] == mem["rows_full"] == L * HKV * (n + 3)


def test_adaptive_compresses_and_reports():
    rng = np.random.default_rng(2)
    n = 200
    with fastgen.Context(L, HQ, HKV, D, vocab_size=100, max_seqs=2, max_seq_len=256) as ctx:
        seq = ctx.create(rng.integers(0, 100, n), "fastgen-adaptive", budget=0.25)
        for layer in range(L):
            ctx.prefill(seq, layer, rows(rng, n, HQ), rows(rng, n, HKV), rows(rng, n, HKV))
        mem = ctx.memory(seq)
        assert mem["rows_kept"] <= 0.3 * mem["rows_full"]
        heads = ctx.heads(seq)
        assert heads["kept"].shape == (L, HKV) and heads["recovery"].shape == (L, HKV, 3)
        assert heads["kept"].sum() == mem["rows_kept"]
        info = ctx.inspect(seq, 1, 1)
        pos = ctx.positions(seq, 1, 1)
        assert pos.dtype == np.int32 and len(pos) == info["kept"] and np.all(np.diff(pos) > 0)
        assert info["components"] in heads["components"][1]


def test_observe_then_compress(backend):
    """observe="explicit": rows fed after the prompt (a reconstruction pass) are not kept, get their causal
    attention, and decide what compress() keeps; a sequence told so never compresses on its own."""
    rng = np.random.default_rng(4)
    n, m = 60, 24
    with fastgen.Context(L, HQ, HKV, D, backend=backend, vocab_size=100, kv_dtype="f32", max_seqs=2,
                         max_seq_len=96) as ctx:
        seq = ctx.create(rng.integers(0, 100, n), "fastgen-adaptive", budget=0.25, observe="explicit", window=8)
        keys, vals = [], []
        for layer in range(L):
            keys.append(rows(rng, n, HKV))
            vals.append(rows(rng, n, HKV))
            ctx.prefill(seq, layer, rows(rng, n, HQ), keys[-1], vals[-1])
        assert ctx.memory(seq)["rows_kept"] == ctx.memory(seq)["rows_full"]
        plant = 20  # every given row of layer 0 looks at key 20 of its head
        q = np.repeat(keys[0][plant][:, None, :], HQ // HKV, axis=1).reshape(1, HQ, D) * 3.0
        q = np.repeat(q, m, axis=0).astype(np.float32)
        k, v = rows(rng, m, HKV), rows(rng, m, HKV)
        out = ctx.observe(seq, 0, q, k, v)
        assert ctx.length(seq, 0) == n  # not kept
        np.testing.assert_allclose(out, attention(q, np.concatenate([keys[0], k]), np.concatenate([vals[0], v])),
                                   atol=1e-5)
        with pytest.raises(ValueError, match="same rows"):
            ctx.compress(seq)
        for layer in range(1, L):
            ctx.observe(seq, layer, rows(rng, m, HQ), rows(rng, m, HKV), rows(rng, m, HKV))
        ctx.compress(seq)
        assert ctx.memory(seq)["rows_kept"] <= 0.26 * ctx.memory(seq)["rows_full"]
        for g in range(HKV):
            assert plant in ctx.positions(seq, 0, g)
        with pytest.raises(ValueError, match="compressed already"):
            ctx.compress(seq)


def test_observe_scores_then_compress(backend):
    """observe="scores": the engine's key scores add up call by call, rank what compress() keeps (the key
    scored highest stays in every head that ranks keys), and bad scores are refused with nothing changed."""
    rng = np.random.default_rng(6)
    n = 60
    with fastgen.Context(L, HQ, HKV, D, backend=backend, vocab_size=100, kv_dtype="f32", max_seqs=2,
                         max_seq_len=96) as ctx:
        seq = ctx.create(rng.integers(0, 100, n), "fastgen-adaptive", budget=0.25, observe="scores", window=8)
        for layer in range(L):
            ctx.prefill(seq, layer, rows(rng, n, HQ), rows(rng, n, HKV), rows(rng, n, HKV))
        assert ctx.memory(seq)["rows_kept"] == ctx.memory(seq)["rows_full"]
        scores = rng.random((HKV, n), dtype=np.float32)
        scores[:, 20] = 100.0
        bad = scores.copy()
        bad[1, 3] = np.nan
        with pytest.raises(ValueError, match="head 1, key 3"):
            ctx.observe_scores(seq, 0, bad)
        with pytest.raises(ValueError, match="keys layer 0 holds"):
            ctx.observe_scores(seq, 0, scores[:, :-1].copy())
        with pytest.raises(ValueError, match="shape"):
            ctx.observe_scores(seq, 0, scores[0].copy())
        assert not ctx.observed_ranks(seq, 0, n).any()
        for layer in range(L):
            ctx.observe_scores(seq, layer, scores * 0.5)
            ctx.observe_scores(seq, layer, scores * 0.5)
        np.testing.assert_array_equal(ctx.observed_ranks(seq, 1, n), scores)
        ctx.compress(seq)
        assert ctx.memory(seq)["rows_kept"] <= 0.26 * ctx.memory(seq)["rows_full"]
        ranking = [(layer, g) for layer in range(L) for g in range(HKV)
                   if "frequent" in ctx.inspect(seq, layer, g)["components"]]
        assert ranking and all(20 in ctx.positions(seq, layer, g) for layer, g in ranking)
        with pytest.raises(ValueError, match="compressed already"):
            ctx.observed_ranks(seq, 0, n)


def test_predicted_rows_need_rope(backend):
    """observe="predicted": the tail's rows advanced by the context's RoPE; refused where the context has none,
    bad RoPE fields refused, the budget held."""
    rng = np.random.default_rng(5)
    n = 40
    comp = fastgen.compression("fastgen-adaptive", budget=0.25, observe="predicted", horizon=64, window=8)
    assert comp.predict_horizon == 64
    with pytest.raises(ValueError, match="only FG_OBSERVE_PREDICTED"):
        fastgen.compression("fastgen-adaptive", horizon=64)
    with fastgen.Context(L, HQ, HKV, D, backend=backend, vocab_size=100, kv_dtype="f32", max_seq_len=64) as ctx:
        with pytest.raises(ValueError, match="rope_theta"):
            ctx.create(rng.integers(0, 100, n), comp)
    for bad, match in [(dict(rope_style="spiral"), "rope_style"), (dict(rope_freq_factors=[1.0]), "rope_freq_factors"),
                       (dict(rope_dims=D + 2), "rope_dims"), (dict(rope_theta=-1.0), "rope_theta")]:
        kw = dict(rope_theta=10000.0) | bad
        with pytest.raises(ValueError, match=match):
            fastgen.Context(L, HQ, HKV, D, vocab_size=100, **kw)
    with fastgen.Context(L, HQ, HKV, D, backend=backend, vocab_size=100, kv_dtype="f32", max_seq_len=64,
                         rope_theta=10000.0, rope_style="halves", rope_freq_factors=[1.0] * (D // 2)) as ctx:
        seq = ctx.create(rng.integers(0, 100, n), comp)
        for layer in range(L):
            ctx.prefill(seq, layer, rows(rng, n, HQ), rows(rng, n, HKV), rows(rng, n, HKV))
        mem = ctx.memory(seq)
        assert mem["rows_kept"] <= 0.26 * mem["rows_full"]


def test_batched_decode_fork_and_append():
    rng = np.random.default_rng(3)
    n = 20
    with fastgen.Context(L, HQ, HKV, D, vocab_size=100, kv_dtype="f32", max_seqs=4, max_seq_len=64,
                         method="h2o") as ctx:
        a = ctx.create(list(range(n)))
        for layer in range(L):
            ctx.prefill(a, layer, rows(rng, n, HQ), rows(rng, n, HKV), rows(rng, n, HKV))
        b, c, d = ctx.fork(a), ctx.fork(a), ctx.fork(a)
        assert ctx.memory()["kv_bytes_held"] == ctx.memory(a)["kv_bytes_held"]  # shared pages counted once
        q, k, v = rows(rng, 2, HQ), rows(rng, 2, HKV), rows(rng, 2, HKV)
        both = ctx.decode(0, np.array([b, c], dtype=np.int32), [1, 1], q, k, v)
        # the same rows decoded one by one on identical forks give the same outputs
        one = np.concatenate([ctx.decode(0, [d], [1], q[:1], k[:1], v[:1]),
                              ctx.decode(0, [a], [1], q[1:], k[1:], v[1:])])
        np.testing.assert_allclose(both, one, atol=1e-6)
        ctx.decode(1, [a, b, c, d], [1] * 4, rows(rng, 4, HQ), rows(rng, 4, HKV), rows(rng, 4, HKV))
        ctx.destroy(b)
        out = ctx.append(c, 0, [7, 8, 9], rows(rng, 3, HQ), rows(rng, 3, HKV), rows(rng, 3, HKV))
        assert out.shape == (3, HQ, D) and np.isfinite(out).all()


def test_prefill_chunk_equals_prefill():
    rng = np.random.default_rng(4)
    n = 24
    qkv = [(rows(rng, n, HQ), rows(rng, n, HKV), rows(rng, n, HKV)) for _ in range(L)]
    outs = []
    with fastgen.Context(L, HQ, HKV, D, vocab_size=100, backend="ref", max_seqs=2, max_seq_len=64) as ctx:
        whole, chunked = ctx.create(list(range(n))), ctx.create(list(range(n)))
        for layer, (q, k, v) in enumerate(qkv):
            outs.append(ctx.prefill(whole, layer, q, k, v))
            parts = [ctx.prefill_chunk(chunked, layer, b, q[b:b + 8], k[b:b + 8], v[b:b + 8]) for b in (0, 8, 16)]
            np.testing.assert_array_equal(np.concatenate(parts), outs[-1])
        assert ctx.heads(whole)["policy_index"].tolist() == ctx.heads(chunked)["policy_index"].tolist()


def test_float16_activations_are_the_float32_ones_rounded(backend):
    """act_dtype="f16": float16 q, k, v in, float16 out, equal to an fp32 context's outputs on the same values
    rounded to float16; the kept rows the same."""
    rng = np.random.default_rng(8)
    n, steps = 20, 6
    qkv = [tuple(rows(rng, n + steps, h).astype(np.float16) for h in (HQ, HKV, HKV)) for _ in range(L)]
    outs, kept = {}, {}
    for act in ("f32", "f16"):
        with fastgen.Context(L, HQ, HKV, D, vocab_size=100, backend=backend, max_seqs=1, max_seq_len=64,
                             method="h2o", act_dtype=act) as ctx:
            conv = (lambda a: a) if act == "f16" else (lambda a: a.astype(np.float32))
            seq = ctx.create(list(range(n)))
            got = [ctx.prefill(seq, layer, *(conv(a[:n]) for a in qkv[layer])) for layer in range(L)]
            for t in range(n, n + steps):
                got += [ctx.decode(layer, [seq], [t], *(conv(a[t:t + 1]) for a in qkv[layer])) for layer in range(L)]
            assert all(o.dtype == (np.float16 if act == "f16" else np.float32) for o in got)
            outs[act] = got
            kept[act] = [ctx.positions(seq, layer, h).tolist() for layer in range(L) for h in range(HKV)]
    for a, b in zip(outs["f32"], outs["f16"]):
        np.testing.assert_array_equal(a.astype(np.float16), b)
    assert kept["f32"] == kept["f16"]
    with fastgen.Context(L, HQ, HKV, D, vocab_size=100, max_seqs=1, max_seq_len=32, act_dtype="f16") as ctx:
        seq = ctx.create([1, 2, 3, 4])
        q, k, v = (rows(rng, 4, h) for h in (HQ, HKV, HKV))
        with pytest.raises(TypeError, match=r"q must be float16, got float32 \(convert it with .astype\(numpy.float16\)\)"):
            ctx.prefill(seq, 0, q, k, v)
    with pytest.raises(ValueError, match=r"act_dtype: expected f32, f16 or bf16, got 'q8_0'"):
        fastgen.Context(L, HQ, HKV, D, vocab_size=100, act_dtype="q8_0")


class DLPackOnly:
    """An array reachable through __dlpack__ only (as a torch tensor is)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()


def test_dlpack_path_matches_buffer_path():
    rng = np.random.default_rng(5)
    n = 12
    q, k, v = rows(rng, n, HQ), rows(rng, n, HKV), rows(rng, n, HKV)
    with fastgen.Context(L, HQ, HKV, D, vocab_size=100, backend="ref", max_seqs=2, max_seq_len=32,
                         method="full") as ctx:
        s1, s2 = ctx.create(list(range(n))), ctx.create(list(range(n)))
        ref = ctx.prefill(s1, 0, q, k, v)
        out = np.empty_like(ref)
        ctx.prefill(s2, 0, DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), out=DLPackOnly(out))
        np.testing.assert_array_equal(out, ref)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class FakeDeviceTensor:
    """A DLPack producer whose tensor says it lives on CUDA device 0 (nothing is read from it)."""

    def __init__(self, shape, code=2, bits=32):
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.managed = _DLManaged()
        self.managed.dl_tensor.device = _DLDevice(2, 0)
        self.managed.dl_tensor.ndim = len(shape)
        self.managed.dl_tensor.dtype = _DLDataType(code, bits, 1)
        self.managed.dl_tensor.shape = self.shape

    def __dlpack__(self, stream=None):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), b"dltensor", None)


def test_error_messages():
    rng = np.random.default_rng(6)
    ctx = fastgen.Context(L, HQ, HKV, D, vocab_size=100, max_seqs=1, max_seq_len=32)
    seq = ctx.create([1, 2, 3, 4])
    q, k, v = rows(rng, 4, HQ), rows(rng, 4, HKV), rows(rng, 4, HKV)
    with pytest.raises(ValueError, match=r"FG_ERR_BAD_STATE|before|prefill") as e:
        ctx.decode(0, [seq], [1], q[:1], k[:1], v[:1])
    assert e.value.status == "FG_ERR_BAD_STATE"
    with pytest.raises(TypeError, match=r"q must be float32, got float64"):
        ctx.prefill(seq, 0, q.astype(np.float64), k, v)
    with pytest.raises(ValueError, match=r"k: expected shape \(n_prompt, n_kv_heads, head_dim\) = \(4, 2, 16\), "
                                         r"or \(4, 32\) flattened, got \(4, 4, 16\)"):
        ctx.prefill(seq, 0, q, q, v)
    with pytest.raises(ValueError, match=r"v must be C-contiguous"):
        ctx.prefill(seq, 0, q, k, np.asfortranarray(v))
    with pytest.raises(ValueError, match=r"out must be writable"):
        ro = np.empty_like(q)
        ro.setflags(write=False)
        ctx.prefill(seq, 0, q, k, v, out=ro)
    with pytest.raises(TypeError, match=r"expected a float32 array \(NumPy, or a tensor with __dlpack__\), got list"):
        ctx.prefill(seq, 0, q.tolist(), k, v)
    with pytest.raises(ValueError, match=r"q is on a device \(DLPack device type 2\), but the context's activations "
                                         r"are in host memory"):
        ctx.prefill(seq, 0, FakeDeviceTensor((4, HQ, D)), k, v)
    with pytest.raises(ValueError, match=r"tokens: expected one per sequence \(1\), got 2"):
        ctx.decode(0, [seq], [1, 2], q[:1], k[:1], v[:1])
    with pytest.raises(ValueError, match=r"seq 5 is not a sequence of this context"):
        ctx.prefill(5, 0, q, k, v)
    with pytest.raises(ValueError, match=r"max_seqs|sequences are in use") as e:
        ctx.create([1])
    assert e.value.status == "FG_ERR_CAPACITY"
    ctx.prefill(seq, 0, q, k, v)  # the failed calls left the context usable
    ctx.close()
    ctx.close()  # a second close does nothing
    with pytest.raises(ValueError, match="the context is closed"):
        ctx.prefill(seq, 1, q, k, v)
    with pytest.raises(ValueError, match="compression= or method=, not both"):
        fastgen.Context(L, HQ, HKV, D, vocab_size=10, compression=fastgen.compression("h2o"), method="full")
    with pytest.raises(ValueError, match=r"overrides \(budget\) need a preset"):
        fastgen.Context(L, HQ, HKV, D, vocab_size=10).create([1, 2], budget=0.5)
    with pytest.raises(ValueError, match="classes=TokenClasses"):
        fastgen.Context(L, HQ, HKV, D)
    with pytest.raises(ValueError, match="n_kv_heads|divide"):
        fastgen.Context(L, 3, 2, D, vocab_size=10)


def test_token_classes():
    tc = fastgen.TokenClasses(5, [",", "hello", " .", None, "\u2581,"], encoding="text")
    assert tc.count("punct") == 2 and tc.get(0) == "punct" and tc.get(1) == "ordinary"
    sp = fastgen.TokenClasses(5, [",", "hello", " .", None, "\u2581,"], encoding="sentencepiece")
    assert sp.get(4) == "punct"
    tc.set(1, "special")
    assert tc.classify([1, 0, 3], n_sink=0) == ["special", "punct", "ordinary"]
    with pytest.raises(ValueError, match="expected vocab_size = 5 strings, got 2"):
        fastgen.TokenClasses(5, ["a", "b"])
    with pytest.raises(ValueError, match="cls: expected one of ordinary, special, punct"):
        tc.set(0, "stopword")


def test_threads_share_nothing_but_the_gil():
    """Decode on two contexts from two threads at once (the GIL is released inside the calls)."""
    results, errors = {}, []

    def work(i):
        try:
            with fastgen.Context(L, HQ, HKV, D, vocab_size=100, backend="ref", kv_dtype="f32", max_seqs=1,
                                 max_seq_len=512, method="full") as ctx:
                r = np.random.default_rng(100)
                s = ctx.create([i % 100 for i in range(300)])
                for layer in range(L):
                    ctx.prefill(s, layer, rows(r, 300, HQ), rows(r, 300, HKV), rows(r, 300, HKV))
                for _ in range(20):
                    for layer in range(L):
                        out = ctx.decode(layer, [s], [1], rows(r, 1, HQ), rows(r, 1, HKV), rows(r, 1, HKV))
                results[i] = out
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    np.testing.assert_array_equal(results[0], results[1])


def test_context_refuses_a_pool_cap_it_cannot_hold():
    """max_pool_bytes is checked, not wrapped: -1 would be no cap at all, 2**64 + 5 a cap of 5 bytes."""
    for bad in (-1, 2 ** 64 + 5, 2 ** 70):
        with pytest.raises(ValueError, match="max_pool_bytes"):
            fastgen.Context(L, HQ, HKV, D, vocab_size=10, max_pool_bytes=bad)


def test_closed_while_reading_arguments():
    """close() run by an argument's __index__ in the middle of a call: the call says the context is closed."""
    ctx = fastgen.Context(L, HQ, HKV, D, vocab_size=100, backend="ref", kv_dtype="f32", max_seqs=1,
                          max_seq_len=64, method="full")
    rng = np.random.default_rng(3)
    seq = ctx.create([1] * 8)

    class Closer:
        def __index__(self):
            ctx.close()
            return seq

    with pytest.raises(ValueError, match="the context is closed"):
        ctx.prefill(Closer(), 0, rows(rng, 8, HQ), rows(rng, 8, HKV), rows(rng, 8, HKV))
    with pytest.raises(ValueError, match="the context is closed"):
        ctx.prefill(seq, 0, rows(rng, 8, HQ), rows(rng, 8, HKV), rows(rng, 8, HKV))


def test_positions_while_another_thread_decodes():
    """positions() sizes its array and then fills it: rows added by a decode in between are read, not refused
    (a call that finds the other thread inside one is refused as the library says, and tried again)."""
    ctx = fastgen.Context(L, HQ, HKV, D, vocab_size=100, backend="cpu", kv_dtype="f32", max_seqs=1,
                          max_seq_len=4096, method="full")
    rng = np.random.default_rng(5)
    seq = ctx.create([1] * 16)
    for layer in range(L):
        ctx.prefill(seq, layer, rows(rng, 16, HQ), rows(rng, 16, HKV), rows(rng, 16, HKV))
    q, k, v = rows(rng, 1, HQ), rows(rng, 1, HKV), rows(rng, 1, HKV)
    done, errors = threading.Event(), []

    def again(call):
        while True:
            try:
                return call()
            except ValueError as exc:
                if "another thread is inside a call" not in str(exc):
                    raise

    def decode():
        try:
            for _ in range(4000):
                for layer in range(L):
                    again(lambda: ctx.decode(layer, [seq], [1], q, k, v))
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
        done.set()

    t = threading.Thread(target=decode)
    t.start()
    reads = 0
    while not done.is_set():
        pos = again(lambda: ctx.positions(seq, 0, 0))
        assert np.all(np.diff(pos) > 0) and pos[0] == 0
        reads += 1
    t.join()
    assert not errors and reads > 100
    ctx.close()
