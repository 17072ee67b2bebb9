"""AdaKV: one budget per layer spread over its heads by score (Feng et al. 2024, arXiv 2407.11550; kvpress
presses/adakv_press.py).

kvpress only masks the pruned keys (the cache keeps every token). Here the layer holds, per head, as many
slots as its fullest head keeps: the other heads fill theirs with their next best tokens, held but masked
(`KvlabLayer.readable`), so the bytes held are what the layer really holds, no more and no less."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Press, PressInput, ScoredByInner
from .snapkv import SnapKV


@dataclass
class AdaKV(ScoredByInner, Press):
    """Each head first keeps its `alpha_safeguard` share of n best; the rest of the layer's H x n slots go to
    the best remaining scores of any head."""

    inner: Press = field(default_factory=SnapKV)  # the scorer
    alpha_safeguard: float = 0.20  # share of each head's budget it keeps whatever the other heads score
    name = "adakv"
    variable = True

    def select(self, x: PressInput, scores: torch.Tensor, n: int):
        b, h, t = scores.shape
        safe = max(1, int(n * self.alpha_safeguard)) if self.alpha_safeguard > 0 else 0
        s = scores.clone()
        s.scatter_(-1, s.topk(safe, dim=-1).indices, torch.finfo(s.dtype).max)
        pruned = (-s).reshape(b, -1).topk(h * (t - n), dim=1).indices  # [B, H (T - n)] lowest over the layer
        keep = torch.ones(b, h * t, dtype=torch.bool, device=s.device)
        keep.scatter_(1, pruned, False)
        keep = keep.view(b, h, t)  # [B, Hkv, T] each head's kept tokens
        m = int(keep.sum(-1).max())  # slots the layer holds: its fullest head's count
        rank = torch.where(keep, torch.finfo(s.dtype).max, s)  # kept first, then the next best
        slots = rank.topk(m, dim=-1).indices.sort(dim=-1).values  # [B, Hkv, m]
        return slots, keep.gather(2, slots)

    def label(self) -> str:
        return f"adakv({self.inner.label()})"
