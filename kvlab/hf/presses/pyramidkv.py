"""PyramidKV: SnapKV's scores with per-layer budgets, more tokens in lower layers (Cai et al. 2024, arXiv
2406.02069; kvpress presses/pyramidkv_press.py)."""
from __future__ import annotations

from dataclasses import dataclass

from .snapkv import SnapKV


@dataclass
class PyramidKV(SnapKV):
    """Layer l of L keeps round(max - l (max - min) / (L - 1)) tokens, an arithmetic series whose mean is the
    budget t keep: min = t keep / beta, max = 2 t keep - min (max capped at t - w, min raised to keep the mean);
    unless window <= min <= max <= t, every layer keeps round(t keep), as kvpress does."""

    beta: int = 20  # how steep the pyramid is
    name = "pyramidkv"

    def layer_budget(self, layer: int, layers: int, t: int, n: int, keep: float) -> int:
        w = self.window_size
        cap = w + t * keep
        lo = (cap - w) / self.beta
        hi = (cap - w) * 2 - lo
        if hi >= t - w:
            hi = t - w
            lo = (cap - w) * 2 - hi
        if not (t >= hi >= lo >= w):
            return max(1, round(t * keep))
        steps = (hi - lo) / (layers - 1) if layers > 1 else 0.0
        return round(hi - layer * steps)
