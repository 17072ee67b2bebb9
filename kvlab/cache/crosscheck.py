"""Cross-check the byte math against a real implementation: Hugging Face transformers' caches.

A tiny model is built from a catalog config (few layers and a small hidden size, but the real
KV-head count and head dimensions; random weights, nothing downloaded), run over T tokens with
use_cache=True, and the tensors its cache holds are counted. kvlab's layout, derived from that
same config through `kvlab.models.spec_from_config`, must predict those bytes exactly.

What transformers 5.24 caches (read from transformers/models/*/modeling_*.py and cache_utils.py):
  qwen3        DynamicCache: per layer K and V as [B, kv_heads, T, head_dim] in the model dtype, grown by
               torch.cat each step. vLLM pages the same K/V bytes in 16-token blocks.
  deepseek_v3  DynamicCache: per layer the MLA latent after kv_a_layernorm as `keys` [B, 1, T, kv_lora_rank]
               and the RoPE key as `values` [B, 1, T, qk_rope_head_dim], in the model dtype. Per-head K/V are
               expanded from the latent at every forward (expand_kv) and not kept. vLLM / SGLang cache the
               same 576-element latent + RoPE entry (BF16: 1,152 B; DeepSeek's FP8 fp8_ds_mla: 656 B) in
               64-token pages.
  deepseek_v4  (not run here) DeepseekV4HCACache / CSACache: the sliding-window K=V as a view of the last
               sliding_window - 1 tokens, compressed entries only for closed windows (floor(T/m), not a
               partly filled slot), buffer_kv / buffer_gate of the pending tokens, and for CSA the previous
               window's overlap slice, all in the model dtype; serving engines store V4's packed FP8/FP4
               entries (584 B / 288 B / 68 B) in 256-token pages.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from ..checks import need_int
from ..engines import allocate
from ..errors import ParameterError
from ..layout import build_layout, check_tokens
from .memory import storage_bytes
from ..models import read_config, spec_from_config

# Small sizes that leave the cached dimensions alone (they only shrink weights and MLPs).
TINY = {
    "qwen3": dict(hidden_size=256, intermediate_size=512, vocab_size=1000),
    "deepseek_v3": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=64, n_routed_experts=8,
                        num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=64,
                        vocab_size=1000),
}
WHAT_IS_CACHED = {
    "qwen3": ("K and V per KV head, [B, kv_heads, T, head_dim], model dtype",
              "the same K/V bytes, paged in 16-token blocks (vLLM)"),
    "deepseek_v3": ("MLA latent [B, 1, T, kv_lora_rank] as keys + RoPE key [B, 1, T, qk_rope_head_dim] as values, "
                    "model dtype; per-head K/V expanded per forward, not kept",
                    "the same latent + RoPE entry (BF16 1,152 B, or FP8 fp8_ds_mla 656 B), 64-token pages"),
}


@dataclass(frozen=True)
class CrossCheck:
    """Bytes a transformers cache holds after a forward, against kvlab's prediction."""

    model: str  # catalog config the tiny model was built from
    model_type: str  # transformers model_type
    layers: int  # decoder layers of the tiny model
    tokens: int  # tokens in the forward
    shapes: list = field(default_factory=list)  # per layer: (keys shape, values shape)
    hf_bytes: int = 0  # sum of keys/values numel x element size
    hf_storage_bytes: int = 0  # storage bytes behind them (deduplicated by data pointer)
    predicted_bytes: int = 0  # kvlab Layout.session(T).total for the same config
    engine_bytes: int = 0  # what vLLM's paging allocates for the same tokens (kvlab.engines)
    hf_caches: str = ""  # what transformers keeps
    engines_cache: str = ""  # what serving engines keep

    @property
    def exact(self) -> bool:
        return self.hf_bytes == self.hf_storage_bytes == self.predicted_bytes


def tiny_config(model: str, num_layers: int = 2):
    """A transformers config from a catalog entry, shrunk to `num_layers` layers and small weights."""
    from transformers import AutoConfig
    name, cfg = read_config(model)
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    mt = cfg.get("model_type")
    if mt not in TINY:
        raise ParameterError(f"cross-check supports model types {', '.join(TINY)}; {model} is {mt!r}")
    cfg.update(num_hidden_layers=num_layers, **TINY[mt])
    cfg.pop("bos_token_id", None)
    cfg.pop("eos_token_id", None)
    return name, AutoConfig.for_model(**cfg)


def crosscheck(model: str = "qwen3-8b", tokens: int = 16, num_layers: int = 2, seed: int = 0,
               decode: int = 0) -> CrossCheck:
    """Run a tiny transformers model over `tokens` tokens (a prefill, then `decode` one-token steps)
    and compare its cache with kvlab's layout."""
    from transformers import AutoModelForCausalLM
    tokens = check_tokens(tokens)
    decode = need_int("decode", decode, 0)
    if tokens < 1 or decode >= tokens:
        raise ParameterError(f"cross-check needs 0 <= decode < tokens, got tokens={tokens}, decode={decode}")
    name, config = tiny_config(model, num_layers)
    torch.manual_seed(seed)
    net = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (1, tokens), generator=g)  # [B=1, T]
    prefill = tokens - decode
    with torch.no_grad():
        out = net(ids[:, :prefill], use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        for t in range(prefill, tokens):  # one token at a time, as in generation
            out = net(ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = getattr(out, "cache", None) or out.past_key_values
    held = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    shapes = [(list(layer.keys.shape), list(layer.values.shape)) for layer in cache.layers]
    cfg = json.loads(config.to_json_string())  # the config as saved (config.json)
    spec = spec_from_config(cfg, f"{name}-tiny", source="transformers config of the cross-check")
    layout = build_layout(spec, "storage")
    mt = cfg["model_type"]
    return CrossCheck(name, mt, num_layers, tokens, shapes,
                      hf_bytes=sum(t.numel() * t.element_size() for t in held),
                      hf_storage_bytes=storage_bytes(held),
                      predicted_bytes=layout.session(tokens).total,
                      engine_bytes=allocate(spec, "vllm").session(tokens).total,
                      hf_caches=WHAT_IS_CACHED[mt][0], engines_cache=WHAT_IS_CACHED[mt][1])
