"""MiniMax-Text-01 / M1: lightning (linear) attention layers beside softmax attention layers.

Layers: `layer_types` (transformers) or MiniMax's own `attn_type_list` (1 = softmax attention, 0 = lightning).
A lightning layer keeps one key-value state per head: num_attention_heads x head_dim x head_dim, in the model
dtype (transformers MiniMaxCache.linear_cache; vLLM linear_attention_state_shape / _dtype, the same shape split
over TP ranks); no convolution state.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..layout import Part
from ..models import cfg_int
from ..registry import register
from .base import head_dim_of
from .hybrid import HybridFamily, divide, listed_kinds


@dataclass(frozen=True)
class LightningDims:
    """One lightning-attention layer's state dimensions."""

    heads: int  # num_attention_heads
    head_dim: int  # head_dim (or hidden_size / heads)


@register
class MiniMax(HybridFamily):
    name = "minimax"
    description = "MiniMax-01 / M1: lightning linear attention + softmax attention"
    model_types = ("minimax", "minimax_text_01", "minimax_m1")
    state_source = "transformers MiniMaxCache.linear_cache [heads, d, d] in the model dtype; vLLM linear_attention_state_shape"
    sources = "MiniMax-Text-01 config.json; transformers models/minimax; vLLM mamba_utils.py"

    def kinds(self, c, n, name):
        kinds = listed_kinds(c, n, name)
        if kinds is not None:
            return kinds
        types = c.get("attn_type_list")
        if not isinstance(types, list) or len(types) < n or any(t not in (0, 1) for t in types[:n]):
            raise ConfigError(f"{name}: a MiniMax config needs 'layer_types' or 'attn_type_list' (one 0 = lightning "
                              f"or 1 = softmax per layer, {n} layers)")
        return tuple("attention" if t == 1 else "linear" for t in types[:n])

    def parse_linear(self, c, name, common):
        heads = cfg_int(c, "num_attention_heads", name)
        return LightningDims(heads, head_dim_of(c, name, heads, common["hidden_size"]))

    def state_parts(self, spec, scheme, tp):
        d: LightningDims = spec.linear
        heads = divide(spec.name, "lightning-attention heads", d.heads, tp)
        return [Part("kv_state", heads * d.head_dim * d.head_dim, self.state_format(spec, scheme, None, "torch_dtype"))]
