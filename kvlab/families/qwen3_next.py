"""Qwen3-Next and Qwen3.5: Gated DeltaNet linear attention beside gated full attention.

Layers: `layer_types` (linear_attention / full_attention), or `full_attention_interval` (every n-th layer full
attention; 4 by default, as transformers' Qwen3NextConfig reads it). A Gated DeltaNet layer keeps
  conv state  (2 x linear_num_key_heads x linear_key_head_dim + linear_num_value_heads x linear_value_head_dim)
              channels x linear_conv_kernel_dim columns (transformers; vLLM kernel - 1), model dtype
  recurrent   linear_num_value_heads x linear_key_head_dim x linear_value_head_dim, float32 in transformers
              (its chunked / recurrent gated-delta-rule kernels keep the state in float32); in vLLM the
              mamba_ssm_cache_dtype (Qwen3.5 configs name it `mamba_ssm_dtype`), the model dtype by default
              (vllm/model_executor/layers/mamba/mamba_utils.py gated_delta_net_state_shape / _dtype)
"""
from __future__ import annotations

from dataclasses import dataclass

from ..layout import Part
from ..models import cfg_int
from ..registry import register
from .hybrid import HybridFamily, conv_part, divide, listed_kinds


@dataclass(frozen=True)
class GatedDeltaNetDims:
    """One Gated DeltaNet layer's state dimensions."""

    num_k_heads: int  # linear_num_key_heads (queries and keys)
    num_v_heads: int  # linear_num_value_heads
    head_k_dim: int  # linear_key_head_dim
    head_v_dim: int  # linear_value_head_dim
    conv_kernel: int  # linear_conv_kernel_dim
    vllm_ssm_dtype: str | None  # the config's mamba_ssm_dtype (vLLM's recurrent-state dtype), None: model dtype

    @property
    def conv_channels(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim


@register
class Qwen3Next(HybridFamily):
    name = "qwen3_next"
    description = "Qwen3-Next / Qwen3.5: Gated DeltaNet linear attention + gated full attention"
    model_types = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
    state_source = ("transformers qwen3_next: conv_states in the model dtype, recurrent_states float32; vLLM "
                    "gated_delta_net_state_shape")
    sources = "Qwen3-Next / Qwen3.5 config.json; transformers models/qwen3_next; vLLM mamba_utils.py"
    # vLLM on SM90 runs the GDN prefill with FlashInfer (layers/mamba/gdn/qwen_gdn_linear_attn.py
    # _resolve_gdn_prefill_backend), which exports checkpoints every FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64 tokens
    # (v1/attention/backends/gdn_attn.py) in 'align' mode: one checkpoint block per layer
    vllm_checkpoint_block = True
    vllm_checkpoint_alignment = 64

    def kinds(self, c, n, name):
        kinds = listed_kinds(c, n, name)
        if kinds is not None:
            return kinds
        every = cfg_int(c, "full_attention_interval", name, default=4)
        return tuple("linear" if (i + 1) % every else "attention" for i in range(n))

    def parse_linear(self, c, name, common):
        ssm = c.get("mamba_ssm_dtype")
        return GatedDeltaNetDims(cfg_int(c, "linear_num_key_heads", name), cfg_int(c, "linear_num_value_heads", name),
                                 cfg_int(c, "linear_key_head_dim", name), cfg_int(c, "linear_value_head_dim", name),
                                 cfg_int(c, "linear_conv_kernel_dim", name, default=4),
                                 ssm if isinstance(ssm, str) else None)

    def state_parts(self, spec, scheme, tp):
        d: GatedDeltaNetDims = spec.linear
        divide(spec.name, "linear key heads", d.num_k_heads, tp)
        nv = divide(spec.name, "linear value heads", d.num_v_heads, tp)
        model = self.state_format(spec, scheme, None, "torch_dtype")
        ssm = self.state_format(spec, scheme, "float32" if scheme == "storage" else d.vllm_ssm_dtype,
                                "mamba_ssm_dtype")
        return [conv_part(d.conv_channels // tp, d.conv_kernel, scheme, model),
                Part("recurrent", nv * d.head_k_dim * d.head_v_dim, ssm)]
