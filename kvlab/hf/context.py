"""A context prefilled once, then held many ways: the shared first step of the question-agnostic protocol.

kvpress's pipeline (kvpress 0.5.5, pipeline.py) prefills the context in one forward through a plain cache, and its
press compresses each layer after that layer's attention (presses/base_press.py, a forward hook): the forward itself
- every hidden state, every K/V and query a press scores - is the same whatever the press, and transformers'
QuantizedCache hands the same first forward its unquantized states. `prefill` runs that forward once, in the model's
own dtype, and keeps what each layer handed its cache (K and V, or an MLA latent and RoPE key) and, when presses need
them, each full-attention layer's queries after RoPE. `KvlabCache.load_context` then holds it as one setting does:
stored in its formats and, with a press, compressed once - so every format and press of a sample shares one prefill.
A mechanism (window, top-k, pooling) changes what the prefill's own attention reads: prefill with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import ParameterError
from .kernelset import math_attention_if_forced
from .presses.run import fitted_sdpa


@dataclass
class Context:
    """What one prefill of a context left: per layer, the states the model handed its cache."""

    ids: torch.Tensor  # [B, T] the context's token ids
    keys: list  # per layer [B, Hkv, T, D]: keys as the model handed them to the cache (MLA: the latent)
    values: list  # per layer [B, Hkv, T, Dv]: values (MLA: the RoPE key)
    queries: dict = field(default_factory=dict)  # full-attention layer -> [B, H, T, D] queries after RoPE
    scaling: dict = field(default_factory=dict)  # full-attention layer -> the attention's softmax scale
    mechanism: str = "dense"  # the mechanism the prefill's attention read through (kvlab.hf.mechanisms label)

    @property
    def tokens(self) -> int:
        return self.ids.shape[1]


class _Capture:
    """Stands in a full-attention layer's press slot during the prefill: its attention runs as SDPA would and keeps
    the queries it was given."""

    def __init__(self):
        self.forwards = 0  # forwards attended
        self.read = True  # False between the cache's update and the attention that consumes it
        self.query: torch.Tensor | None = None  # [B, H, T, D]
        self.scaling: float | None = None

    def done(self) -> bool:
        return self.forwards > 0

    def attend(self, module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
               **kwargs):
        self.read = True
        out = fitted_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        self.query = query.detach()
        self.scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
        self.forwards += 1
        return out


def prefill(model, ids: torch.Tensor, mechanism=None, queries: bool = True) -> Context:
    """One forward of `ids` [B, T] through a cache holding the model's own dtype (with `mechanism`, if given),
    keeping each layer's K/V and (queries=True, no mechanism) each full-attention layer's queries."""
    from .cache import make_cache
    from .mechanisms import use_kvlab_attention
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] < 1:
        raise ParameterError(f"prefill takes token ids [B, T] with T >= 1, got {getattr(ids, 'shape', ids)!r}")
    cache = make_cache(model, mechanism=mechanism)
    for layer in cache.layers:
        layer.seen = []
    captures = {}
    if queries and cache.mech.dense:
        use_kvlab_attention(model)
        for i, (layer, full) in enumerate(zip(cache.layers, cache.full)):
            if full:
                layer.press_run = captures[i] = _Capture()
    with torch.no_grad(), math_attention_if_forced():
        model(input_ids=ids.to(model.device), cache=cache, use_cache=True, logits_to_keep=1)
    keys, values = [], []
    for layer in cache.layers:
        if len(layer.seen) != 1:
            raise ParameterError(f"the prefill reached a layer {len(layer.seen)} times; one forward reaches each once")
        k, v = layer.seen[0]
        keys.append(k)
        values.append(v)
    return Context(ids, keys, values, {i: c.query for i, c in captures.items()},
                   {i: c.scaling for i, c in captures.items()}, cache.mech.label())
