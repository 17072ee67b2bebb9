"""Scaled dot-product attention as kvlab's attention paths run it (mechanisms, presses), with the one model option
torch's SDPA lacks: logit soft-capping (Gemma 2's `attn_logit_softcapping`: scores become cap * tanh(scores / cap)
before the mask and the softmax, as transformers' Gemma 2 eager attention computes them)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention.dense import causal_mask, expand_kv


def attend(query, key, value, mask, scale: float, softcap: float | None = None) -> torch.Tensor:
    """query [B, H, S, D], key / value [B, Hkv, T, D] (Hkv divides H); mask [B, 1 or H, S, T] (bool: True
    attends; float: added to the scores) or None (causal, the S queries being the last S of the T positions).
    Returns [B, H, S, Dv]."""
    h = query.shape[1]
    if mask is None:
        mask = causal_mask(query.shape[2], key.shape[2]).to(query.device)[None, None]  # [1, 1, S, T]
    if not softcap:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
                                              enable_gqa=key.shape[1] != h)
    key, value = expand_kv(key, h), expand_kv(value, h)  # [B, H, T, D]
    scores = torch.matmul(query, key.transpose(2, 3)) * scale  # [B, H, S, T]
    scores = torch.tanh(scores / softcap) * softcap
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value)  # [B, H, S, Dv]
