"""fastgen's methods as kvpress presses: ``pipe(context, question=q, press=FastGenPress(compression_ratio=0.5))``.

    from transformers import pipeline
    import kvpress
    from fastgen.kvpress import FastGenPress

    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    press = FastGenPress(compression_ratio=0.5, tokenizer=tokenizer)       # fastgen-adaptive at half the rows
    pipe(context, question=question, press=press)["answer"]
    press.kept_share                                                       # rows kept / rows of the context

During kvpress' prefill of the context, each attention layer's queries (recomputed from the layer's input,
RoPE applied) and its cached keys and values go to fastgen's engine (a :class:`fastgen.Context` the
shape of the model), which profiles every KV head exactly as it does on its own; after the last layer
the rows each head dropped become kvpress' head-wise mask (``module.masked_key_indices``, the mechanism
its AdaKVPress uses): during the question and the answer a masked key gets no attention.

What that costs: kvpress keeps one padded tensor per layer, so a masked row stays in memory. The press
saves no bytes; the same decision in fastgen's own engine (:mod:`fastgen.transformers`, the CLI) frees
the rows. The masks also stay as the prefill left them (kvpress compresses the context only), where
fastgen's engine keeps sliding each head's window and re-ranking its heavy hitters while decoding.
The engine runs on the host (backend "cpu" by default): on a GPU model each layer's q, k, v are copied to
the host once for the decision.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Generator

import numpy as np
import torch
from kvpress.presses.base_press import BasePress
from kvpress.utils import get_prerope_query_states
from transformers import PreTrainedModel
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import fastgen
from fastgen.transformers import model_rope, model_shape, token_classes

__all__ = ["FastGenPress"]


@dataclasses.dataclass
class FastGenPress(BasePress):
    """A fastgen method as a kvpress press (the context's compression, head by head).

    compression_ratio: the share of the context's rows to drop (kvpress' convention): the budget of
    fastgen-adaptive, the ratios of a one-entry preset (:meth:`compression`); 0: the method as it is
    (the paper's "fastgen" chooses its memory by its threshold, and takes only 0).
    method: a fastgen preset (``fastgen.presets()``: "fastgen-adaptive", "fastgen", "snapkv", ...).
    options: the preset's fields to override (``{"window": 32}``), as :func:`fastgen.compression`.
    tokenizer: the model's (FastGen's special and punctuation classes); None: BOS and EOS special only.
    """

    compression_ratio: float = 0.0
    method: str = "fastgen-adaptive"
    options: dict = dataclasses.field(default_factory=dict)
    tokenizer: Any = None
    kv_dtype: str = "f32"
    backend: str | None = None
    threads: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.compression_ratio < 1:
            raise ValueError(f"FastGenPress: compression_ratio must be in [0, 1), got {self.compression_ratio}")
        self.compression()  # a bad method or option fails here, not in the middle of a prefill
        self.kept_share: float | None = None  # after a prefill: rows kept / rows, over layers, heads, rows
        self._ctx: fastgen.Context | None = None
        self._ctx_key: tuple | None = None
        self._modules: list[torch.nn.Module] = []
        self._seqs: list[int] = []
        self._ids: torch.Tensor | None = None

    def compression(self) -> fastgen.Compression:
        """The engine's compression: the method with its options, keeping 1 - compression_ratio of the rows
        (:func:`fastgen.compression`'s ``kept``: fastgen-adaptive's budget, a one-entry preset's ratios)."""
        try:
            return fastgen.compression(self.method, kept=1.0 - self.compression_ratio if self.compression_ratio
                                       else None, **self.options)
        except ValueError as e:
            raise ValueError(f"FastGenPress: {e}") from e

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        cfg = model.config
        shape = model_shape(cfg)
        key = (id(model), shape, self.kv_dtype, self.backend, self.threads, id(self.tokenizer))
        if self._ctx is not None and self._ctx_key == key:
            self._ctx.set_compression(self.compression())
            return
        self.close()
        self._ctx = fastgen.Context(*shape, classes=token_classes(self.tokenizer, cfg),
                                    backend=self.backend, kv_dtype=self.kv_dtype, max_seqs=8,
                                    max_seq_len=cfg.max_position_embeddings, threads=self.threads,
                                    compression=self.compression(), **model_rope(model, shape[3]))
        self._ctx_key = key

    def close(self) -> None:
        """Closes the engine context (a later prefill makes a new one)."""
        if self._ctx is not None:
            self._release()
            self._ctx.close()
        self._ctx = None

    @contextlib.contextmanager
    def __call__(self, model: PreTrainedModel) -> Generator:
        lm = model.model.language_model if hasattr(model.model, "language_model") else model.model
        self._modules = [layer.self_attn for layer in lm.layers]
        hook = lm.register_forward_pre_hook(self._capture, with_kwargs=True)
        try:
            with super().__call__(model):
                yield
        finally:
            hook.remove()
            self._release()
            self._ids = None
            self._modules = []

    def _capture(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise ValueError("FastGenPress: the context must come as input_ids (FastGen's token classes need them)")
        self._ids = ids

    def _release(self) -> None:
        if self._ctx is not None and not self._ctx.closed:
            for s in self._seqs:
                self._ctx.destroy(s)
        self._seqs = []

    def compress(self, module: torch.nn.Module, hidden_states: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, attentions: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        ctx = self._ctx
        if ctx is None or not self._modules:
            raise ValueError("FastGenPress: apply it as `with press(model):` (or through kvpress' pipeline); inside "
                             "another press (ComposedPress, ChunkPress, PerLayerCompressionPress...) it never "
                             "sees the model's layers and token ids")
        layer = module.layer_idx
        B, _, n, _ = keys.shape
        if layer == 0:
            self._release()
            self.kept_share = None
            if self._ids is None or tuple(self._ids.shape) != (B, n):
                raise ValueError(f"FastGenPress: the context's token ids ({None if self._ids is None else tuple(self._ids.shape)}) "
                                 f"do not match the cache's {B} x {n} rows")
            ids = self._ids.to("cpu", torch.int32).numpy()
            self._seqs = [ctx.create(ids[b]) for b in range(B)]
        if len(self._seqs) != B:
            raise ValueError("FastGenPress: layers came out of order (layer 0 first, one prefill at a time)")
        cos, sin = kwargs["position_embeddings"]
        q = get_prerope_query_states(module, hidden_states)
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        out = torch.empty((n, q.shape[1], q.shape[3]), dtype=torch.float32)
        for b in range(B):
            ctx.prefill(self._seqs[b], layer, *(x[b].detach().transpose(0, 1).to("cpu", torch.float32).contiguous()
                                                 for x in (q, keys, values)), out=out)
        if layer == len(self._modules) - 1:
            self._set_masks(n, keys.device)
        return keys, values

    def _set_masks(self, n: int, device: torch.device) -> None:
        """After the last layer: each head's dropped rows become kvpress' mask, layer by layer."""
        ctx = self._ctx
        _, _, n_kv, _ = ctx.shape
        kept_rows = total = 0
        for layer, module in enumerate(self._modules):
            batch_idx, head_idx, seq_idx = [], [], []
            for b, seq in enumerate(self._seqs):
                for h in range(n_kv):
                    drop = np.ones(n, dtype=bool)
                    drop[ctx.positions(seq, layer, h)] = False
                    rows = np.nonzero(drop)[0]
                    kept_rows += n - len(rows)
                    total += n
                    batch_idx.append(np.full(len(rows), b))
                    head_idx.append(np.full(len(rows), h))
                    seq_idx.append(rows)
            module.masked_key_indices = tuple(torch.from_numpy(np.concatenate(x)).to(device, torch.long)
                                              for x in (batch_idx, head_idx, seq_idx))
        self.kept_share = kept_rows / total if total else None
        self._release()  # the decision is made: the engine's copy of the rows is freed
