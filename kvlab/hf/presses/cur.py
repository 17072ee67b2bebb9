"""CUR (CurDKV): keep the tokens of highest approximate leverage, keys' and values' squared norms taken within
local windows (Sengupta et al. 2025, "Value-guided KV compression for LLMs via approximated CUR decomposition",
arXiv 2509.15038; kvpress presses/cur_press.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...checks import need_choice, need_int
from .base import Press, PressInput

LEVERAGES = ("key", "value", "kv_avg", "kv_product")  # which leverage scores the token


@dataclass
class CUR(Press):
    """Leverage of a token: its key's (and value's) squared norm, as a share of its window of `window` tokens
    (0: of the whole context); `leverage` picks keys, values, their mean or their product (kvpress's default);
    scores are normalised per head and the first `sinks` tokens always kept. `projection` > 0 first projects keys
    and values on a seeded Gaussian matrix of that rank (the paper's random leverage; kvpress draws it unseeded)."""

    sinks: int = 4  # first tokens always kept (kvpress num_sinks)
    leverage: str = "kv_product"  # "key", "value", "kv_avg" or "kv_product" (kvpress leverage_type)
    window: int = 16  # tokens per local window (kvpress local_window_size); 0: no local approximation
    projection: int = 0  # rank of a seeded random projection before the norms (kvpress uses 20); 0: none
    seed: int = 0  # seed of that projection
    name = "cur"

    def __post_init__(self):
        need_int("cur sinks", self.sinks, 0)
        need_choice("cur leverage", self.leverage, LEVERAGES)
        need_int("cur window", self.window, 0)
        need_int("cur projection", self.projection, 0)
        need_int("cur seed", self.seed, 0)

    def _local(self, s: torch.Tensor) -> torch.Tensor:
        """[B, Hkv, T] squared norms -> each as a share of its window's sum (the last window may be short)."""
        if not self.window:
            return s
        b, h, t = s.shape
        w = self.window
        s = F.pad(s, (0, (w - t % w) % w)).reshape(b, h, -1, w)  # [B, Hkv, T / w, w]
        return (s / s.sum(dim=-1, keepdim=True)).reshape(b, h, -1)[:, :, :t]

    def score(self, x: PressInput) -> torch.Tensor:
        k, v = x.keys, x.values  # [B, Hkv, T, D], [B, Hkv, T, Dv]
        if self.projection:
            g = torch.Generator().manual_seed(self.seed)
            r = self.projection
            pk = torch.randn(k.shape[-1], r, generator=g, dtype=k.dtype) / r ** 0.5  # [D, r]
            pv = torch.randn(v.shape[-1], r, generator=g, dtype=v.dtype) / r ** 0.5  # [Dv, r]
            k, v = k @ pk.to(k.device), v @ pv.to(v.device)
        k2 = self._local((k ** 2).sum(dim=-1))  # [B, Hkv, T]
        v2 = self._local((v ** 2).sum(dim=-1))
        s = {"key": lambda: k2, "value": lambda: v2, "kv_avg": lambda: (k2 + v2) / 2,
             "kv_product": lambda: k2 * v2}[self.leverage]()
        s = s / s.sum(dim=-1, keepdim=True)
        s[:, :, :self.sinks] = 1.0
        return s
