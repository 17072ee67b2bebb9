"""ChunkKV: keep whole chunks of consecutive tokens, scored by an inner press (Liu et al. 2025, arXiv
2502.00299; kvpress presses/chunkkv_press.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Press, PressInput, ScoredByInner
from .snapkv import SnapKV


@dataclass
class ChunkKV(ScoredByInner, Press):
    """Chunks of `chunk_length` tokens (a shorter last one) scored by the inner press's scores summed over
    KV heads and averaged over the chunk; the best max(1, int(chunks x keep)) chunks are kept, the same for
    every head. The kept count is whole chunks (the last may be short), so the layer reports it."""

    inner: Press = field(default_factory=SnapKV)  # the scorer
    chunk_length: int = 20  # tokens per chunk
    name = "chunkkv"
    variable = True

    def select(self, x: PressInput, scores: torch.Tensor, n: int):
        b, h, t = scores.shape
        c = self.chunk_length
        full, rest = t // c, t % c
        if full == 0:
            return super().select(x, scores, n)
        s = scores.sum(dim=1)  # [B, T]
        chunk = s[:, :full * c].view(b, full, c).mean(-1)  # [B, full]
        if rest:
            chunk = torch.cat([chunk, s[:, full * c:].mean(-1, keepdim=True)], dim=-1)
        kept = max(1, int((full + (rest > 0)) * x.keep))
        top = chunk[0].topk(kept).indices  # kvpress keeps the first sequence's chunks for the whole batch
        idx = torch.cat([torch.arange(i * c, min((i + 1) * c, t), device=s.device) for i in top.tolist()]).sort()
        return idx.values.expand(b, h, -1).contiguous(), None

    def label(self) -> str:
        return f"chunkkv({self.inner.label()})"
