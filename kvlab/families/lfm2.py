"""LFM2 (Liquid AI): gated short-convolution layers beside GQA attention layers.

Layers: `layer_types` (conv / full_attention) or `full_attn_idxs`. A conv layer keeps only a convolution state:
hidden_size channels x conv_L_cache columns in transformers (its Lfm2ShortConv caches L_cache columns), kernel
- 1 = conv_L_cache - 1 in vLLM (mamba_utils.py short_conv_state_shape), in the model dtype; no recurrent state.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..models import cfg_int, cfg_int_list
from ..registry import register
from .hybrid import HybridFamily, conv_part, divide, listed_kinds


@dataclass(frozen=True)
class ShortConvDims:
    """One short-convolution layer's state dimensions."""

    channels: int  # hidden_size
    kernel: int  # conv_L_cache


@register
class Lfm2(HybridFamily):
    name = "lfm2"
    description = "LFM2: gated short-convolution layers + GQA attention"
    model_types = ("lfm2", "lfm2_moe")
    state_source = "transformers lfm2: conv_states of conv_L_cache columns, model dtype; vLLM short_conv_state_shape"
    sources = "LiquidAI LFM2 config.json; transformers models/lfm2; vLLM mamba_utils.py"

    def kinds(self, c, n, name):
        kinds = listed_kinds(c, n, name)
        if kinds is not None:
            return kinds
        full = set(cfg_int_list(c, "full_attn_idxs", name)) if c.get("full_attn_idxs") is not None else set(range(n))
        return tuple("attention" if i in full else "linear" for i in range(n))

    def parse_linear(self, c, name, common):
        return ShortConvDims(cfg_int(c, "hidden_size", name), cfg_int(c, "conv_L_cache", name, default=3))

    def state_parts(self, spec, scheme, tp):
        d: ShortConvDims = spec.linear
        rows = divide(spec.name, "conv channels", d.channels, tp)
        return [conv_part(rows, d.kernel, scheme, self.state_format(spec, scheme, None, "torch_dtype"))]
