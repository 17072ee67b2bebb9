"""TOVA: keep the tokens the last query attends to most, averaged over all heads (Oren et al. 2024, "Transformers
are Multi-State RNNs", arXiv 2401.06104; kvpress presses/tova_press.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Press, PressInput, pad_max


@dataclass
class TOVA(Press):
    """Score: the newest query's softmax attention, averaged over every query head (one set per layer); the
    newest token is kept. As decode-time eviction it runs after every forward (the paper's rule)."""

    name = "tova"
    needs = ("queries",)
    decodes = True

    def score(self, x: PressInput) -> torch.Tensor:
        attn = x.attention(1)[:, :, 0, :-1]  # [B, H, T - 1]
        s = attn.mean(1, keepdim=True).expand(-1, x.keys.shape[1], -1)  # [B, Hkv, T - 1]
        return pad_max(s, back=1)  # [B, Hkv, T]
