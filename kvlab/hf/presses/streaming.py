"""StreamingLLM: attention sinks plus the most recent tokens (Xiao et al. 2023, arXiv 2309.17453; kvpress
presses/streaming_llm_press.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import ParameterError
from .base import Press, PressInput


@dataclass
class StreamingLLM(Press):
    """The first `n_sink` tokens score highest, then recency: a budget of n keeps the sinks and the last n - n_sink
    (kvpress's set); as decode-time eviction the same rule runs after every forward."""

    n_sink: int = 4  # attention-sink tokens always kept
    name = "streaming_llm"
    decodes = True

    def check(self, t: int) -> None:
        if t <= self.n_sink:
            raise ParameterError(f"streaming_llm needs a context longer than its {self.n_sink} sink tokens, got {t}")

    def score(self, x: PressInput) -> torch.Tensor:
        pos = x.kpos.double()  # [B, Hkv, T]
        return torch.where(x.kpos < self.n_sink, 2.0 ** 53 - pos, pos)  # sinks first, then the newest
