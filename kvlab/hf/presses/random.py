"""A seeded random baseline (kvpress presses/random_press.py): what any scorer must beat."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Press, PressInput


@dataclass
class Random(Press):
    """Uniform scores from a generator seeded with `seed` at every call (so each layer draws the same)."""

    seed: int = 0  # the generator's seed
    name = "random"

    def score(self, x: PressInput) -> torch.Tensor:
        g = torch.Generator(device=x.keys.device).manual_seed(self.seed)
        return torch.rand(*x.keys.shape[:-1], generator=g, device=x.keys.device)  # [B, Hkv, T]
