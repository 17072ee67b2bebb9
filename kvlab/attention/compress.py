"""Token compression at ratio m: m tokens pooled into one entry by a learned softmax gate.

DeepSeek V4 (HF transformers 5.24 models/deepseek_v4, paper section 2.3):
  HCA style (non-overlapping, m = 128): entry w = RMSNorm( sum_{j in window w} softmax_j(Z_j + B_j) * C_j )
  CSA style (overlapping, m = 4): the projections are 2d wide, two series Ca = [:d] and Cb = [d:]; entry w pools
           window w-1's Ca slots with window w's Cb slots (2m slots, stride m), so each entry sees 2m tokens.
The softmax runs per channel over the slots. RoPE is applied at the position w * m of the window's first token.
Tokens of a window that is not yet complete wait in a bounded tail (< m tokens).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..checks import need_int
from .checks import AttentionShapeError, SelectionError, need_dims, need_real, same
from .rope import apply_rope, rms_norm


def gated_pool(kv: torch.Tensor, gate: torch.Tensor, m: int, overlap: bool,
               prev: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Pool complete windows: kv, gate [B, n*m, width] (width = 2d if overlap else d) -> [B, n, d].

    `prev` = (Ca kv, Ca gate) [B, m, d] of the window before the first one (overlap only); without it
    window 0's first half gets zero weight (-inf gate)."""
    m = need_int("compression ratio m", m, 1, error=SelectionError)
    need_dims("kv", kv, 3, "[B, T, width]")
    same("kv shape", kv.shape, "gate shape", gate.shape)
    b, t, width = kv.shape
    if t % m:
        raise AttentionShapeError(f"gated_pool takes whole windows: {t} tokens is not a multiple of m = {m}")
    n = t // m
    kv, gate = kv.float().view(b, n, m, width), gate.float().view(b, n, m, width)  # [B, n, m, width]
    if not overlap:
        return (kv * gate.softmax(dim=2)).sum(2)  # [B, n, d]: softmax over each window's m slots
    if width % 2:
        raise AttentionShapeError(f"overlapping compression needs an even projection width, got {width}")
    d = width // 2
    slots_kv = kv.new_zeros(b, n, 2 * m, d)  # [B, n, 2m, d]
    slots_g = kv.new_full((b, n, 2 * m, d), float("-inf"))  # [B, n, 2m, d]
    slots_kv[:, :, m:], slots_g[:, :, m:] = kv[..., d:], gate[..., d:]  # Cb of window w
    slots_kv[:, 1:, :m], slots_g[:, 1:, :m] = kv[:, :-1, :, :d], gate[:, :-1, :, :d]  # Ca of window w-1
    if prev is not None:
        slots_kv[:, 0, :m], slots_g[:, 0, :m] = prev[0].float(), prev[1].float()  # [B, m, d] each
    return (slots_kv * slots_g.softmax(dim=2)).sum(2)  # [B, n, d]: softmax over 2m slots


