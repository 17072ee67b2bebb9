"""Kimi Linear (Moonshot): Kimi Delta Attention (KDA) linear layers beside MLA full-attention layers.

Layers: `layer_types`, or the checkpoint's `linear_attn_config` (`full_attn_layers` / `kda_layers`, 1-indexed, as
transformers' KimiLinearConfig reads them). A KDA layer keeps short-convolution states for q, k and v (3 x heads x
head_dim channels x short_conv_kernel_size columns in transformers, kernel - 1 in vLLM; model dtype) and a
recurrent state heads x head_dim x head_dim in float32 (transformers casts it; vLLM kda_state_dtype). The full
layers are MLA: the latent (kv_lora_rank) and the RoPE key per token, replicated over TP (the mla family's rule).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..layout import Part
from ..models import cfg_int
from ..registry import register
from .base import Family
from .hybrid import STATE_SPLIT, HybridFamily, conv_part, divide, hybrid_vllm_engine, listed_kinds
from .mla import Mla, vllm_mla_engine


@dataclass(frozen=True)
class KdaDims:
    """One KDA layer's state dimensions."""

    heads: int  # linear_num_heads (linear_attn_config num_heads)
    head_dim: int  # linear_head_dim (linear_attn_config head_dim)
    conv_kernel: int  # linear_conv_kernel_dim (linear_attn_config short_conv_kernel_size)


@register
class KimiLinear(HybridFamily):
    name = "kimi_linear"
    description = "Kimi Linear: KDA linear attention + MLA full attention"
    model_types = ("kimi_linear",)
    splits = {"latent": Mla.splits["latent"], "state": STATE_SPLIT}
    state_source = "transformers kimi_linear: conv model dtype, recurrent float32; vLLM kda_state_shape / _dtype"
    sources = "moonshotai Kimi-Linear config.json; transformers models/kimi_linear; vLLM mamba_utils.py"

    def kinds(self, c, n, name):
        kinds = listed_kinds(c, n, name)
        if kinds is not None:
            return kinds
        lac = c.get("linear_attn_config") or {}
        full, kda = lac.get("full_attn_layers"), lac.get("kda_layers")
        if not isinstance(full, list) or not isinstance(kda, list):
            raise ConfigError(f"{name}: a Kimi Linear config needs 'layer_types' or linear_attn_config's "
                              "'full_attn_layers' and 'kda_layers'")
        out = [None] * n
        for ids, kind in ((full, "attention"), (kda, "linear")):
            for i in ids:
                if not isinstance(i, int) or not 1 <= i <= n:
                    raise ConfigError(f"{name}: linear_attn_config names layer {i!r}; layers are numbered 1-{n}")
                out[i - 1] = kind
        if None in out:
            raise ConfigError(f"{name}: linear_attn_config leaves layer {out.index(None) + 1} without a type")
        return tuple(out)

    def parse(self, c, name, common):
        from dataclasses import replace
        spec = super().parse(c, name, common)
        return replace(spec, num_kv_heads=1, kv_lora_rank=cfg_int(c, "kv_lora_rank", name),
                       qk_rope_head_dim=cfg_int(c, "qk_rope_head_dim", name),
                       head_dim=cfg_int(c, "kv_lora_rank", name) + cfg_int(c, "qk_rope_head_dim", name))

    def parse_linear(self, c, name, common):
        lac = c.get("linear_attn_config") or {}
        if not isinstance(lac, dict):
            raise ConfigError(f"{name}: 'linear_attn_config' must be a JSON object, got {type(lac).__name__}")

        def pick(key: str, checkpoint_key: str, default=None) -> int:  # transformers' name, else the checkpoint's
            if c.get(key) is not None:
                return cfg_int(c, key, name)
            return cfg_int(lac, checkpoint_key, f"{name}: linear_attn_config", default=default)
        return KdaDims(pick("linear_num_heads", "num_heads"), pick("linear_head_dim", "head_dim"),
                       pick("linear_conv_kernel_dim", "short_conv_kernel_size", 4))

    recipes = Mla.recipes

    def check_shard(self, spec, shard):
        Family.check_shard(self, spec, shard)  # the latent is replicated: DCP <= TP

    def attention(self, spec, scheme, fmts, shard, index):
        return Mla.layer(self, spec, scheme, fmts, shard, index)

    def state_parts(self, spec, scheme, tp):
        d: KdaDims = spec.linear
        heads = divide(spec.name, "KDA heads", d.heads, tp)
        model = self.state_format(spec, scheme, None, "torch_dtype")
        return [conv_part(3 * heads * d.head_dim, d.conv_kernel, scheme, model),
                Part("recurrent", heads * d.head_dim * d.head_dim, self.state_format(spec, scheme, "float32",
                                                                                     "recurrent state"))]

    def engine(self, layout, name, page_size=None, prefix_caching=True):
        if name != "vllm":
            return Family.engine(self, layout, name, page_size)
        return hybrid_vllm_engine(layout, vllm_mla_engine(layout).block_tokens, mla=True)
