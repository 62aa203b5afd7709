"""fastgen: FastGen adaptive KV-cache compression ("Model Tells You What to
Discard", ICLR 2024) for LLM inference, from Python.

Two levels, as in C (docs/python.md):

* the library, for an engine that runs its own model: a :class:`Context`
  holds paged KV caches; per layer an engine calls :meth:`Context.prefill`
  with a prompt's q, k, v (every KV head is profiled and keeps its own
  compressed cache), then :meth:`Context.decode` per generated token. Arrays
  are float32, C-contiguous NumPy arrays or torch tensors, used in place.
* the model runner, for a GGUF or llama2.c file: :class:`Model` generates,
  profiles and evaluates with any compression method.

Compression is chosen by preset name with keyword overrides
(``compression("fastgen-adaptive", budget=0.25)``), see :func:`presets`.

A failed call raises ValueError (invalid argument, state or capacity),
MemoryError, or RuntimeError, with the library's message; the exception's
``status`` attribute names the C status (``"FG_ERR_BAD_STATE"``).
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Iterable, Sequence

import numpy as np

from . import _fastgen
from ._fastgen import TokenClasses

__all__ = [
    "Compression", "Context", "Generation", "Model", "Policy", "Profile", "TokenClasses", "__version__",
    "backends", "build_backends", "compression", "find_model", "kv_row_bytes", "presets",
]

__version__: str = _fastgen.version()


# ---------------------------------------------------------------- arrays


def _new_array(like: Any, shape: tuple, dtype: str):
    """The extension's allocator: outputs like their input (a torch tensor on its device), else NumPy."""
    torch = sys.modules.get("torch")
    if torch is not None and like is not None and isinstance(like, torch.Tensor):
        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    return np.empty(shape, dtype=dtype)


_fastgen._set_allocator(_new_array)


# ---------------------------------------------------------------- the build


def build_backends() -> str:
    """The backends this build serves, as ``fastgen version`` prints them (``"ref, cpu"``)."""
    return _fastgen.build_backends()


def backends() -> list[str]:
    """The backends usable here: compiled in, and with a device where they need one."""
    return [name for name in ("ref", "cpu", "cuda", "hip") if _fastgen.backend_probe(name) is None]


def presets() -> list[str]:
    """The compression presets' names (the three FastGen modes first)."""
    return _fastgen.preset_names()


def kv_row_bytes(dtype: str, head_dim: int) -> int:
    """Bytes of one cached K (or V) row of ``head_dim`` values stored as dtype, scales included."""
    return _fastgen.kv_row_bytes(dtype, head_dim)


# ---------------------------------------------------------------- compression


@dataclasses.dataclass
class Policy:
    """One shortlist entry: a union of components and its ratios (docs/design.md 2.2).

    components: names joined by ``+``: special, punct, frequent, local, full, snapshot.
    The window is ``w(t) = max(1, ceil(ratio_local t))``, the frequent budget
    ``k(t) = ceil(ratio_frequent t)``, each capped by its token count when that is > 0.
    """

    components: str
    ratio_local: float = 0.0
    ratio_frequent: float = 0.0
    local_tokens: int = 0
    frequent_tokens: int = 0

    def rows(self, t: int) -> tuple[int, int]:
        """(window, frequent budget) at sequence length t, as the library computes them."""
        return _fastgen.policy_rows(dataclasses.asdict(self), t)


# The instruction a reconstruction pass reads before the prompt again (tools/session.c's)
_RECONSTRUCT = "\n\nRepeat the previous context exactly.\n\n"
_RECONSTRUCT_CHAT = "<|im_start|>user\nRepeat the previous context exactly.<|im_end|>\n<|im_start|>assistant\n"

# The CLI's short names for the fields (fastgen eval --methods fastgen-adaptive:window=64)
_ALIASES = {
    "window": "observation_window", "defer": "defer_until", "floor": "alloc_floor", "pool": "score_pool",
    "sink": "n_sink", "T": "threshold", "tol": "tolerance", "horizon": "predict_horizon",
}


