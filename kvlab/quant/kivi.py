"""KIVI's cache quantization: keys per channel over G tokens, values per token over G channels,
the most recent `residual` tokens kept in full precision (KIVI, Liu et al. 2024, arXiv:2402.02750; jy-yuan/KIVI)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import need_choice, need_int, need_type
from ..errors import ParameterError
from ..formats import get_format
from .api import quantize
from .tensor import QuantizedTensor


@dataclass
class KiviKV:
    """Quantized K and V of one layer plus the full-precision residual window."""

    k: QuantizedTensor | None  # keys, integer groups over G tokens of each channel (None if all residual)
    v: QuantizedTensor | None  # values, integer groups over G channels of each token
    k_residual: torch.Tensor  # [..., R, D] most recent keys, unquantized
    v_residual: torch.Tensor  # [..., R, D] most recent values, unquantized

    @property
    def nbytes(self) -> int:
        """Quantized bytes (table sizes) + residual bytes in the input dtype."""
        q = sum(t.nbytes for t in (self.k, self.v) if t is not None)
        return q + sum(t.numel() * t.element_size() for t in (self.k_residual, self.v_residual))

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) in the input dtype, residual tokens appended after the quantized ones."""
        ks = [t for t in (self.k.dequantize() if self.k else None, self.k_residual) if t is not None]
        vs = [t for t in (self.v.dequantize() if self.v else None, self.v_residual) if t is not None]
        return torch.cat(ks, dim=-2), torch.cat(vs, dim=-2)


def kivi_quantize(k: torch.Tensor, v: torch.Tensor, bits: int = 2, group: int = 32, residual: int = 32) -> KiviKV:
    """Quantize K, V [..., T, D] KIVI-style. The quantized prefix is the largest multiple of
    `group` tokens that leaves at least `residual` tokens in full precision."""
    need_choice("kivi_quantize: bits", need_int("kivi_quantize: bits", bits, None), (2, 4, 8))
    for name, t in (("k", k), ("v", v)):
        need_type(f"kivi_quantize: {name}", t, torch.Tensor, "a torch.Tensor [..., T, D]")
    if k.shape != v.shape or k.dim() < 2:
        raise ParameterError(f"kivi_quantize: k and v need one shape [..., T, D], got {tuple(k.shape)}, {tuple(v.shape)}")
    group = need_int("kivi_quantize: group", group, 1)
    residual = need_int("kivi_quantize: residual", residual, 0)
    fmt = get_format(f"int{bits}_g{group}")
    t = k.shape[-2]
    nq = max(t - residual, 0) // group * group
    kq = quantize(k[..., :nq, :], fmt, axis="channel") if nq else None
    vq = quantize(v[..., :nq, :], fmt, axis="token") if nq else None
    return KiviKV(kq, vq, k[..., nq:, :].clone(), v[..., nq:, :].clone())
