"""Presses: token eviction inside kvlab.hf's cache, as kvpress (NVIDIA/kvpress 0.5.5) defines it.

A press is a scorer and a pruner (kvpress presses/scorer_press.py): `score` gives every held token of a
layer a score per KV head, [B, Hkv, T]; the pruner keeps the `n` best per head (`select`), the rest are
physically freed: the layer's packed rows are gathered (or rebuilt) to the kept tokens, so the bytes held
are those of `n` tokens, as kvlab.layout predicts them (`layer_bytes`).

When it runs (`PressRun`, one per cache layer):
  prefill  after the attention of the first forward (the context), as kvpress's forward hook does
           (base_press.py, `is_prefilling`): every context query has read every context token, then the
           layer keeps n = max(1, int(T * keep)) of them (kvpress's compute_n_kept with ratio 1 - keep);
           later tokens (a question, decoded tokens) enter uncompressed, positions continuing from T.
  decode   after every forward, the layer is evicted back to its budget (StreamingLLM, Xiao et al. 2023,
           arXiv 2309.17453; TOVA, Oren et al. 2024, arXiv 2401.06104; H2O, Zhang et al. 2023, arXiv
           2306.14048: accumulated attention).

Presses that read queries get the forward's own queries (after RoPE) from kvlab's attention function
(kvlab.hf.mechanisms.kvlab_attention), which computes whatever attention weights they need itself in
float32: SDPA gives none, and kvlab needs no eager attention for them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ...checks import need_choice, need_int
from ...errors import ParameterError
from ...layout import Layout

MODES = ("prefill", "decode")
QUERY_CHUNK = 256  # queries scored at once (bounds a [B, H, S, T] block of attention weights)


# --- budgets -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """How much of the context a press keeps: a fraction, a token count, or bytes per session."""

    keep: float | int | None = None  # < 1: the fraction of context tokens kept; >= 1: tokens kept per head
    nbytes: int | None = None  # bytes the cache may hold after compression (resolved to tokens by the layout)

    def __post_init__(self):
        if (self.keep is None) == (self.nbytes is None):
            raise ParameterError("a press takes one budget: keep=X (a fraction < 1 or a token count >= 1) or "
                                 "keep_bytes=B")
        if self.keep is not None:
            k = self.keep
            if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k <= 0:
                raise ParameterError(f"keep must be a fraction in (0, 1) or a token count >= 1, got {k!r}")
            if k >= 1 and k != int(k):
                raise ParameterError(f"keep >= 1 is a token count and must be a whole number, got {k!r}")
        else:
            need_int("keep_bytes", self.nbytes, 1)

    def tokens(self, t: int, cap: bool = True) -> int:
        """Tokens kept of a context of t; a token count above t is refused unless `cap` is False (decode-time
        eviction holds up to a token count as the sequence grows); a byte budget is resolved by the cache
        (`PressPlan.resolve`)."""
        k = self.keep
        if k < 1:  # kvpress utils.compute_n_kept(t, ratio) with ratio = 1 - keep
            return max(1, int(t * (1 - (1 - k))))
        if cap and int(k) > t:
            raise ParameterError(f"keep={int(k):,} tokens is more than the context's {t:,}: a press keeps part of "
                                 "the context it is given (a fraction, or fewer tokens)")
        return int(k)

    def label(self) -> str:
        if self.nbytes is not None:
            return f"{self.nbytes:,} B"
        return f"{self.keep:g}" if self.keep < 1 else f"{int(self.keep)} tokens"


# --- what a scorer sees --------------------------------------------------------------------------------------
@dataclass
class PressInput:
    """One layer's held tokens and the forward's queries, for a scorer."""

    keys: torch.Tensor  # [B, Hkv, T, D] held keys (decoded from their format), float32
    values: torch.Tensor  # [B, Hkv, T, Dv] held values, float32
    kpos: torch.Tensor  # [B, Hkv, T] original position of each held token
    queries: torch.Tensor | None  # [B, H, S, D] this forward's queries (after RoPE), float32
    qpos: torch.Tensor | None  # [S] their positions
    scaling: float  # the attention's softmax scale (1 / sqrt(D) for most models)
    layer: int  # layer index
    layers: int  # layers in the model
    rotary: object = None  # the model's rotary embedding module (rotary(x, position_ids) -> cos, sin)
    keep: float = 1.0  # the budget as a fraction of the context (kvpress's 1 - compression_ratio)
    state: dict = field(default_factory=dict)  # the press's per-layer state across forwards (H2O's sums)

    @property
    def groups(self) -> int:
        """Query heads per KV head."""
        return self.queries.shape[1] // self.keys.shape[1]

    def attention(self, last: int | None = None) -> torch.Tensor:
        """Softmax attention of the last `last` queries (None: all) over the held keys, causal by position:
        [B, H, S', T] float32 (kvpress's SnapKVPress.compute_window_attention, in float32)."""
        q, qp = (self.queries, self.qpos) if last is None else (self.queries[:, :, -last:], self.qpos[-last:])
        k = self.keys.repeat_interleave(self.groups, dim=1)  # [B, H, T, D]
        kp = self.kpos.repeat_interleave(self.groups, dim=1)  # [B, H, T]
        out = []
        for a in range(0, q.shape[2], QUERY_CHUNK):
            logits = torch.matmul(q[:, :, a:a + QUERY_CHUNK], k.transpose(-1, -2)) * self.scaling  # [B, H, s, T]
            seen = kp[:, :, None, :] <= qp[a:a + QUERY_CHUNK][None, None, :, None]  # [B, H, s, T]
            out.append(torch.softmax(logits.masked_fill(~seen, float("-inf")), dim=-1))
        return torch.cat(out, dim=2)

    def group_mean(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, T] per query head -> [B, Hkv, T], the mean over each KV head's query group."""
        b, h, t = x.shape
        return x.view(b, h // self.groups, self.groups, t).mean(2)


def pad_max(scores: torch.Tensor, front: int = 0, back: int = 0) -> torch.Tensor:
    """Scores [B, Hkv, T'] padded with max + 1 (kept first), `front` tokens before and `back` after (kvpress)."""
    return torch.nn.functional.pad(scores, (front, back), value=scores.max().item() + 1)


# --- presses -------------------------------------------------------------------------------------------------
@dataclass
class Press:
    """A scorer (`score`) and a pruner (`select`, top n per KV head; `layer_budget` per layer)."""

    name: ClassVar[str] = ""  # registry name
    needs: ClassVar[tuple[str, ...]] = ()  # "queries" (this forward's), "rope" (the model's rotary embedding)
    decodes: ClassVar[bool] = False  # defined as decode-time eviction too (mode="decode")
    variable: ClassVar[bool] = False  # the pruner picks how many slots it holds (AdaKV's fullest head, ChunkKV's
    # whole chunks): the prediction takes that count from it

    def score(self, x: PressInput) -> torch.Tensor:
        """[B, Hkv, T]: higher is kept."""
        raise NotImplementedError

    def check(self, t: int) -> None:
        """Refuse a context this press cannot score (one line naming the press and the length)."""

    def observe(self, x: PressInput) -> None:
        """Decode-time eviction: take in this forward before scoring (H2O accumulates its attention sums)."""

    def layer_budget(self, layer: int, layers: int, t: int, n: int, keep: float) -> int:
        """Tokens layer `layer` keeps of t when the budget gives n, the fraction `keep` of t (PyramidKV spreads
        them over layers)."""
        return n

    def select(self, x: PressInput, scores: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(slots kept [B, Hkv, n'] in position order, which of them attention reads [B, Hkv, n'] or None: all)."""
        return scores.topk(n, dim=-1).indices.sort(dim=-1).values, None

    def label(self) -> str:
        return self.name


# --- the budget of one cache ------------------------------------------------------------------------------------
def layer_bytes(layout: Layout, i: int, tokens: int, batch: int = 1) -> int:
    """kvlab.layout's bytes of layer i holding `tokens` tokens (Layout.session of that layer alone)."""
    lay = layout.layers[i]
    return Layout(layout.model, layout.scheme, layout.kv_format, (lay,), layout.notes).session(tokens, batch).total


@dataclass
class PressPlan:
    """A press with its budget and mode, for one cache: per-layer budgets and the bytes they predict."""

    press: Press  # the scorer and pruner
    budget: Budget  # fraction, tokens or bytes
    mode: str = "prefill"  # "prefill" (kvpress: compress the context once) or "decode" (evict every forward)
    applies: tuple[bool, ...] = ()  # per layer: does the press act there (full-attention layers)
    context: int | None = None  # tokens of the first forward (the context), once seen
    kept: dict = field(default_factory=dict)  # layer -> tokens kept after compressing the context
    rotary: object = None  # the model's rotary embedding (presses that need "rope")

    def __post_init__(self):
        need_choice("press mode", self.mode, MODES)
        if self.mode == "decode" and not self.press.decodes:
            raise ParameterError(f"press {self.press.name} compresses the context at prefill; decode-time eviction "
                                 "is defined for presses with decodes = True (kvlab.hf.presses.DECODING)")

    def resolve(self, t: int, layout: Layout, batch: int) -> dict:
        """Tokens each layer keeps of a context of t: {layer: n} (a byte budget: the most tokens whose
        layout bytes, with the press's per-layer allocation, fit in it)."""
        layers = len(self.applies)
        self.press.check(t)

        def alloc(n):
            f = self.fraction(t, n)
            return {i: self.press.layer_budget(i, layers, t, n, f) for i, a in enumerate(self.applies) if a}
        if self.budget.nbytes is None:
            return alloc(self.budget.tokens(t, cap=self.mode == "prefill"))

        def total(n):
            held = alloc(n)
            return sum(layer_bytes(layout, i, held.get(i, t), batch) for i in range(layers))
        lo, hi = 1, t
        if total(lo) > self.budget.nbytes:
            raise ParameterError(f"keep_bytes={self.budget.nbytes:,}: even one token per layer holds "
                                 f"{total(lo):,} B at a context of {t:,} tokens")
        while lo < hi:  # the largest n with total(n) <= budget (total grows with n)
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if total(mid) <= self.budget.nbytes else (lo, mid - 1)
        return alloc(lo)

    def fraction(self, t: int, n: int) -> float:
        """The budget as a fraction of a context of t (1 - kvpress's compression_ratio, computed as kvpress does)."""
        k = self.budget.keep
        return 1 - (1 - k) if k is not None and k < 1 else n / t

    def held(self, i: int, tokens: int) -> int:
        """Tokens layer i holds after `tokens` tokens (the press's rule; its kept count once compressed)."""
        if not self.applies[i] or self.context is None or i not in self.kept:
            return tokens
        n = self.kept[i]
        if self.mode == "decode":
            return min(tokens, n)
        return n + tokens - self.context

    def label(self) -> str:
        return f"{self.press.label()} keep {self.budget.label()}" + (" (decode)" if self.mode == "decode" else "")


class ScoredByInner:
    """A press that scores with another (its `inner` field) and only selects differently (AdaKV, ChunkKV)."""

    @property
    def needs(self):
        return self.inner.needs

    def check(self, t: int) -> None:
        self.inner.check(t)

    def score(self, x: PressInput) -> torch.Tensor:
        return self.inner.score(x)