@dataclasses.dataclass
class Compression:
    """How a sequence compresses its cache: fg_compression_params field for field.

    Start from a preset (:func:`compression`) rather than from the fields:
    ``compression("fastgen-adaptive", budget=0.25)``. ``fastgen.h`` documents
    every field; the enumerations are strings here (score_mode ``"sum"``,
    ``"mean"``, ``"last"``; allocation ``"shortlist"``, ``"adakv"``,
    ``"adaptive"``, ``"layer"``; append_mode ``"keep"``, ``"reprofile"``; observe
    ``"tail"``, ``"explicit"``, ``"predicted"``, ``"scores"``: the rows the adaptive mode
    judges by, its own, the ones :meth:`Context.observe` gives, compressed
    when :meth:`Context.compress` is called, or its own advanced by the
    context's RoPE over the next predict_horizon positions; or the key scores
    :meth:`Context.observe_scores` gives, with its own rows judging).
    """

    shortlist: list[Policy]
    threshold: float = 0.95
    n_sink: int = 0
    score_mode: str = "sum"
    observation_window: int = 0
    budget: float = 0.0
    budget_tokens: int = 0
    append_mode: str = "keep"
    score_pool: int = 0
    allocation: str = "shortlist"
    alloc_floor: float = 0.0
    adaptive_flags: int = 0
    defer_until: int = 0
    observe: str = "tail"
    tolerance: float = 0.0
    predict_horizon: int = 0
    method: str = dataclasses.field(default="", compare=False)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "Compression":
        """A preset (:func:`presets`) with fields overridden by keyword (CLI short names too: window, defer,
        floor, pool, sink)."""
        fields = _fastgen.preset(name)
        fields["shortlist"] = [Policy(**p) for p in fields["shortlist"]]
        return cls(**fields, method=name).replace(**overrides)

    def replace(self, **overrides: Any) -> "Compression":
        """A copy with fields overridden by keyword; checked as the library checks a sequence's."""
        known = {f.name for f in dataclasses.fields(self)}
        fields = {}
        for key, value in overrides.items():
            name = _ALIASES.get(key, key)
            if name not in known or name == "method":
                raise ValueError(f"compression: unknown field {key!r} (fields: {', '.join(sorted(known - {'method'}))};"
                                 f" short names: {', '.join(_ALIASES)})")
            if name == "shortlist":
                value = [p if isinstance(p, Policy) else Policy(**p) for p in value]
            fields[name] = value
        out = dataclasses.replace(self, **fields)
        _fastgen.validate(out._fields())
        return out

    def _fields(self) -> dict:
        d = dataclasses.asdict(self)
        del d["method"]
        return d


def compression(method: str | Compression = "fastgen", kept: float | None = None, **overrides: Any) -> Compression:
    """A compression by preset name (or an existing one) with keyword overrides.

    kept: the share of the rows to keep, whatever the method: the budget of a budget mode
    (fastgen-adaptive, fastgen-budget), or a one-entry preset's window and frequent (or snapshot)
    ratios, split evenly where it has both (as ``fastgen eval`` sets them at matched memory).

    >>> compression("fastgen-adaptive", budget=0.25, window=64).budget
    0.25
    >>> compression("h2o", kept=0.5).shortlist[0].ratio_local
    0.25
    """
    comp = method.replace(**overrides) if isinstance(method, Compression) else Compression.preset(method, **overrides)
    if kept is None:
        return comp
    if not 0 < kept <= 1:
        raise ValueError(f"compression: kept must be in (0, 1], got {kept}")
    if comp.budget > 0 or comp.allocation == "adaptive":
        return comp.replace(budget=kept)
    parts = comp.shortlist[0].components.split("+") if len(comp.shortlist) == 1 else []
    local, other = "local" in parts, "frequent" in parts or "snapshot" in parts
    if not parts or "full" in parts or not (local or other):
        name = comp.method or "this compression"
        raise ValueError(f"compression: {name} sets its own memory (a threshold, or the full cache), so it takes "
                         "no kept=; use a method with a budget (fastgen-adaptive) or one-entry ratios (h2o, snapkv...)")
    r = kept / 2 if local and other else kept
    entry = dataclasses.replace(comp.shortlist[0], ratio_local=r if local else 0.0, ratio_frequent=r if other else 0.0)
    return comp.replace(shortlist=[entry])


