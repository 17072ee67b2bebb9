"""Asymmetric integer groups (KIVI; HF QuantizedCache; optimum-quanto MaxOptimizer + affine).

Per group of G values: mn = min, mx = max, s = (mx - mn) / (2^b - 1),
q = clamp(round((x + (-mn)) / s), 0, 2^b - 1) with round half to even, decode q x s + mn.
The codes are computed in fp32 from the fp32 s and mn (bit-exact to optimum-quanto 0.2.7 on
fp32 input, tests/test_quant_int.py); s and mn are then stored in the format's scale / zero-point types
(FP16 in the table), and dequantization uses the stored values.
A constant group (s = 0, KIVI's 0/0) is defined here: every code is 0 and it decodes to mn.
Grouping: axis "token" = G consecutive values along the last dim (KIVI values: per token over
G channels); axis "channel" = G consecutive tokens of one channel (KIVI keys), dim -2.
"""
from __future__ import annotations

import torch


def int_group_params(xg: torch.Tensor, bits: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, mn) fp32 of each group, reducing over `dim` (kept as size 1)."""
    mn = xg.amin(dim=dim, keepdim=True)
    mx = xg.amax(dim=dim, keepdim=True)
    return (mx - mn) / (2**bits - 1), mn


def encode_int(xg: torch.Tensor, s: torch.Tensor, mn: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes uint8 of x given its group's s and mn (broadcast); 0 where s == 0."""
    q = torch.round((xg + (-mn)) / s).clamp(0, 2**bits - 1)
    q = torch.where(s == 0, torch.zeros((), device=q.device), q)
    return q.to(torch.uint8)
