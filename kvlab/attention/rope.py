"""Rotary position embedding on the trailing `rope_dim` channels, interleaved pairs (DeepSeek V4 layout).

V4 lays each head out as [nope | rope] and rotates consecutive channel pairs (HF transformers 5.24,
models/deepseek_v4 `apply_rotary_pos_emb`); the same convention here lets the cross-check compare directly.
"""
from __future__ import annotations

import torch

from ..checks import need_int, need_number
from .checks import AttentionShapeError, need_real


def rope_angles(positions: torch.Tensor, rope_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., rope_dim // 2] for integer positions [...]."""
    rope_dim = need_int("rope_dim", rope_dim, 0)
    inv = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))  # [rope_dim/2]
    f = positions.to(torch.float32)[..., None] * inv  # [..., rope_dim/2]
    return f.cos(), f.sin()


def apply_rope(x: torch.Tensor, positions: torch.Tensor, rope_dim: int, theta: float = 10000.0,
               inverse: bool = False) -> torch.Tensor:
    """Rotate the last `rope_dim` channels of x [B, (H,) S, D] by positions [S] (or [B, S])."""
    need_real("x", x, "[B, (H,) S, D]")
    rope_dim = need_int("rope_dim", rope_dim, 0)
    need_number("theta", theta, 0.0, lo_open=True)
    if rope_dim == 0:
        return x
    if rope_dim % 2 or rope_dim > x.shape[-1]:
        raise AttentionShapeError(f"rope_dim must be even (rotated in pairs) and at most the head width "
                                  f"{x.shape[-1]}, got {rope_dim}")
    need_real("positions", positions, "[S] or [B, S]")
    if x.dim() < 2 or positions.dim() not in (1, 2) or positions.shape[-1] != x.shape[-2] or (
            positions.dim() == 2 and positions.shape[0] != x.shape[0]):
        raise AttentionShapeError(f"positions {tuple(positions.shape)} must be [S] or [B, S] for x "
                                  f"{tuple(x.shape)} [B, (H,) S, D]")
    cos, sin = rope_angles(positions, rope_dim, theta)  # [S, r/2]
    if inverse:
        sin = -sin
    while cos.dim() < x.dim():  # broadcast over heads / batch
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    nope, r = x[..., :-rope_dim], x[..., -rope_dim:].float()  # [..., D - r], [..., r]
    a, b = r[..., 0::2], r[..., 1::2]  # [..., r/2] each: the interleaved pairs
    out = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)  # [..., r]
    return torch.cat([nope, out.to(x.dtype)], dim=-1)  # [..., D]


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim (float32 math)."""
    need_number("eps", eps, 0.0, lo_open=True)
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)  # [..., D]
    return (y * weight if weight is not None else y).to(x.dtype)