def _compression_fields(comp: Compression | dict | str | None, overrides: dict) -> dict | None:
    if comp is None and not overrides:
        return None
    if comp is None:
        raise ValueError(f"compression overrides ({', '.join(overrides)}) need a preset to start from: pass its "
                         "name or a Compression (e.g. \"fastgen-adaptive\")")
    if isinstance(comp, dict):
        comp = Compression(**{**comp, "shortlist": [Policy(**p) if isinstance(p, dict) else p
                                                     for p in comp["shortlist"]]})
    return compression(comp, **overrides)._fields()


# ---------------------------------------------------------------- the library


class Context(_fastgen._Context):
    """Paged KV caches with FastGen compression for one model shape (fg_context_create).

    Context(n_layers, n_q_heads, n_kv_heads, head_dim, *, classes=None,
            vocab_size=None, backend="cpu", kv_dtype="f16", v_dtype=None,
            max_seqs=..., max_seq_len=..., page_tokens=16, pool_chunk_pages=256,
            max_pool_bytes=0, threads=0, io="host", stream=None, act_dtype="f32",
            rope_theta=0.0, rope_dims=0, rope_style="adjacent", rope_freq_factors=None,
            compression=None, method=None, **overrides)

    classes: a :class:`TokenClasses` (which ids are special or punctuation),
    or vocab_size alone for classes where every id is ordinary. backend:
    "ref", "cpu", "cuda", "hip". kv_dtype: storage of cached K and V (f32,
    f16, bf16, q8_0, q4_0); v_dtype stores V apart. threads: 0 = the CPUs this
    process may run on. io: "host" (arrays in host memory) or "device" (CUDA
    tensors, on the context's stream: pass ``stream=torch.cuda.current_stream().cuda_stream``).
    act_dtype: the dtype of q, k, v and out ("f32"; "f16": NumPy float16 or
    torch.float16; "bf16": torch.bfloat16), converted to fp32 where they lie
    and back, once per call. rope_*: the model's RoPE (its base, the lanes
    rotated, "adjacent" or "halves" pairs: Hugging Face's rotate_half is
    "halves", and each pair's frequency divisor), which only
    observe="predicted" reads; rope_theta=0 leaves it undescribed.
    compression or method (+ overrides): what sequences created without one
    take (default: the paper's FastGen).

    Close it with :meth:`close` or a ``with`` block; a closed context's calls raise ValueError.
    """

    def __init__(self, n_layers: int, n_q_heads: int, n_kv_heads: int, head_dim: int, *,
                 classes: TokenClasses | None = None, vocab_size: int | None = None, backend: str | None = None,
                 kv_dtype: str = "f16", v_dtype: str | None = None, max_seqs: int | None = None,
                 max_seq_len: int | None = None, page_tokens: int | None = None,
                 pool_chunk_pages: int | None = None, max_pool_bytes: int = 0, threads: int = 0, io: str = "host",
                 stream: int | None = None, act_dtype: str = "f32", rope_theta: float = 0.0, rope_dims: int = 0,
                 rope_style: str = "adjacent", rope_freq_factors: Sequence[float] | None = None,
                 compression: Compression | None = None,
                 method: str | None = None, **overrides: Any) -> None:
        if classes is None:
            if vocab_size is None:
                raise ValueError("Context: pass classes=TokenClasses(...) or vocab_size=N (every id ordinary)")
            classes = TokenClasses(vocab_size)
        kw = {k: v for k, v in dict(max_seqs=max_seqs, max_seq_len=max_seq_len, page_tokens=page_tokens,
                                     pool_chunk_pages=pool_chunk_pages).items() if v is not None}
        super().__init__(n_layers, n_q_heads, n_kv_heads, head_dim, classes, backend=backend, kv_dtype=kv_dtype,
                         v_dtype=v_dtype, max_pool_bytes=max_pool_bytes, threads=threads, io=io, stream=stream,
                         act_dtype=act_dtype, rope_theta=rope_theta, rope_dims=rope_dims, rope_style=rope_style,
                         rope_freq_factors=rope_freq_factors, **kw)
        if compression is not None and method is not None:
            raise ValueError("Context: pass compression= or method=, not both")
        if classes is not None and vocab_size is not None and vocab_size != classes.vocab_size:
            raise ValueError(f"Context: vocab_size={vocab_size} but the classes cover {classes.vocab_size} ids")
        fields = _compression_fields(compression if method is None else method, overrides)
        if fields is not None:
            self._set_compression(fields)

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<fastgen.Context closed>"
        layers, hq, hkv, d = self.shape
        return f"<fastgen.Context {self.backend}: {layers} layers, {hq} q heads, {hkv} kv heads, head_dim {d}>"

    def set_compression(self, compression: Compression | str | None = None, **overrides: Any) -> None:
        """The compression a sequence created without one takes (fg_context_set_compression); None: the
        paper's FastGen (the library's default), overrides applied to it."""
        self._set_compression(_compression_fields(compression or "fastgen", overrides))

    def create(self, prompt: Sequence[int] | np.ndarray, compression: Compression | str | None = None,
               **overrides: Any) -> int:
        """Registers a sequence with its prompt's token ids (fg_seq_create); returns its id.

        compression: a :class:`Compression` or a preset name, with keyword overrides; None: the context's.
        """
        return self._create(prompt, _compression_fields(compression, overrides))

    def heads(self, seq: int) -> dict[str, Any]:
        """Every head of a sequence at once, as arrays over [layer, kv_head]: policy_index, kept, length,
        kv_bytes_held, recovery ([layer, kv_head, entry]) and components (names, nested lists)."""
        layers, _, hkv, _ = self.shape
        infos = [[self.inspect(seq, layer, h) for h in range(hkv)] for layer in range(layers)]
        out: dict[str, Any] = {}
        for key in ("policy_index", "kept", "length", "kv_bytes_held", "kv_bytes_full"):
            out[key] = np.array([[i[key] for i in row] for row in infos], dtype=np.int64)
        out["recovery"] = np.array([[i["recovery"] for i in row] for row in infos], dtype=np.float32)
        out["components"] = [[i["components"] for i in row] for row in infos]
        return out


