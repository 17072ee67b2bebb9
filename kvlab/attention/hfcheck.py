"""Cross-check against HF transformers' DeepSeek V4 (5.24, models/deepseek_v4, plain torch, CPU).

A tiny DeepseekV4Config is built, HF's CSA / HCA attention modules get seeded random weights, and the same
weights are loaded into kvlab's `Compressor`, `index_scores` / `select_topk` and `sparse_attention`. Compared:
the compressed entries (stateless and streamed in chunks through HF's cache layer), the indexer's index keys
and top-k selection, and the attention module's output. transformers is a dev dependency (imported here only).
"""
from __future__ import annotations

import torch

from ..quant.metrics import rel_error
from .compress import Compressor
from .indexer import index_scores, select_topk, sparse_attention
from .rope import apply_rope, rms_norm

TINY = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=1, head_dim=16, partial_rotary_factor=0.5,
            q_lora_rank=16, o_groups=2, o_lora_rank=8, index_n_heads=2, index_head_dim=8, index_topk=3,
            sliding_window=8, compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            num_hidden_layers=2, layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
            vocab_size=64, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            rope_theta=10000.0, compress_rope_theta=160000.0)  # a V4-shaped config small enough for a unit test


def tiny_config(**over):
    from transformers import DeepseekV4Config
    cfg = DeepseekV4Config(**{**TINY, **over})
    cfg._attn_implementation = "eager"
    return cfg