def pool_keys(x: torch.Tensor, m: int, overlap: bool = False) -> torch.Tensor:
    """Weight-free compression of given keys or values [B, (H,) T, d] with a uniform gate (mean pooling
    over m, or over 2m overlapping tokens): [B, (H,) T // m, d]. A partial last window is left out."""
    m = need_int("compression ratio m", m, 1, error=SelectionError)
    need_real("x", x, "[B, (H,) T, d]")
    if x.dim() < 3:
        raise AttentionShapeError(f"x must be [B, (H,) T, d] (3 or 4 dims), got shape {tuple(x.shape)}")
    shape = x.shape
    flat = x.reshape(-1, shape[-2], shape[-1])  # [B*H, T, d]
    n = flat.shape[1] // m * m
    flat = flat[:, :n]
    src = torch.cat([flat, flat], -1) if overlap else flat  # [B*H, n, width]: both CSA series see the key
    out = gated_pool(src, torch.zeros_like(src), m, overlap)  # [B*H, n / m, d]
    return out.reshape(*shape[:-2], n // m, shape[-1])  # [B, (H,) n / m, d]


@dataclass
class Compressor:
    """A learned compressor (CSA when overlap, HCA otherwise) with its weights."""

    ratio: int  # m: tokens per entry
    dim: int  # d: width of one entry
    overlap: bool  # CSA-style overlapping windows (projections 2d wide)
    w_kv: torch.Tensor  # [hidden, width] kv projection
    w_gate: torch.Tensor  # [hidden, width] gate projection
    bias: torch.Tensor  # [m, width] per-slot position bias added to the gate
    norm: torch.Tensor  # [d] RMSNorm weight applied to each pooled entry
    rope_dim: int = 0  # trailing channels that get RoPE
    rope_theta: float = 160000.0  # V4's compress_rope_theta
    eps: float = 1e-6  # RMSNorm epsilon

    def __post_init__(self):
        self.ratio = need_int("compression ratio m", self.ratio, 1, error=SelectionError)
        self.dim = need_int("dim", self.dim, 1, error=SelectionError)
        self.rope_dim = need_int("rope_dim", self.rope_dim, 0, error=SelectionError)
        same("w_kv width", self.w_kv.shape[1], "compressor width", self.width)
        same("bias shape[0]", self.bias.shape[0], "compression ratio m", self.ratio)

    @property
    def width(self) -> int:
        return self.dim * (2 if self.overlap else 1)

    @property
    def hidden(self) -> int:
        return self.w_kv.shape[0]

    @classmethod
    def random(cls, hidden: int, dim: int, ratio: int, overlap: bool, rope_dim: int = 0, seed: int = 0,
               rope_theta: float = 160000.0) -> "Compressor":
        ratio = need_int("compression ratio m", ratio, 1, error=SelectionError)
        hidden, dim = need_int("hidden", hidden, 1, error=SelectionError), need_int("dim", dim, 1, error=SelectionError)
        rope_dim = need_int("rope_dim", rope_dim, 0, error=SelectionError)
        g = torch.Generator().manual_seed(need_int("seed", seed, 0, error=SelectionError))
        w = dim * (2 if overlap else 1)
        w_kv = torch.randn(hidden, w, generator=g) / math.sqrt(hidden)  # [hidden, width]
        w_gate = torch.randn(hidden, w, generator=g) / math.sqrt(hidden)  # [hidden, width]
        bias = 0.1 * torch.randn(ratio, w, generator=g)  # [m, width]
        norm = 1 + 0.1 * torch.randn(dim, generator=g)  # [d]
        return cls(ratio=ratio, dim=dim, overlap=overlap, w_kv=w_kv, w_gate=w_gate, bias=bias, norm=norm,
                   rope_dim=rope_dim, rope_theta=rope_theta)

    def finish(self, pooled: torch.Tensor, first_entry: int) -> torch.Tensor:
        """RMSNorm then RoPE at each entry's first-token position: [B, n, d]."""
        y = rms_norm(pooled, self.norm, self.eps)
        pos = (torch.arange(pooled.shape[1]) + first_entry) * self.ratio  # [n] first-token positions
        return apply_rope(y, pos, self.rope_dim, self.rope_theta)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Stateless: compress every complete window of x [B, T, hidden] -> [B, T // m, d]."""
        need_dims("x", x, 3, "[B, T, hidden]")
        same("x width", x.shape[-1], "compressor hidden size", self.hidden)
        n = x.shape[1] // self.ratio * self.ratio
        kv = x[:, :n].float() @ self.w_kv  # [B, n, width]
        gate = x[:, :n].float() @ self.w_gate + self.bias.repeat(n // self.ratio, 1)  # [B, n, width]
        return self.finish(gated_pool(kv, gate, self.ratio, self.overlap), 0)

    def state(self) -> "CompressorState":
        return CompressorState(self)


@dataclass
class CompressorState:
    """Streaming compression of one sequence: the pending tail (< m tokens) and the overlap carry."""

    comp: Compressor  # the compressor
    tail_kv: torch.Tensor | None = None  # [B, < m, width] projections of pending tokens
    tail_gate: torch.Tensor | None = None  # [B, < m, width]
    carry: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)  # last window's Ca (CSA)
    emitted: int = 0  # entries produced so far

    @property
    def pending(self) -> int:
        """Tokens waiting in the tail (always < m)."""
        return 0 if self.tail_kv is None else self.tail_kv.shape[1]

    def append(self, x: torch.Tensor) -> torch.Tensor:
        """Feed tokens x [B, S, hidden]; returns the entries their completed windows produce [B, n, d]."""
        c = self.comp
        need_dims("x", x, 3, "[B, S, hidden]")
        same("x width", x.shape[-1], "compressor hidden size", c.hidden)
        kv, gate = x.float() @ c.w_kv, x.float() @ c.w_gate  # [B, S, width] each
        if self.tail_kv is not None:
            kv, gate = torch.cat([self.tail_kv, kv], 1), torch.cat([self.tail_gate, gate], 1)  # [B, p + S, width]
        n = kv.shape[1] // c.ratio * c.ratio
        self.tail_kv, self.tail_gate = kv[:, n:], gate[:, n:]
        assert self.pending < c.ratio  # the tail is bounded
        if n == 0:
            return kv.new_zeros(kv.shape[0], 0, c.dim)
        kv, gate = kv[:, :n], gate[:, :n] + c.bias.repeat(n // c.ratio, 1)
        pooled = gated_pool(kv, gate, c.ratio, c.overlap, self.carry)
        if c.overlap:
            self.carry = (kv[:, -c.ratio:, :c.dim], gate[:, -c.ratio:, :c.dim])
        out = c.finish(pooled, self.emitted)
        self.emitted += out.shape[1]
        return out