# ---------------------------------------------------------------- the model runner


def find_model() -> str:
    """A model file to try things on: $FASTGEN_MODEL (a file), else SmolLM2-135M-Instruct where
    scripts/get-models.sh caches it ($FASTGEN_CACHE, $XDG_CACHE_HOME/fastgen or ~/.cache/fastgen)."""
    env = os.environ.get("FASTGEN_MODEL")
    if env and os.path.isfile(env):
        return env
    cache = os.environ.get("FASTGEN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastgen")
    path = os.path.join(cache, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.isfile(path):
        return path
    raise FileNotFoundError(f"no model: set FASTGEN_MODEL to a GGUF file, or fetch SmolLM2 into {cache} with "
                            "scripts/get-models.sh from fastgen's repository")


@dataclasses.dataclass
class Generation:
    """What :meth:`Model.generate` returns."""

    text: str
    ids: list[int]
    prompt_ids: list[int]
    method: str
    prefill_s: float
    decode_s: float
    decode_runs: int
    tokens_per_s: float
    memory: dict[str, int]
    reconstruct_s: float = 0.0  # observe="explicit": the reconstruction pass and the compression
    observe: str = ""  # fastgen-adaptive: what ranked and judged ("scores": the model's scorer)

    @property
    def kv_share(self) -> float:
        """KV bytes held / a full cache's."""
        full = self.memory["kv_bytes_full"]
        return self.memory["kv_bytes_held"] / full if full else 0.0


@dataclasses.dataclass
class Profile:
    """Every head's choice after a prompt (:meth:`Model.profile`): arrays over [layer, kv_head]."""

    method: str
    shortlist: list[str]
    policy_index: np.ndarray
    components: list[list[str]]
    recovery: np.ndarray
    kept: np.ndarray
    length: int
    memory: dict[str, int]


def _checked(name: str, value: Any, lo: float, hi: float, cli: str, *, real: bool = False,
             above: bool = False) -> Any:
    """value as an int (a float when real) in [lo, hi] ((lo, hi] when above), as the CLI's option `cli`
    takes it; else the CLI's refusal, in its words ("bad value for ..."), as a ValueError."""
    try:
        v = float(value) if real else operator.index(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected {'a number' if real else 'an integer'}, got {value!r}") from None
    if not ((v > lo if above else v >= lo) and v <= hi):  # NaN fails both
        span = f"{'(' if above else '['}{lo:g}, {hi:g}]"
        raise ValueError(f"bad value for {name}: {value!r} ({'a number' if real else 'an integer'} in {span}, "
                         f"as {cli} takes it)")
    return v


class Model(_fastgen._Model):
    """A Llama-architecture model (GGUF, or llama2.c with its tokenizer) whose attention runs on fastgen.

    Model(path, *, tokenizer=None, backend=None, kv_dtype="f16", v_dtype=None, max_seqs=4,
          threads=0, f32_activations=False, ctx_size=0, prefill_chunk=0)

    f32_activations: products in f32 against the dequantized weights, instead of the CLI's default 8-bit
    activations (ggml's q8_0/q8_1 scheme for q4_0/q4_1/q5_0/q5_1/q8_0 weights). ctx_size: positions a sequence may hold
    (0: the model's context). scorer: the model's key scorer (``fastgen calibrate``) for observe="scores";
    None: MODEL.fgscore when that file exists, False: none. With one, fastgen-adaptive ranks keys by it
    unless observe is given (:attr:`scorer` says which file).
    """

    def __init__(self, path: str | os.PathLike | None = None, *, tokenizer: str | os.PathLike | None = None,
                 backend: str | None = None, kv_dtype: str = "f16", v_dtype: str | None = None, max_seqs: int = 4,
                 threads: int = 0, f32_activations: bool = False, ctx_size: int = 0, prefill_chunk: int = 0,
                 scorer: str | os.PathLike | bool | None = None) -> None:
        max_seqs = _checked("max_seqs", max_seqs, 1, 1 << 16, "the runner")
        threads = _checked("threads", threads, 0, 1024, "-t (0: every core)")
        ctx_size = _checked("ctx_size", ctx_size, 0, 1 << 24, "-c (0: the model's context)")
        prefill_chunk = _checked("prefill_chunk", prefill_chunk, 0, 1 << 20, "--prefill-chunk (0: the whole prompt)")
        path = os.fspath(path) if path is not None else find_model()
        if scorer is True:
            raise ValueError("scorer: a file, None (MODEL.fgscore when there) or False (none), not True")
        if scorer is None:
            scorer = path + ".fgscore" if os.path.isfile(path + ".fgscore") else False
        self.scorer: str | None = os.fspath(scorer) if scorer is not False else None
        super().__init__(path, tokenizer, backend=backend, kv_dtype=kv_dtype, v_dtype=v_dtype, max_seqs=max_seqs,
                         threads=threads, f32_activations=f32_activations, ctx_size=ctx_size,
                         prefill_chunk=prefill_chunk, scorer=self.scorer)
        self.path = path
        self._cli_args = ["-m", path] + (["-z", os.fspath(tokenizer)] if tokenizer is not None else [])
        self._cli_args += ["--dtype", kv_dtype] + (["-t", str(threads)] if threads else [])
        self._cli_args += ["--backend", backend] if backend else []
        self._cli_args += ["-ctv", v_dtype] if v_dtype else []
        self._cli_args += ["--prefill-chunk", str(prefill_chunk)] if prefill_chunk else []
        self._ctx_size = ctx_size  # eval's runs size their sequences themselves: refused there when set
        self._cli_args += ["--f32-activations"] if f32_activations else []
        self._cli_args += ["--scorer", self.scorer or "none"]

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _ids(self, prompt: str | Sequence[int]) -> list[int]:
        return self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)

    def generate(self, prompt: str | Sequence[int], method: str | Compression = "fastgen-adaptive",
                 budget: float | None = None, max_tokens: int = 64, temperature: float = 0.0, top_p: float = 0.9,
                 top_k: int = 0, seed: int = 1, ignore_eos: bool = False, **overrides: Any) -> Generation:
        """Text from a prompt (text, or token ids) under a compression method (a preset name or a
        :class:`Compression`; budget and keyword overrides as in :func:`compression`). Greedy at
        temperature 0, else sampled (top_k, top_p, seed) as the CLI samples; at most max_tokens, fewer
        where the model's context (or ctx_size) ends first or at the end of text (unless ignore_eos). The
        timings and the KV memory held at the end come with the text. observe="explicit" (fastgen-adaptive):
        a reconstruction pass (the prompt read again after an instruction to repeat it) judges the
        compression, as ``fastgen generate --observe reconstruct`` does. fastgen-adaptive with no observe
        given ranks keys by the model's scorer when it has one (observe="scores"), as the CLI does."""
        max_tokens = _checked("max_tokens", max_tokens, 0, 1 << 20, "-n")
        temperature = _checked("temperature", temperature, 0, 100, "--temp (0: greedy)", real=True)
        top_p = _checked("top_p", top_p, 0, 1, "--top-p", real=True, above=True)
        top_k = _checked("top_k", top_k, 0, 1 << 30, "--top-k (0: all)")
        seed = _checked("seed", seed, 0, 2147483647, "--seed")
        if budget is not None:
            overrides["budget"] = budget
        comp = compression(method, **overrides)
        named = not isinstance(method, str) or "observe" in overrides or "observe=" in method
        if self.scorer and comp.allocation == "adaptive" and comp.observe == "tail" and not named:
            comp = comp.replace(observe="scores")
        ids = self._ids(prompt)
        recon = None
        if comp.observe == "explicit":  # the runner reads the prompt again after KVzip's instruction, as the CLI
            chat = isinstance(prompt, str) and "<|im_start|>" in prompt
            recon = self.tokenize(_RECONSTRUCT_CHAT if chat else _RECONSTRUCT, bos=False)
        r = self._generate(ids, comp._fields(), max_tokens, temperature, top_p, top_k, seed, ignore_eos, recon)
        tps = r["decode_runs"] / r["decode_s"] if r["decode_s"] > 0 else 0.0
        return Generation(text=self.detokenize(r["ids"], after=ids[-1]), ids=r["ids"], prompt_ids=ids,
                          method=comp.method or "custom", prefill_s=r["prefill_s"], decode_s=r["decode_s"],
                          decode_runs=r["decode_runs"], tokens_per_s=tps, memory=r["memory"],
                          reconstruct_s=r["reconstruct_s"],
                          observe=comp.observe if comp.allocation == "adaptive" else "")

    def profile(self, prompt: str | Sequence[int], method: str | Compression = "fastgen",
                **overrides: Any) -> Profile:
        """Every head's policy after the prompt's prefill under a method (default: the paper's FastGen),
        with every shortlist entry's recovery, as arrays over [layer, kv_head]."""
        comp = compression(method, **overrides)
        r = self._profile(self._ids(prompt), comp._fields())
        cfg = self.config
        shape = (cfg["n_layers"], cfg["n_kv_heads"])
        heads = r["heads"]
        return Profile(
            method=comp.method or "custom",
            shortlist=[p.components for p in comp.shortlist],
            policy_index=np.array([h["policy_index"] for h in heads], dtype=np.int32).reshape(shape),
            components=[[heads[layer * shape[1] + h]["components"] for h in range(shape[1])]
                        for layer in range(shape[0])],
            recovery=np.array([h["recovery"] for h in heads], dtype=np.float32).reshape(shape + (-1,)),
            kept=np.array([h["kept"] for h in heads], dtype=np.int32).reshape(shape),
            length=heads[0]["length"] if heads else 0,
            memory=r["memory"])

    # -- evaluation: the CLI's, so the figures are `fastgen eval`'s to the digit

    def _cli(self, args: list[str]) -> dict:
        if self._ctx_size:
            raise ValueError("eval and passkey size each run's context from its prompt: create the Model without "
                             "ctx_size to evaluate")
        cmd = [_cli_path(), "eval"] + self._cli_args + args + ["--json", "-q"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"fastgen eval failed ({run.returncode}): {run.stderr.strip()}")
        return json.loads(run.stdout)

    def eval(self, prompts: Iterable[str], methods: Sequence[str] | None = None,
             budgets: Sequence[float] | None = None, steps: int = 32) -> list[dict]:
        """Quality against memory, as ``fastgen eval --sweep --json``: for each prompt the full cache makes a
        greedy reference of `steps` tokens; the first method (default fastgen-adaptive) runs at each budget,
        the others at the KV memory it kept on that prompt. One row per (budget, method): kv_kept, kl_mean,
        kl_max, top1, agree, diff and its 95 % interval against the first method (a list of dicts, ready
        for pandas.DataFrame)."""
        doc = self._with_prompts(prompts, ["--sweep", "-n", str(steps)] + _method_args(methods, budgets))
        return _rows(doc)

    def passkey(self, cases: Iterable[tuple], methods: Sequence[str] | None = None,
                budgets: Sequence[float] | None = None, steps: int = 12) -> list[dict]:
        """Retrieval, as ``fastgen eval --passkey --json``: every method answers greedily (at most `steps`
        tokens a question) at each budget. A case is (key, prompt), the prompt hiding the number key and
        asking for it at its end; or (document, [(key, turn), ...]), the document prefilled and compressed
        alone, then each turn appended after it (several: the compressed document forked for each, the
        serving shape); every case of a call in the same form. One row per (budget, method) with accuracy:
        the mean over the cases of the share of their answers that hold the key."""
        def field(text, what):
            text = str(text) if isinstance(text, int) and what == "a key" else text
            if not isinstance(text, str) or not text or "\t" in text:
                raise ValueError(f"passkey: {what} must be a non-empty string without tabs: {text!r}")
            return text.replace("\\", "\\\\").replace("\n", "\\n")

        lines, forms = [], set()
        for case in cases:
            if not isinstance(case, (tuple, list)) or len(case) != 2:
                raise ValueError(f"passkey: a case is (key, prompt) or (document, [(key, turn), ...]): {case!r}")
            forms.add(isinstance(case[1], str))
            if len(forms) > 1:
                raise ValueError("passkey: every case of a call in one form, (key, prompt) or (document, [...])")
            if isinstance(case[1], str):
                parts = [field(case[0], "a key"), field(case[1], "a prompt")]
            else:
                questions = list(case[1]) if isinstance(case[1], (tuple, list)) else []
                if not 1 <= len(questions) <= 8 or not all(isinstance(q, (tuple, list)) and len(q) == 2
                                                           for q in questions):
                    raise ValueError(f"passkey: a document takes 1 to 8 (key, turn) pairs: {case[1]!r}")
                parts = [field(questions[0][0], "a key"), field(case[0], "a document"),
                         field(questions[0][1], "a turn")]
                for key, turn in questions[1:]:
                    parts += [field(key, "a key"), field(turn, "a turn")]
            if parts[0].startswith("#"):  # the file's comment lines
                raise ValueError(f"passkey: a key must not start with '#': {parts[0]!r}")
            lines.append("\t".join(parts))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "passkey.tsv")
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
            return _rows(self._cli(["--passkey", path, "-n", str(steps)] + _method_args(methods, budgets)))

    def _with_prompts(self, prompts: Iterable[str], args: list[str]) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "prompts.txt")
            with open(path, "w", encoding="utf-8") as f:
                for p in prompts:
                    f.write(p.replace("\\", "\\\\").replace("\n", "\\n") + "\n")
            return self._cli(["--prompts", path] + args)


