"""Every hybrid family against transformers' own cache: a tiny random model of the family runs a prefill and
decode steps on CPU, and every tensor its cache holds -- attention keys and values, convolution states, recurrent
states (MiniMax: its linear_cache) -- is counted and set against the family's 'storage' layout for the config
transformers saved (config.to_json_string(), read back through kvlab.models.spec_from_config).

The tiny configs keep each family's structure (a mix of attention and linear layers, several heads and groups,
the real conv kernel) and shrink widths so a forward takes well under a second; nothing is downloaded.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..checks import need_choice, need_int
from ..errors import ParameterError
from ..layout import build_layout

# transformers model_type -> the config kwargs of a tiny model of that family (transformers 5.24 field names)
TINY = {
    "qwen3_next": dict(hidden_size=64, intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                       num_experts=4, num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=100),
    "qwen3_5_text": dict(hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                         linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=100),
    "jamba": dict(hidden_size=64, intermediate_size=64, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
                  num_attention_heads=4, num_key_value_heads=2, mamba_d_state=8, mamba_dt_rank=8, num_experts=2,
                  vocab_size=100),
    "nemotron_h": dict(hidden_size=64, intermediate_size=64, layers_block_type=["linear_attention", "full_attention",
                                                                                "linear_attention", "mlp"],
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=8,
                       mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=8, vocab_size=100),
    "bamba": dict(hidden_size=64, intermediate_size=64, num_hidden_layers=4, attn_layer_indices=[1],
                  num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=4, mamba_d_head=32, mamba_d_state=8,
                  mamba_chunk_size=8, vocab_size=100),
    "granitemoehybrid": dict(hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                             layer_types=["mamba", "attention", "mamba", "attention"], num_attention_heads=4,
                             num_key_value_heads=2, mamba_n_heads=4, mamba_d_head=32, mamba_d_state=8,
                             mamba_chunk_size=8, num_local_experts=2, num_experts_per_tok=1, vocab_size=100),
    "falcon_h1": dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16,
                      mamba_d_state=8, mamba_chunk_size=8, vocab_size=100),
    "lfm2": dict(hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                 layer_types=["conv", "full_attention", "conv", "full_attention"], num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=100),
    "kimi_linear": dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, hidden_size=64, intermediate_size=64,
                        moe_intermediate_size=32, num_hidden_layers=4,
                        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                        mlp_layer_types=["dense"] * 4, num_attention_heads=4, num_key_value_heads=4,
                        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=32, linear_head_dim=16,
                        linear_num_heads=4, vocab_size=100, num_experts=4),
    "minimax": dict(hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, num_local_experts=2, vocab_size=100, block_size=8),
}


@dataclass(frozen=True)
class HybridCheck:
    """Bytes a transformers cache of a tiny hybrid model holds, against kvlab's layout of the same config."""

    model_type: str  # transformers model_type
    family: str  # kvlab family that laid it out
    tokens: int  # tokens seen (prefill + decode steps)
    tensors: list = field(default_factory=list)  # (layer, what, shape, dtype) of every tensor the cache holds
    hf_bytes: int = 0  # their numel x element size
    predicted_bytes: int = 0  # Layout.session(tokens).total ('storage')
    predicted_state_bytes: int = 0  # of which fixed-size state
    vllm_bytes: int = 0  # what vLLM's hybrid allocator takes for the same session (kvlab.engines)

    @property
    def exact(self) -> bool:
        return self.hf_bytes == self.predicted_bytes


def held_tensors(cache) -> list[tuple]:
    """(layer, what, shape, dtype, bytes) for every tensor a transformers cache holds."""
    import torch
    out = []
    for i, layer in enumerate(getattr(cache, "layers", [])):
        for what in ("keys", "values"):
            t = getattr(layer, what, None)
            if isinstance(t, torch.Tensor) and t.numel():
                out.append((i, what, tuple(t.shape), str(t.dtype), t.numel() * t.element_size()))
        for what in ("conv_states", "recurrent_states"):
            for k, t in (getattr(layer, what, None) or {}).items():
                if isinstance(t, torch.Tensor):
                    out.append((i, f"{what}[{k}]", tuple(t.shape), str(t.dtype), t.numel() * t.element_size()))
    for i, t in enumerate(getattr(cache, "linear_cache", []) or []):  # MiniMax keeps its linear states apart
        if isinstance(t, torch.Tensor):
            out.append((i, "linear_cache", tuple(t.shape), str(t.dtype), t.numel() * t.element_size()))
    return out


def hybrid_crosscheck(model_type: str, tokens: int = 9, decode: int = 2, seed: int = 0) -> HybridCheck:
    """Run a tiny `model_type` model over `tokens` tokens (a prefill, then `decode` one-token steps) and compare
    its cache with kvlab's 'storage' layout of the config transformers saved."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging
    from ..cache.crosscheck import run_tiny
    from ..engines import allocate
    from ..models import spec_from_config
    need_choice("model_type", model_type, TINY)
    tokens, decode = need_int("tokens", tokens, 1), need_int("decode", decode, 0)
    if decode >= tokens:
        raise ParameterError(f"hybrid cross-check needs 0 <= decode < tokens, got tokens={tokens}, decode={decode}")
    hf_logging.set_verbosity_error()
    config = AutoConfig.for_model(model_type, **TINY[model_type])
    cache = run_tiny(config, tokens, decode, seed)
    held = held_tensors(cache)
    cfg = json.loads(config.to_json_string())  # the config as saved (config.json)
    spec = spec_from_config(cfg, f"tiny-{model_type}", source="transformers config of the cross-check")
    layout = build_layout(spec, "storage")
    return HybridCheck(model_type, spec.family, tokens, [h[:4] for h in held], sum(h[4] for h in held),
                       layout.session(tokens).total, layout.state_bytes,
                       allocate(spec, engine="vllm").session(tokens).total)
