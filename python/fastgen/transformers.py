"""fastgen inside Hugging Face transformers: FastGen's per-head compressed KV cache in ``model.generate()``.

    import fastgen.transformers as fgt
    engine = fgt.enable(model, tokenizer, method="fastgen-adaptive", budget=0.5)
    out = model.generate(**inputs, max_new_tokens=64)      # attention and cache: fastgen's
    engine.memory()                                        # KV bytes held by the last generate()'s cache
    engine.heads()                                         # every head's policy, kept rows, recoveries
    fgt.disable(model)                                     # transformers' own attention again

Two extension points of transformers (5.x; tested with 5.2) carry it, nothing is patched:

* an attention function registered as ``"fastgen"`` (transformers' ``AttentionInterface``),
  which the model's attention layers call with q, k, v after RoPE;
* :class:`FastGenCache`, a ``transformers.Cache`` that holds no tensors: each of its layers hands
  the new k, v to the attention function, which gives them to fastgen's engine (a
  :class:`fastgen.Context`): the prompt's prefill profiles every KV head and keeps its compressed
  cache, each decode step attends only the rows kept.

One forward pre-hook on the model reads the token ids (FastGen's special and punctuation
policies need them) and gives the forward a :class:`FastGenCache` where transformers would
have made its own. Models: the Llama family (Llama, SmolLM2, Mistral without sliding window,
Qwen2, Qwen3): RoPE before the cache, grouped-query attention. Batches of equal-length
prompts; a padded batch is refused. Activations cross to the engine in the model's dtype when
it is float16 or bfloat16 (the engine's act_dtype: converted to fp32 inside, once per call),
else as float32; on CUDA the model's tensors stay on the device when fastgen is built
with CUDA (``io="device"``).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import numpy as np
import torch
import transformers
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer, Cache, PreTrainedModel
from transformers.cache_utils import CacheLayerMixin

import fastgen

__all__ = ["Engine", "FastGenCache", "disable", "enable", "from_gguf", "token_classes"]

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
_NAME = "fastgen"

# The cache whose layer just took a forward's k, v: set by FastGenCache's layer, read by the attention
# function that runs right after it in the same thread (transformers passes the cache to neither).
_active = threading.local()


def from_gguf(path: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """(model, tokenizer): a GGUF file loaded by transformers (dequantized to dtype, in eval mode), quietly;
    default: SmolLM2-135M-Instruct where scripts/get-models.sh caches it (:func:`fastgen.find_model`)."""
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    folder, name = os.path.split(os.path.abspath(os.fspath(path) if path is not None else fastgen.find_model()))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype).eval()
    return model, tok


def model_shape(cfg: Any) -> tuple[int, int, int, int]:
    """(n_layers, n_q_heads, n_kv_heads, head_dim) of a supported model's config; other types refused."""
    if cfg.model_type not in SUPPORTED:
        raise ValueError(f"fastgen.transformers: model type {cfg.model_type!r} is not supported (supported: "
                         f"{', '.join(SUPPORTED)})")
    n_q = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_q
    return cfg.num_hidden_layers, n_q, n_kv, getattr(cfg, "head_dim", None) or cfg.hidden_size // n_q


