"""fastgen.Model on SmolLM2-135M-Instruct: the same engine as the CLI, figure for figure."""

import json
import subprocess

import numpy as np
import pytest

import fastgen

CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
STORY = ("Once upon a time, in a village by the sea, there lived an old fisherman named Tom. Every morning he "
         "took his boat out before the sun rose, and every evening he came back with a basket of fish. ") * 3


def cli_generate(model_path, prompt, policy, n, *extra):
    run = subprocess.run([fastgen._cli_path(), "generate", "-m", model_path, "-p", prompt, "--policy", policy,
                          "-n", str(n), "--json", "-q", *extra], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


@pytest.mark.parametrize("method", ["full", "fastgen", "fastgen-adaptive"])
def test_generate_equals_cli(model, model_path, method):
    g = model.generate(CHAT, method=method, max_tokens=16)
    cli = cli_generate(model_path, CHAT, method, 16)
    assert g.prompt_ids + g.ids == cli["tokens"]
    assert g.memory["kv_bytes_held"] == cli["kv_bytes_held"] and g.memory["kv_bytes_full"] == cli["kv_bytes_full"]
    assert "Paris" in g.text
    assert g.tokens_per_s > 0 and g.prefill_s > 0


def test_generate_reconstructs_as_the_cli(model, model_path):
    """observe="explicit": the runner's reconstruction pass, as generate --observe reconstruct, id for id."""
    prompt = "<|im_start|>user\n" + STORY + "Who is the story about?<|im_end|>\n<|im_start|>assistant\n"
    g = model.generate(prompt, method="fastgen-adaptive", budget=0.25, max_tokens=12, observe="explicit")
    cli = cli_generate(model_path, prompt, "fastgen-adaptive", 12, "--budget", "0.25", "--observe", "reconstruct")
    assert g.prompt_ids + g.ids == cli["tokens"] and g.memory["rows_kept"] == cli["rows_kept"]
    assert g.reconstruct_s > 0 and g.memory["rows_kept"] <= 0.26 * g.memory["rows_full"]
    with pytest.raises(ValueError, match="reconstruction"):
        model.profile(prompt, "fastgen-adaptive", observe="explicit")


def test_generate_predicts_as_the_cli(model, model_path):
    """observe="predicted": the runner describes its RoPE to the library, as generate --observe predicted."""
    prompt = "<|im_start|>user\n" + STORY + "Who is the story about?<|im_end|>\n<|im_start|>assistant\n"
    g = model.generate(prompt, method="fastgen-adaptive", budget=0.25, max_tokens=12, observe="predicted")
    cli = cli_generate(model_path, prompt, "fastgen-adaptive", 12, "--budget", "0.25", "--observe", "predicted")
    assert g.prompt_ids + g.ids == cli["tokens"] and g.memory["rows_kept"] == cli["rows_kept"]
    assert g.memory["rows_kept"] <= 0.26 * g.memory["rows_full"]


def test_scorer_is_the_default_observation(model, model_path, tmp_path):
    """A scorer (fastgen calibrate, here a small one) makes fastgen-adaptive rank by it unless observe is
    given, in Model as in the CLI, id for id; scorer=False keeps the prompt's tail."""
    text = tmp_path / "calibration.txt"
    text.write_text(open("/usr/share/common-licenses/GPL-3").read())
    scorer = tmp_path / "smollm2.fgscore"
    subprocess.run([fastgen._cli_path(), "calibrate", "-m", model_path, "--text", str(text), "--chunk", "256",
                    "--max-tokens", "1024", "-o", str(scorer), "-q"], capture_output=True, text=True, check=True)
    prompt = "<|im_start|>user\n" + STORY + "Who is the story about?<|im_end|>\n<|im_start|>assistant\n"
    with fastgen.Model(model_path, scorer=scorer) as m:
        assert m.scorer == str(scorer)
        g = m.generate(prompt, method="fastgen-adaptive", budget=0.25, max_tokens=12)
        tail = m.generate(prompt, method="fastgen-adaptive", budget=0.25, max_tokens=12, observe="tail")
    assert g.observe == "scores" and tail.observe == "tail"
    cli = cli_generate(model_path, prompt, "fastgen-adaptive", 12, "--budget", "0.25", "--scorer", str(scorer))
    assert g.prompt_ids + g.ids == cli["tokens"] and g.memory["rows_kept"] == cli["rows_kept"]
    assert g.memory["rows_kept"] <= 0.26 * g.memory["rows_full"]
    with fastgen.Model(model_path, scorer=False) as m:
        assert m.scorer is None
        assert m.generate(prompt, method="fastgen-adaptive", max_tokens=4).observe == "tail"
        with pytest.raises(ValueError, match="calibrated scorer"):
            m.generate(prompt, method="fastgen-adaptive", max_tokens=4, observe="scores")
    with pytest.raises(RuntimeError, match="FGSCORE1"):
        fastgen.Model(model_path, scorer=text)


def test_options_reach_the_runner(model_path):
    """f32 activations and q8_0 caches: the CLI's runs with the same options, id for id."""
    with fastgen.Model(model_path, f32_activations=True, kv_dtype="q8_0", threads=2) as m:
        g = m.generate(CHAT, method="fastgen-adaptive", max_tokens=12)
    cli = cli_generate(model_path, CHAT, "fastgen-adaptive", 12, "--f32-activations", "--dtype", "q8_0", "-t", "2")
    assert g.prompt_ids + g.ids == cli["tokens"] and g.memory["kv_bytes_held"] == cli["kv_bytes_held"]


def test_generate_compresses_and_samples(model):
    g = model.generate(STORY, method="fastgen-adaptive", budget=0.25, max_tokens=8, ignore_eos=True)
    assert len(g.ids) == 8 and g.kv_share < 0.4
    a = model.generate(STORY, max_tokens=12, temperature=0.8, seed=3)
    b = model.generate(STORY, max_tokens=12, temperature=0.8, seed=3)
    assert a.ids == b.ids  # a seed reproduces its sample


def test_profile(model):
    p = model.profile(STORY)
    cfg = model.config
    assert p.policy_index.shape == (cfg["n_layers"], cfg["n_kv_heads"])
    assert p.recovery.shape == (cfg["n_layers"], cfg["n_kv_heads"], len(p.shortlist))
    assert np.all(p.recovery[..., -1] > 0.999)  # the full cache recovers everything
    chosen = np.take_along_axis(p.recovery, p.policy_index[..., None], axis=2)[..., 0]
    # the paper's rule: the first entry that reaches T = 0.95, else the last
    assert np.all((chosen >= 0.95 - 1e-6) | (p.policy_index == len(p.shortlist) - 1))
    assert p.kept.sum() == p.memory["rows_kept"] < p.memory["rows_full"]
    assert p.components[0][0] == p.shortlist[p.policy_index[0, 0]]


def test_eval_rows_are_the_cli_sweep(model):
    rows = model.eval([STORY[:200], "The weather in Paris today is"], budgets=[0.5], steps=8)
    methods = [r["method"] for r in rows]
    assert methods[0] == "fastgen-adaptive" and {"h2o", "snapkv", "tova"} <= set(methods)
    for r in rows:
        assert r["budget"] == 0.5 and r["prompts"] == 2 and r["kl_mean"] >= 0 and 0 <= r["top1"] <= 1
        assert r["kv_kept_min"] <= r["kv_kept"] <= r["kv_kept_max"]


def test_passkey(model):
    filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
    prompt = (filler * 4 + "The pass key is 71432. Remember it. 71432 is the pass key. " + filler * 4 +
              "What is the pass key? The pass key is")
    rows = model.passkey([("71432", prompt)], methods=["fastgen-adaptive", "streamingllm"], budgets=[0.5])
    assert [r["method"] for r in rows] == ["fastgen-adaptive", "streamingllm"]
    assert all(0 <= r["accuracy"] <= 1 for r in rows)


def test_passkey_questions_of_one_document(model):
    """A document compressed once and forked for each question: a space is in an answer of a few words,
    "QQQ" in none, so a run answers half of the questions (or none, if it stops at once)."""
    doc = "Lily had a red ball. Tom had a blue car. " * 8
    rows = model.passkey([(doc, [(" ", " The girl was called"), ("QQQ", " The boy was called")])],
                         methods=["fastgen-adaptive", "h2o"], budgets=[0.5], steps=6)
    shares = [r["accuracy"] for r in rows]
    assert set(shares) <= {0.0, 0.5} and max(shares) == 0.5, shares
    for bad in [("k", "a\tb"), (doc, []), (doc, [("k",)]), ("k",), ("#1", "prompt"), (doc, 5),
                [("1", "prompt"), (doc, [("1", "turn")])]]:
        bad = bad if isinstance(bad, list) else [bad]
        with pytest.raises(ValueError, match="passkey"):
            model.passkey(bad)


def test_detokenize_continues(model):
    ids = model.tokenize("Hello world, and hello again.")
    assert model.detokenize(ids[:3]) + model.detokenize(ids[3:], after=ids[2]) == model.detokenize(ids)


def test_model_errors(model):
    with pytest.raises(RuntimeError, match="no-such-model.gguf"):
        fastgen.Model("/nonexistent/no-such-model.gguf")
    with pytest.raises(ValueError, match="unknown field 'budgett'"):
        model.generate("hi", budgett=0.5)
    with pytest.raises(ValueError, match="not a token id"):
        model.detokenize([10 ** 6])
    m = fastgen.Model(model.path, threads=1)
    m.close()
    with pytest.raises(ValueError, match="the model is closed"):
        m.generate("hi")


@pytest.mark.parametrize("kw", [dict(temperature=float("nan")), dict(temperature=-1.0), dict(top_p=0.0),
                                dict(top_p=float("nan")), dict(top_p=5.0), dict(top_k=-1), dict(max_tokens=-1),
                                dict(seed=2 ** 64 + 1), dict(seed=-1)])
def test_generate_refuses_what_the_cli_refuses(model, kw):
    """The CLI refuses each of these values; the package does too, naming the option, not running greedy or
    wrapping a seed."""
    args = dict(max_tokens=2)
    args.update(kw)
    (name,) = kw
    with pytest.raises(ValueError, match=f"bad value for {name}"):
        model.generate("hi", **args)


@pytest.mark.parametrize("kw", [dict(ctx_size=-100), dict(max_seqs=0), dict(max_seqs=-3), dict(prefill_chunk=-5),
                                dict(threads=-1)])
def test_model_refuses_what_the_cli_refuses(model_path, kw):
    (name,) = kw
    with pytest.raises(ValueError, match=f"bad value for {name}"):
        fastgen.Model(model_path, **kw)


def test_generate_busy_while_reading_its_arguments(model):
    """A second generate() while the first reads its ids (an __index__ that releases the GIL) is refused; the
    first gives the serial run's ids, and the model serves alone after it (every sequence given back)."""
    import threading
    import time

    ids = model.tokenize(STORY)[:40]
    want = model.generate(ids, max_tokens=8).ids
    reading = threading.Event()

    class SlowId:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            reading.set()
            time.sleep(0.002)  # the GIL goes to the other thread
            return self.v

    got, errors = {}, []

    def first():
        got["ids"] = model.generate([SlowId(i) for i in ids], max_tokens=8).ids

    t = threading.Thread(target=first)
    t.start()
    reading.wait()
    try:
        model.generate(ids, max_tokens=8)
    except RuntimeError as exc:
        errors.append(str(exc))
    t.join()
    assert errors and "another thread" in errors[0]
    assert got["ids"] == want
    for _ in range(5):  # more calls than max_seqs: none left behind
        assert model.generate(ids, max_tokens=8).ids == want