def _method_args(methods: Sequence[str] | None, budgets: Sequence[float] | None) -> list[str]:
    args = []
    if methods:
        args += ["--methods", ",".join(methods)]
    if budgets:
        args += ["--budgets", ",".join(f"{b:g}" for b in budgets)]
    return args


def _rows(doc: dict) -> list[dict]:
    rows = []
    for point in doc.get("points", []):
        for m in point["methods"]:
            row = {"budget": point["budget"], **{k: v for k, v in m.items() if k not in ("per_prompt",)}}
            if "kv_kept_range" in row:
                row["kv_kept_min"], row["kv_kept_max"] = row.pop("kv_kept_range")
            if "diff_ci95" in row:
                row["diff_ci95_low"], row["diff_ci95_high"] = row.pop("diff_ci95")
            rows.append(row)
    return rows


def _cli_path() -> str:
    """The fastgen CLI: $FASTGEN_CLI, else the package's own, installed beside the extension (in an editable
    install, the build folder's)."""
    env = os.environ.get("FASTGEN_CLI")
    if env:
        return env
    ext_dir = os.path.dirname(os.path.abspath(_fastgen.__file__))
    for path in (os.path.join(ext_dir, "fastgen"), os.path.join(ext_dir, os.pardir, "tools", "fastgen")):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError("the fastgen CLI is not installed with this package: set FASTGEN_CLI to a fastgen binary")
