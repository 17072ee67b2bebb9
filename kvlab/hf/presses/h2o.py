"""H2O: keep the heavy hitters, the tokens with the most accumulated attention (Zhang et al. 2023, arXiv
2306.14048; at prefill kvpress's presses/observed_attention_press.py).

kvpress needs eager attention for it (the weights of every query); kvlab computes them itself, in float32 and
in chunks of queries, from the queries and keys the attention function receives."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Press, PressInput


@dataclass
class H2O(Press):
    """Score: the attention a token has received, divided by the queries that could see it, averaged over the
    KV head's query group. At prefill: over the context's queries (kvpress's ObservedAttention); as decode-time
    eviction the sums and counts accumulate over every forward (`observe`) and follow the kept slots."""

    name = "h2o"
    needs = ("queries",)
    decodes = True

    def _sums(self, x: PressInput) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention received, averaged over the query group; queries that could see the token): [B, Hkv, T]."""
        attn = x.group_mean(x.attention().sum(2))  # [B, Hkv, T]
        seen = (x.kpos[:, :, None, :] <= x.qpos[None, None, :, None]).sum(2).float()  # [B, Hkv, T]
        return attn, seen

    def observe(self, x: PressInput) -> None:
        """Add this forward's attention to the per-slot sums (decode-time eviction)."""
        for k, new in zip(("attention", "seen"), self._sums(x)):
            old = x.state.get(k)
            old = new[..., :0] if old is None else old
            x.state[k] = torch.nn.functional.pad(old, (0, new.shape[-1] - old.shape[-1])) + new  # [B, Hkv, T]

    def score(self, x: PressInput) -> torch.Tensor:
        att, seen = (x.state["attention"], x.state["seen"]) if "attention" in x.state else self._sums(x)
        return att / seen.clamp_min(1)  # [B, Hkv, T]
