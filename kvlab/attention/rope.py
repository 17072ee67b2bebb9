"""Rotary position embedding on the trailing `rope_dim` channels, interleaved pairs (DeepSeek V4 layout).

V4 lays each head out as [nope | rope] and rotates consecutive channel pairs (HF transformers 5.24,
models/deepseek_v4 `apply_rotary_pos_emb`); the same convention here lets the cross-check compare directly.
"""
from __future__ import annotations

import torch


def rope_angles(positions: torch.Tensor, rope_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., rope_dim // 2] for integer positions [...]."""
    inv = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))  # [rope_dim/2]
    f = positions.to(torch.float32)[..., None] * inv  # [..., rope_dim/2]
    return f.cos(), f.sin()


def apply_rope(x: torch.Tensor, positions: torch.Tensor, rope_dim: int, theta: float = 10000.0,
               inverse: bool = False) -> torch.Tensor:
    """Rotate the last `rope_dim` channels of x [B, (H,) S, D] by positions [S] (or [B, S])."""
    if rope_dim == 0:
        return x
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
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)  # [..., D]
    return (y * weight if weight is not None else y).to(x.dtype)
