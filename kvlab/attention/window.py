"""Sliding-window attention with attention sinks, and a window state that can be offloaded.

Each query sees its last `window` keys plus the first `sink_tokens` keys (StreamingLLM keeps 4).
`WindowState` holds the bounded window of a session; it can be moved to host memory, where it
lives for `ttl` seconds (DeepSeek V4.1 keeps 128-token SWA states in host RAM with a minute-level
TTL, per models.md). Fetching after the TTL is a miss: the state is gone and the caller must
replay (recompute) the last `window` tokens; the replayed tokens and their FLOPs are counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..checks import need_int, need_number
from .checks import SelectionError, need_dims
from .dense import causal_mask, dense_attention


def window_attention(q, k, v, window: int, sink_tokens: int = 0, scale: float | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention restricted to the last `window` keys (+ `sink_tokens` first keys): [B, H, S, Dv]."""
    window = need_int("window", window, 1, error=SelectionError)
    sink_tokens = need_int("sink_tokens", sink_tokens, 0, error=SelectionError)
    need_dims("q", q, 4, "[B, H, S, D]")
    need_dims("k", k, 4, "[B, Hkv, T, D]")
    return dense_attention(q, k, v, scale=scale, sinks=sinks,
                           mask=causal_mask(q.shape[2], k.shape[2], window, sink_tokens))


def window_positions(tokens: int, window: int, sink_tokens: int = 0) -> torch.Tensor:
    """Positions a decode query at position tokens-1 sees: sinks then the last `window` (ascending)."""
    window = need_int("window", window, 1, error=SelectionError)
    tokens = need_int("tokens", tokens, 0, error=SelectionError)
    sink_tokens = need_int("sink_tokens", sink_tokens, 0, error=SelectionError)
    lo = max(0, tokens - window)
    return torch.cat([torch.arange(min(sink_tokens, lo)), torch.arange(lo, tokens)])  # [sinks + W]


@dataclass
class ReplayStats:
    """What window misses cost a session."""

    fetches: int = 0  # fetches of an offloaded window
    misses: int = 0  # fetches after the TTL (state dropped)
    replayed_tokens: int = 0  # tokens recomputed to rebuild windows
    replay_flops: float = 0.0  # FLOPs spent recomputing them


@dataclass
class WindowState:
    """A session's bounded window state (any tensors), resident on the device or offloaded to host."""

    window: int  # tokens the state covers
    ttl: float  # seconds an offloaded state survives in host memory
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # the state (e.g. per-layer SWA buffers)
    where: str = "device"  # "device", "host" or "dropped"
    offloaded_at: float | None = None  # clock time of the last offload
    stats: ReplayStats = field(default_factory=ReplayStats)  # misses and replay cost

    def __post_init__(self):
        self.window = need_int("window", self.window, 1, error=SelectionError)
        self.ttl = need_number("ttl", self.ttl, 0.0, finite=False, error=SelectionError)  # inf: never expires

    def offload(self, now: float) -> None:
        """Move the state to host memory (pinned CPU tensors when a GPU holds them)."""
        self.tensors = {k: v.to("cpu") for k, v in self.tensors.items()}
        self.where, self.offloaded_at = "host", now

    def fetch(self, now: float, replay, device="cpu") -> dict[str, torch.Tensor]:
        """The state back on `device`. After the TTL it is gone: `replay()` must return
        (tensors, replayed_tokens, flops) rebuilt from the last `window` tokens; the cost is counted."""
        if self.where == "device":
            return self.tensors
        self.stats.fetches += 1
        if self.where == "host" and now - self.offloaded_at > self.ttl:
            self.where, self.tensors = "dropped", {}
        if self.where == "dropped":
            self.stats.misses += 1
            self.tensors, n, flops = replay()
            if n > self.window:
                raise SelectionError(f"a replay recomputed {n} tokens, more than the window ({self.window})")
            self.stats.replayed_tokens += n
            self.stats.replay_flops += flops
        self.tensors = {k: v.to(device) for k, v in self.tensors.items()}
        self.where, self.offloaded_at = "device", None
        return self.tensors
