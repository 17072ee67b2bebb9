"""SnapKV: the attention the last window of the context pays each earlier token, pooled (Li et al. 2024, arXiv
2404.14469; kvpress presses/snapkv_press.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...errors import ParameterError
from .base import Press, PressInput, pad_max


@dataclass
class SnapKV(Press):
    """Softmax attention of the last `window_size` queries, averaged over them, avg-pooled over `kernel_size`
    tokens, averaged over each KV head's query group; the window itself is always kept."""

    window_size: int = 64  # observation window: the context's last queries
    kernel_size: int = 5  # pooling width over tokens
    name = "snapkv"
    needs = ("queries",)

    def check(self, t: int) -> None:
        if t <= self.window_size:
            raise ParameterError(f"snapkv needs a context longer than its window ({self.window_size} tokens), got "
                                 f"{t}")

    def score(self, x: PressInput) -> torch.Tensor:
        w = self.window_size
        attn = x.attention(w)[..., :-w]  # [B, H, w, T - w]
        s = attn.mean(dim=-2)  # [B, H, T - w]
        s = F.avg_pool1d(s, kernel_size=self.kernel_size, padding=self.kernel_size // 2, stride=1)
        return pad_max(x.group_mean(s), back=w)  # [B, Hkv, T]