def _init(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(module.named_parameters()):
        with torch.no_grad():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("sinks") or "position_bias" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def compressor_from_hf(m, rope_dim: int, theta: float, overlap: bool) -> Compressor:
    """kvlab's Compressor holding an HF compressor's weights (kv_proj, gate_proj, position_bias, kv_norm)."""
    return Compressor(m.compress_rate, m.head_dim, overlap, m.kv_proj.weight.detach().T.float(),
                      m.gate_proj.weight.detach().T.float(), m.position_bias.detach().float(),
                      m.kv_norm.weight.detach().float(), rope_dim, theta, m.kv_norm.variance_epsilon)


class _Cache:
    """The minimal cache object HF's compressors read (`.layers[layer_idx]`)."""

    def __init__(self, layer):
        self.layers = [layer]


def _kvlab_attention(attn, x: torch.Tensor, theta: float, rope_dim: int, window: int):
    """The attention module's forward rebuilt from kvlab pieces with HF's weights (cache-free prefill)."""
    b, s, _ = x.shape
    pos = torch.arange(s)  # [S]
    H, D = attn.num_heads, attn.head_dim
    eps = attn.kv_norm.variance_epsilon
    q_res = rms_norm(x @ attn.q_a_proj.weight.T, attn.q_a_norm.weight, eps)  # [B, S, q_lora_rank]
    q = rms_norm((q_res @ attn.q_b_proj.weight.T).view(b, s, H, D), None, eps).transpose(1, 2)  # [B, H, S, D]
    q = apply_rope(q, pos, rope_dim, theta)
    kv = apply_rope(rms_norm(x @ attn.kv_proj.weight.T, attn.kv_norm.weight, eps), pos, rope_dim, theta)  # [B, S, D]
    comp = attn.compressor
    csa = hasattr(comp, "indexer")
    ent = compressor_from_hf(comp, rope_dim, theta, csa)(x)  # [B, N, D]
    n = ent.shape[1]
    valid = ((torch.arange(n)[None] + 1) * comp.compress_rate <= pos[:, None] + 1)[None].expand(b, -1, -1)  # [B, S, N]
    if csa:
        ix = comp.indexer
        k_idx = compressor_from_hf(ix, rope_dim, theta, True)(x)  # [B, N, D_I]
        qi = apply_rope((q_res @ ix.q_b_proj.weight.T).view(b, s, ix.num_heads, ix.head_dim).transpose(1, 2),
                        pos, rope_dim, theta).transpose(1, 2)  # [B, S, H_I, D_I]
        sc = index_scores(qi, x @ ix.scorer.weights_proj.weight.T, k_idx)  # [B, S, N]
        idx = select_topk(sc, min(ix.index_topk, n), valid)  # [B, S, k]
    else:
        idx = torch.where(valid, torch.arange(n), -1)  # [B, S, N]
    kp = torch.arange(s)  # [S] key positions
    mask = (kp[None] <= pos[:, None]) & (kp[None] > pos[:, None] - window)  # [S, S] causal window
    o = sparse_attention(q, ent[:, None], ent[:, None], idx, attn.scaling, attn.sinks.detach(),
                         extra=(kv[:, None], kv[:, None], mask))  # [B, H, S, D]
    o = apply_rope(o, pos, rope_dim, theta, inverse=True).transpose(1, 2)  # [B, S, H, D]
    grouped = attn.o_a_proj(o.reshape(b, s, attn.config.o_groups, -1)).flatten(2)  # [B, S, groups * o_lora_rank]
    return attn.o_b_proj(grouped), ent, idx


@torch.no_grad()
def crosscheck(seed: int = 0, tokens: int = 24, chunks: tuple[int, ...] = (7, 10, 7)) -> dict[str, float]:
    """Relative errors (and top-k agreement) of kvlab against HF DeepSeek V4 on the same weights and input."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf

    cfg = tiny_config()
    theta, rope_dim = cfg.compress_rope_theta, cfg.qk_rope_head_dim
    x = torch.randn(1, tokens, cfg.hidden_size, generator=torch.Generator().manual_seed(seed + 100))
    pos = torch.arange(tokens)[None]  # [1, T]
    rot = hf.DeepseekV4RotaryEmbedding(cfg)
    pe = {t: rot(x, pos, layer_type=t) for t in ("main", "compress")}
    kp = torch.arange(tokens)  # [T]
    allowed = (kp[None] <= kp[:, None]) & (kp[None] > kp[:, None] - cfg.sliding_window)
    mask = torch.zeros(tokens, tokens).masked_fill(~allowed, float("-inf"))[None, None]  # [1, 1, T, T] additive
    out = {}
    for layer, name in enumerate(("csa", "hca")):
        attn = hf.DeepseekV4Attention(cfg, layer).eval()
        _init(attn, seed + layer)
        comp = attn.compressor
        csa = name == "csa"
        q_res = attn.q_a_norm(attn.q_a_proj(x))  # the indexer's query input
        ref_ent = comp(x, q_res, pos, None, layer)[0][:, 0]  # [B, N, D] stateless
        mine = compressor_from_hf(comp, rope_dim, theta, csa)
        out[f"{name}_entries"] = rel_error(ref_ent, mine(x))
        # streamed: HF's cache layer against kvlab's CompressorState, same chunks
        cache = _Cache(hf.DeepseekV4CSACache(cfg) if csa else hf.DeepseekV4HCACache(cfg))
        st, start, got = mine.state(), 0, []
        for c in chunks:
            xs = x[:, start:start + c]
            ref_stream = comp(xs, q_res[:, start:start + c], pos[:, start:start + c], cache, 0)[0][:, 0]
            got.append(st.append(xs))
            start += c
        out[f"{name}_entries_streamed"] = rel_error(ref_stream, torch.cat(got, 1))
        if csa:  # the selection: HF's indexer against kvlab's index_scores + select_topk
            ref_top = comp.indexer(x, q_res, pos, None, layer)  # [B, S, k], -1 where invalid
            my_top = _kvlab_attention(attn, x, theta, rope_dim, cfg.sliding_window)[2]
            agree = [set(a.tolist()) - {-1} == set(b.tolist()) - {-1} for a, b in zip(ref_top[0], my_top[0])]
            out["csa_topk_agreement"] = sum(agree) / len(agree)
        ref_out = attn(x, pe, pos, mask, None)[0]
        my_out = _kvlab_attention(attn, x, theta, rope_dim, cfg.sliding_window)[0]
        out[f"{name}_attention_output"] = rel_error(ref_out, my_out)
    return out
