"""Dense attention: the reference every mechanism is measured against (MHA, GQA, MQA).

Queries may be fewer than keys (decode): query i sits at position T - S + i, so `causal`
lets it see keys 0 .. T - S + i. A per-head sink logit (gpt-oss / DeepSeek V4) joins the softmax
and takes probability mass without contributing a value.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..checks import need_int, need_type
from .checks import (AttentionShapeError, SelectionError, need_dims, need_mask, need_scale, need_sinks, no_empty_rows,
                     same)


def _check(q, k, v):
    need_dims("q", q, 4, "[B, H, S, D]")
    need_dims("k", k, 4, "[B, Hkv, T, D]")
    need_dims("v", v, 4, "[B, Hkv, T, Dv]")
    same("q head_dim", q.shape[-1], "k head_dim", k.shape[-1])
    same("k length", k.shape[2], "v length", v.shape[2])
    same("k heads", k.shape[1], "v heads", v.shape[1])
    same("q batch", q.shape[0], "k batch", k.shape[0])
    same("k batch", k.shape[0], "v batch", v.shape[0])
    if q.shape[1] % k.shape[1]:
        raise AttentionShapeError(f"q heads = {q.shape[1]} is not a multiple of kv heads = {k.shape[1]}")


def _check_extras(q, k, mask, sinks, scale, rows: bool = True):
    """The mask broadcasts to the scores [B, H, S, T] and (with `rows`) leaves every query a key unless a sink
    takes the mass; sinks are [H]; scale is finite and positive."""
    need_scale(scale)
    if sinks is not None:
        need_sinks(sinks, q.shape[1])
    if mask is not None:
        shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        need_mask("mask", mask, shape, "[S, T] or [B, H, S, T]", "True = may attend (a float mask would be added to "
                  "the logits, torch's other convention)")
        if rows and sinks is None:
            no_empty_rows("mask", mask.expand(shape))


def causal_mask(s: int, t: int, window: int | None = None, sink_tokens: int = 0) -> torch.Tensor:
    """Boolean [S, T]: query i (at position t - s + i) may see key j; with `window`, only its last
    `window` keys plus the first `sink_tokens` keys (StreamingLLM). Needs s <= t: a query before the
    first key would see nothing."""
    s, t = need_int("s (queries)", s, 0), need_int("t (keys)", t, 0)
    if s > t:
        raise SelectionError(f"causal attention with {s} queries over {t} keys: query i sits at position "
                             f"t - s + i, so the first {s - t} would see no key; give at least as many keys as "
                             "queries (or causal=False)")
    if window is not None:
        window = need_int("window", window, 1, error=SelectionError)
    sink_tokens = need_int("sink_tokens", sink_tokens, 0, error=SelectionError)
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
    _check_extras(q, k, mask, None, scale, rows=False)
    return _logits(q, k, scale, mask)


def _logits(q, k, scale, mask) -> torch.Tensor:
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    s = torch.matmul(q.float(), expand_kv(k, q.shape[1]).float().transpose(-1, -2)) * scale  # [B, H, S, T]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return s


def attention_probs(q, k, scale=None, mask=None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention distribution [B, H, S, T] (a sink's share is dropped, so rows may sum below 1)."""
    _check(q, k, k)
    _check_extras(q, k, mask, sinks, scale)
    return _probs(q, k, scale, mask, sinks)


def _probs(q, k, scale, mask, sinks) -> torch.Tensor:
    s = _logits(q, k, scale, mask)  # [B, H, S, T]
    if sinks is None:
        return torch.softmax(s, dim=-1)
    sk = sinks.float().view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)  # [B, H, S, 1]
    return torch.softmax(torch.cat([s, sk], dim=-1), dim=-1)[..., :-1]  # [B, H, S, T + 1] -> [B, H, S, T]


def dense_attention(q, k, v, causal: bool = False, scale: float | None = None, mask: torch.Tensor | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Output [B, H, S, Dv]. Uses torch's scaled_dot_product_attention unless a sink logit is given. `causal`
    and `mask` are alternatives (as in torch's scaled_dot_product_attention): pass one."""
    _check(q, k, v)
    need_type("causal", causal, bool, "True or False")
    if causal and mask is not None:
        raise SelectionError("dense_attention: pass causal=True or a mask, not both (fold the causal rule into "
                             "the mask with causal_mask(S, T) & mask)")
    if causal:
        mask = causal_mask(q.shape[2], k.shape[2])
    _check_extras(q, k, mask, sinks, scale)
    if sinks is None:
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1])
    p = _probs(q, k, scale, mask, sinks)  # [B, H, S, T]
    return torch.matmul(p, expand_kv(v, q.shape[1]).float())  # [B, H, S, Dv]
