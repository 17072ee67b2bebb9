"""LagKV: score a chunk's tokens by how far they spread within the next chunk's min-max range (Liang et al.
2025, arXiv 2504.04704; kvpress presses/lagkv_press.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Press, PressInput


@dataclass
class LagKV(Press):
    """After `n_sink` sinks the context splits into chunks of `lag_size`; each token of a chunk is normalised by
    the next chunk's per-channel min and max, its score the softmax over the chunk of the channel std (keys and
    values averaged), ranked within the chunk; sinks and the last chunk (with any remainder) are kept."""

    n_sink: int = 4  # first tokens always kept
    lag_size: int = 128  # tokens per chunk
    name = "lagkv"

    def _chunk(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, H, c, L, D] -> [B, H, c - 1, L]: each chunk against the next one's range."""
        ref, v = x[:, :, 1:], x[:, :, :-1]
        lo, hi = ref.min(dim=-2, keepdim=True).values, ref.max(dim=-2, keepdim=True).values  # [B, H, c-1, 1, D]
        return ((v - lo) / (hi - lo)).std(dim=-1).softmax(dim=-1)

    def score(self, x: PressInput) -> torch.Tensor:
        b, h, t, d = x.keys.shape
        s, lag = self.n_sink, self.lag_size
        if t < s + 2 * lag:  # too short for two chunks: sinks, then recency
            out = torch.ones(b, h, t, device=x.keys.device)
            if t > s:
                out[:, :, s:] = torch.arange(t - s, device=x.keys.device) / (t - s)
            return out
        end = s + (t - s) // lag * lag
        k = x.keys[:, :, s:end].reshape(b, h, -1, lag, d)  # [B, Hkv, c, L, D]
        v = x.values[:, :, s:end].reshape(b, h, -1, lag, x.values.shape[-1])
        sc = (self._chunk(k) + self._chunk(v)) / 2  # [B, Hkv, c - 1, L]
        sc = sc.argsort(dim=-1).argsort(dim=-1) / lag  # rank within the chunk
        one = torch.ones(b, h, s, device=sc.device), torch.ones(b, h, lag + t - end, device=sc.device)
        return torch.cat([one[0], sc.reshape(b, h, -1).float(), one[1]], dim=-1)  # [B, Hkv, T]
