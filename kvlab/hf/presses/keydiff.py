"""KeyDiff: keep the keys least similar to the mean key direction (Park et al. 2025, arXiv 2504.15364; kvpress
presses/keydiff_press.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import Press, PressInput


@dataclass
class KeyDiff(Press):
    """Score -cos(k, anchor), the anchor the mean of the normalised keys of the head."""

    name = "keydiff"

    def score(self, x: PressInput) -> torch.Tensor:
        anchor = F.normalize(x.keys, p=2, dim=-1).mean(dim=2, keepdim=True)  # [B, Hkv, 1, D]
        return -F.cosine_similarity(x.keys, anchor, dim=-1)  # [B, Hkv, T]
