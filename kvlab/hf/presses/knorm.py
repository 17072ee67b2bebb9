"""KNorm: keep the keys of smallest L2 norm (Devoto et al. 2024, "A simple and effective L2 norm-based strategy for
KV cache compression", arXiv 2406.11430; kvpress presses/knorm_press.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Press, PressInput


@dataclass
class KNorm(Press):
    """Score -||k|| of each cached key (after the model's k_norm and RoPE, as the cache holds it)."""

    name = "knorm"

    def score(self, x: PressInput) -> torch.Tensor:
        return -torch.linalg.vector_norm(x.keys, dim=-1)  # [B, Hkv, T]