def model_rope(model: Any, head_dim: int) -> dict[str, Any]:
    """The model's RoPE as fastgen.Context takes it (rope_theta, rope_dims, rope_style, rope_freq_factors), for
    observe="predicted": Hugging Face's rotate_half pairs lanes i and i + rope_dims / 2 ("halves"); the
    frequencies are the rotary embedding's own (inv_freq), so a scaled RoPE (Llama 3's) is described as it
    turns. {} when the model has no rotary embedding to read."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    inv_freq = getattr(rotary, "inv_freq", None)
    cfg = model.config
    theta = getattr(cfg, "rope_theta", None) or (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
    if inv_freq is None or not theta:
        return {}
    inv = inv_freq.detach().double().cpu().tolist()
    dims = 2 * len(inv)
    if dims > head_dim or dims % 2:
        return {}
    base = [float(theta) ** (-i / (dims / 2)) for i in range(dims // 2)]
    factors = [b / f for b, f in zip(base, inv)]
    plain = all(abs(x - 1.0) < 1e-6 for x in factors)
    return {"rope_theta": float(theta), "rope_dims": dims, "rope_style": "halves",
            "rope_freq_factors": None if plain else factors}


def token_classes(tokenizer: Any, cfg: Any) -> fastgen.TokenClasses:
    """FastGen's token classes (special, punctuation) from a transformers tokenizer's vocabulary:
    byte-level BPE pieces (GPT-2, Llama 3, SmolLM2, Qwen) or SentencePiece pieces (Llama 2, Mistral);
    the tokenizer's special and added special tokens are special. Without a tokenizer, the config's
    BOS and EOS are special and every other id ordinary."""
    vocab_size = cfg.vocab_size
    if tokenizer is None:
        classes = fastgen.TokenClasses(vocab_size)
        for i in (cfg.bos_token_id, cfg.eos_token_id):
            for j in (i if isinstance(i, list) else [i]):
                if j is not None and 0 <= j < vocab_size:
                    classes.set(j, "special")
        return classes
    n = min(vocab_size, len(tokenizer))
    pieces: list[str | None] = list(tokenizer.convert_ids_to_tokens(list(range(n))))
    pieces += [None] * (vocab_size - n)
    sample = [p for p in pieces[:4096] if p]
    if any(p.startswith("\u0120") for p in sample):
        encoding = "gpt2"
    elif any(p.startswith("\u2581") for p in sample):
        encoding = "sentencepiece"
    else:
        encoding = "text"
    classes = fastgen.TokenClasses(vocab_size, pieces, encoding=encoding)
    special = set(tokenizer.all_special_ids)
    for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            special.add(i)
    for i in special:
        if 0 <= i < vocab_size:
            classes.set(i, "special")
    return classes


class _Layer(CacheLayerMixin):
    """One layer of a FastGenCache: it holds no tensors; the engine does."""

    is_sliding = False
    is_compileable = False

    def __init__(self, cache: "FastGenCache", index: int) -> None:
        super().__init__()
        self._cache = weakref.proxy(cache)
        self.index = index
        self.seen = 0  # positions this layer has given the engine

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # This returns only the new rows: attention other than fastgen's would see no past at all
        if getattr(_active, "key", None) is not None:
            _active.cache = _active.key = None
            raise RuntimeError("FastGenCache: the previous layer's k, v were not taken by fastgen's attention; "
                               "a FastGenCache works only on a model where fastgen.transformers.enable() is on")
        self._cache._check_usable()
        self.is_initialized = True
        _active.cache = self._cache
        _active.key = key_states
        return key_states, value_states

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        return self.seen + cache_position.shape[0], 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_cache_shape(self) -> int:
        return -1

    def reset(self) -> None:
        raise NotImplementedError("FastGenCache: reset is not supported; make a new cache (engine.new_cache())")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("FastGenCache: beam search is not supported (each head keeps its own rows)")

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("FastGenCache: crop (assisted decoding) is not supported: evicted rows are gone")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("FastGenCache: selecting batch rows is not supported")


def _destroy_all(ctx: fastgen.Context, seqs: list[int]) -> None:
    if not ctx.closed:
        for s in seqs:
            try:
                ctx.destroy(s)
            except (ValueError, RuntimeError):  # a context busy in another thread: its close frees them
                pass
    seqs.clear()


# fastgen.Context.memory's fields that belong to a sequence (the others are the context's pool)
_SEQ_FIELDS = ("kv_bytes_held", "kv_bytes_full", "meta_bytes_held", "rows_kept", "rows_full", "kv_bytes_alone")


class FastGenCache(Cache):
    """A transformers ``Cache`` whose rows live in fastgen's engine, one compressed cache per KV head.

    Made by :meth:`Engine.new_cache` (or by the model's forward once :func:`enable` ran). Pass one as
    ``past_key_values=`` to keep a conversation's cache across ``generate()`` calls; its sequences are
    destroyed (their memory freed) when it is closed or garbage-collected.
    """

    def __init__(self, engine: "Engine") -> None:
        self._engine = engine
        super().__init__(layers=[_Layer(self, i) for i in range(engine.n_layers)])
        self.seqs: list[int] = []  # one engine sequence per batch row
        self._tokens: np.ndarray | None = None  # this forward's token ids [B, T], int32
        self._broken = ""  # why a forward failed halfway (the layers disagree on what they hold)
        self._finalizer = weakref.finalize(self, _destroy_all, engine.context, self.seqs)

    def close(self) -> None:
        """Destroys the engine's sequences now (frees their pages)."""
        self._finalizer()

    def memory(self) -> dict[str, int]:
        """KV memory of this cache's sequences, summed over its rows (kv_bytes_held, kv_bytes_full,
        meta_bytes_held, rows_kept, rows_full, kv_bytes_alone), and the engine's pool (pool_bytes,
        pages_in_use, pages_free: every cache of the engine)."""
        ctx = self._engine.context
        total = dict(ctx.memory())
        for key in _SEQ_FIELDS:
            total[key] = 0
        for s in self.seqs:
            m = ctx.memory(s)
            for key in _SEQ_FIELDS:
                total[key] += m[key]
        return total

    def heads(self, row: int = 0) -> dict[str, Any]:
        """Every head of one batch row's sequence (:meth:`fastgen.Context.heads`): policy_index, kept,
        recovery, components... as arrays over [layer, kv_head]."""
        if not 0 <= row < len(self.seqs):
            raise ValueError(f"FastGenCache.heads: row {row} out of range (the cache holds {len(self.seqs)} "
                             "sequences; none before the first forward)")
        return self._engine.context.heads(self.seqs[row])

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.seqs:
            raise NotImplementedError("FastGenCache: expanding a cache that holds rows (num_return_sequences on a "
                                      "passed cache) is not supported; pass none and generate() prefills each row")

    def _check_usable(self) -> None:
        if self._engine.context.closed:
            raise ValueError("FastGenCache: its engine was disabled (the context is closed); make a new cache")
        if self._broken:
            raise ValueError(f"FastGenCache: a forward failed halfway ({self._broken}); its layers no longer hold "
                             "the same positions: make a new cache (engine.new_cache())")

    def _start(self, input_ids: torch.Tensor) -> None:
        """A forward begins: its ids kept, the batch checked against the rows the cache holds."""
        self._check_usable()
        ids = input_ids.detach().to("cpu", torch.int32).numpy()
        if self.seqs and len(self.seqs) != ids.shape[0]:
            raise ValueError(f"FastGenCache: it holds {len(self.seqs)} batch rows, the forward has {ids.shape[0]}")
        self._tokens = ids

    # -- the attention function's side

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        try:
            return self._attend_layer(layer, q, k, v)
        except Exception as e:
            if any(lay.seen for lay in self.layers):
                self._broken = f"layer {layer}: {e}"
            raise

    def _attend_layer(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        engine = self._engine
        ctx = engine.context
        B, Hq, T, D = q.shape
        tokens = self._tokens
        if tokens is None or tokens.shape != (B, T):
            raise ValueError("fastgen: the forward's token ids are unknown or do not match the attention's "
                             f"batch ({B} x {T}): call the model with input_ids (FastGen's token classes need "
                             "them; inputs_embeds are not supported)")
        dtype = q.dtype  # the engine takes the model's dtype when it is fp16 / bf16 (act_dtype), else fp32
        q, k, v = (x.detach().to(engine.act_torch) for x in (q, k, v))  # inference: _attention refuses training
        if engine.io == "host" and q.device.type != "cpu":
            raise ValueError(f"fastgen: the model runs on {q.device} but the engine's activations are in host "
                             "memory; enable() on a CUDA model with a fastgen built with CUDA (io='device')")
        lay = self.layers[layer]
        if lay.seen == 0 and layer == 0 and not self.seqs:  # each row its own sequence
            made = []
            try:
                for b in range(B):
                    made.append(ctx.create(tokens[b]))
            except ValueError as e:
                for s in made:
                    ctx.destroy(s)
                raise ValueError(f"fastgen: {B} batch rows do not fit the engine ({e}); enable(max_seqs=) sets "
                                 "how many rows its caches hold at once, cache.close() frees a cache's") from e
            self.seqs.extend(made)
        if len(self.seqs) != B:
            raise ValueError(f"fastgen: the cache holds {len(self.seqs)} sequences, the forward {B}")
        if lay.seen == 0:  # the prompt: each sequence profiled and compressed at its prefill
            out = q.new_empty((B, T, Hq, D))
            for b in range(B):
                ctx.prefill(self.seqs[b], layer, q[b].transpose(0, 1).contiguous(),
                            k[b].transpose(0, 1).contiguous(), v[b].transpose(0, 1).contiguous(), out=out[b])
        elif T == 1:  # a decode step for the whole batch at once
            out = ctx.decode(layer, self.seqs, tokens[:, 0], q[:, :, 0].contiguous(), k[:, :, 0].contiguous(),
                             v[:, :, 0].contiguous()).view(B, 1, Hq, D)
        else:  # more tokens onto a cache that has some (a next turn): appended, the cache stays compressed
            out = q.new_empty((B, T, Hq, D))
            for b in range(B):
                ctx.append(self.seqs[b], layer, tokens[b], q[b].transpose(0, 1).contiguous(),
                           k[b].transpose(0, 1).contiguous(), v[b].transpose(0, 1).contiguous(), out=out[b])
        lay.seen += T
        return out if dtype == out.dtype else out.to(dtype)


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention function "fastgen": the engine's attention over the rows each head keeps.
    Returns [B, T, Hq, D] as transformers' attention functions do (no attention weights)."""
    cache = getattr(_active, "cache", None)
    if cache is None or getattr(_active, "key", None) is not key:
        raise RuntimeError("fastgen attention runs with a FastGenCache only: enable() installs one on the model's "
                           "forward; pass past_key_values=engine.new_cache() when calling a submodule directly")
    _active.cache = _active.key = None
    if dropout or (module.training and torch.is_grad_enabled()):
        raise ValueError("fastgen attention is for inference: no gradient flows through it (model.eval(), or "
                         "torch.no_grad())")
    head_dim = query.shape[-1]
    if scaling is not None and abs(scaling - head_dim ** -0.5) > 1e-6 * head_dim ** -0.5:
        raise ValueError(f"fastgen attention: scaling {scaling} is not 1/sqrt(head_dim) = {head_dim ** -0.5}")
    if kwargs.get("sliding_window"):
        raise ValueError("fastgen attention: sliding-window layers are not supported")
    return cache._attend(module.layer_idx, query, key, value), None


AttentionInterface.register(_NAME, _attention)


class Engine:
    """fastgen's engine behind one transformers model (what :func:`enable` returns).

    context: the :class:`fastgen.Context` (shape from the model's config). last_cache: the
    :class:`FastGenCache` of the model's latest forward that made one (generate() makes one per call).
    """

    def __init__(self, model: PreTrainedModel, classes: fastgen.TokenClasses, *, backend: str | None,
                 kv_dtype: str, max_seqs: int, max_seq_len: int | None, threads: int,
                 compression: fastgen.Compression) -> None:
        cfg = model.config
        self.n_layers, n_q, n_kv, head_dim = model_shape(cfg)
        devices = {p.device for p in model.parameters()}
        if len(devices) > 1:
            raise ValueError(f"fastgen.transformers: the model spans {len(devices)} devices; fastgen's engine "
                             "serves one")
        device = devices.pop()
        # q, k, v and out cross in the model's dtype when the engine takes it (f16, bf16), else as fp32
        dtypes = {p.dtype for p in model.parameters()}
        model_dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
        self.act_dtype = {torch.float16: "f16", torch.bfloat16: "bf16"}.get(model_dtype, "f32")
        self.act_torch = {"f16": torch.float16, "bf16": torch.bfloat16}.get(self.act_dtype, torch.float32)
        self.io = "device" if device.type == "cuda" else "host"
        stream = None
        if self.io == "device":  # the engine queues its work on the stream current at enable()
            stream = torch.cuda.current_stream(device).cuda_stream
            backend = backend or ("hip" if getattr(torch.version, "hip", None) else "cuda")
        self.compression = compression  # what every sequence compresses by
        self.context = fastgen.Context(
            self.n_layers, n_q, n_kv, head_dim, classes=classes, backend=backend, kv_dtype=kv_dtype,
            max_seqs=max_seqs, max_seq_len=max_seq_len or cfg.max_position_embeddings, threads=threads,
            io=self.io, stream=stream, act_dtype=self.act_dtype, compression=compression,
            **model_rope(model, head_dim))
        self.last_cache: FastGenCache | None = None
        # transformers' own empty caches (generate() makes one; a caller may pass one) and the FastGenCache
        # that stands in for each, so a loop that passes the same object forward after forward continues it
        self._stand_ins: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._hook: Any = None
        self._previous_attn = cfg._attn_implementation

    def new_cache(self) -> FastGenCache:
        """An empty cache on this engine (to pass as ``past_key_values=``)."""
        return FastGenCache(self)

    def memory(self) -> dict[str, int]:
        """The last cache's KV memory (:meth:`FastGenCache.memory`)."""
        if self.last_cache is None:
            raise ValueError("fastgen: no forward has run on this engine yet")
        return self.last_cache.memory()

    def heads(self, row: int = 0) -> dict[str, Any]:
        """The last cache's heads (:meth:`FastGenCache.heads`)."""
        if self.last_cache is None:
            raise ValueError("fastgen: no forward has run on this engine yet")
        return self.last_cache.heads(row)

    def _pre_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The model's forward pre-hook: the token ids to the cache, a FastGenCache where there is none."""
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            raise ValueError("fastgen: call the model with input_ids (FastGen's token classes need the ids; "
                             "inputs_embeds alone are not supported)")
        _active.cache = _active.key = None
        given = kwargs.get("past_key_values")
        if isinstance(given, FastGenCache):
            given._check_usable()
            cache = given
        elif given is None:
            cache = self.new_cache()
        elif given in self._stand_ins:
            cache = self._stand_ins[given]
        elif isinstance(given, Cache) and given.get_seq_length() == 0:
            cache = self._stand_ins[given] = self.new_cache()
        else:
            raise ValueError(f"fastgen: the forward got a {type(given).__name__} that holds rows fastgen never saw; "
                             "fastgen keeps its own (pass past_key_values=engine.new_cache(), or none)")
        kwargs["past_key_values"] = cache
        if cache._engine is not self:
            raise ValueError("fastgen: this FastGenCache belongs to another engine")
        mask = kwargs.get("attention_mask")
        if cache.get_seq_length() == 0 and mask is not None and mask.dim() == 2 and not bool(mask.all()):
            raise ValueError("fastgen: a padded batch (attention_mask with zeros) is not supported: each row is its "
                             "own sequence; batch prompts of equal length or generate one at a time")
        cache._start(input_ids)
        self.last_cache = cache
        return args, kwargs


def enable(model: PreTrainedModel, tokenizer: Any = None, method: str | fastgen.Compression = "fastgen-adaptive",
           budget: float | None = None, *, backend: str | None = None, kv_dtype: str = "f16", max_seqs: int = 8,
           max_seq_len: int | None = None, threads: int = 0, **overrides: Any) -> Engine:
    """Runs a transformers causal LM's attention and KV cache on fastgen, compressed by `method`
    (a preset name or a :class:`fastgen.Compression`; budget and keyword overrides as in
    :func:`fastgen.compression`). tokenizer: the model's (its vocabulary gives FastGen's special and
    punctuation classes); without one every id but BOS and EOS is ordinary. max_seqs: batch rows
    held at once (each generate() call's rows; a cache still referenced keeps its rows).

    Returns the :class:`Engine` (memory and per-head policies of the last generate()); :func:`disable`
    restores transformers' attention.
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"fastgen.transformers.enable: expected a transformers PreTrainedModel, got "
                        f"{type(model).__name__}")
    cfg = model.config
    model_shape(cfg)  # a supported model type
    if getattr(cfg, "use_sliding_window", False) or (cfg.model_type == "mistral" and cfg.sliding_window):
        raise ValueError("fastgen.transformers: sliding-window attention is not supported (set the config's "
                         "sliding_window to None for full attention)")
    if getattr(model, "_fastgen_engine", None) is not None:
        raise ValueError("fastgen.transformers: already enabled on this model (disable() first)")
    if budget is not None:
        overrides["budget"] = budget
    comp = fastgen.compression(method, **overrides)
    if comp.observe == "explicit":
        raise ValueError("fastgen.transformers: observe='explicit' needs a reconstruction pass, which generate() "
                         "does not run; use the tail (the default) here")
    classes = token_classes(tokenizer, cfg)
    engine = Engine(model, classes, backend=backend, kv_dtype=kv_dtype, max_seqs=max_seqs, max_seq_len=max_seq_len,
                    threads=threads, compression=comp)
    model.set_attn_implementation(_NAME)
    engine._hook = model.register_forward_pre_hook(engine._pre_forward, with_kwargs=True)
    model._fastgen_engine = engine
    return engine


def disable(model: PreTrainedModel) -> None:
    """Undoes :func:`enable`: transformers' previous attention, no hook; the engine's context is closed."""
    engine: Engine | None = getattr(model, "_fastgen_engine", None)
    if engine is None:
        raise ValueError("fastgen.transformers.disable: fastgen is not enabled on this model")
    engine._hook.remove()
    model.set_attn_implementation(engine._previous_attn)
    model._fastgen_engine = None
    if engine.last_cache is not None:
        engine.last_cache.close()
    engine.last_cache = None
    engine.context.close()

