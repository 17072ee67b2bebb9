"""Dense attention: the reference every mechanism is measured against (MHA, GQA, MQA).

Queries may be fewer than keys (decode): query i sits at position T - S + i, so `causal`
lets it see keys 0 .. T - S + i. A per-head sink logit (gpt-oss / DeepSeek V4) joins the softmax
and takes probability mass without contributing a value.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .checks import AttentionShapeError, need_dims, same


def _check(q, k, v):
    need_dims("q", q, 4, "[B, H, S, D]")
    need_dims("k", k, 4, "[B, Hkv, T, D]")
    need_dims("v", v, 4, "[B, Hkv, T, Dv]")
    same("q head_dim", q.shape[-1], "k head_dim", k.shape[-1])
    same("k length", k.shape[2], "v length", v.shape[2])
    same("k heads", k.shape[1], "v heads", v.shape[1])
    same("q batch", q.shape[0], "k batch", k.shape[0])
    if q.shape[1] % k.shape[1]:
        raise AttentionShapeError(f"q heads = {q.shape[1]} is not a multiple of kv heads = {k.shape[1]}")


def causal_mask(s: int, t: int, window: int | None = None, sink_tokens: int = 0) -> torch.Tensor:
    """Boolean [S, T]: query i (at position t - s + i) may see key j; with `window`, only its last
    `window` keys plus the first `sink_tokens` keys (StreamingLLM)."""
    qpos = torch.arange(t - s, t)[:, None]  # [S, 1]
    kpos = torch.arange(t)[None, :]  # [1, T]
    ok = kpos <= qpos
    if window is not None:
        ok &= (kpos > qpos - window) | (kpos < sink_tokens)
    return ok


def expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, Hkv, T, D] -> [B, H, T, D] (each KV head shared by H / Hkv query heads)."""
    return x.repeat_interleave(heads // x.shape[1], dim=1) if x.shape[1] != heads else x


def attention_logits(q, k, scale: float | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled scores [B, H, S, T], -inf where mask is False."""
    _check(q, k, k)
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    s = torch.matmul(q.float(), expand_kv(k, q.shape[1]).float().transpose(-1, -2)) * scale  # [B, H, S, T]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return s


def attention_probs(q, k, scale=None, mask=None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention distribution [B, H, S, T] (a sink's share is dropped, so rows may sum below 1)."""
    s = attention_logits(q, k, scale, mask)
    if sinks is None:
        return torch.softmax(s, dim=-1)
    sk = sinks.float().view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)  # [B, H, S, 1]
    return torch.softmax(torch.cat([s, sk], dim=-1), dim=-1)[..., :-1]  # [B, H, S, T + 1] -> [B, H, S, T]


def dense_attention(q, k, v, causal: bool = False, scale: float | None = None, mask: torch.Tensor | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Output [B, H, S, Dv]. Uses torch's scaled_dot_product_attention unless a sink logit is given."""
    _check(q, k, v)
    if mask is None and causal:
        mask = causal_mask(q.shape[2], k.shape[2])
    if sinks is None:
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1])
    p = attention_probs(q, k, scale, mask, sinks)  # [B, H, S, T]
    return torch.matmul(p, expand_kv(v, q.shape[1]).float())  # [B, H, S, Dv]
