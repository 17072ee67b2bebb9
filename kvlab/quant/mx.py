"""OCP MX block scaling: one E8M0 (power-of-two) scale per block, E2M1 or FP8 elements.

Scale rules (`scale_rule=` option), matching torchao 0.18 `to_mx` (prototype/mx_formats/mx_tensor.py) bit for bit:
- "floor" (default; OCP MX spec 6.3): e = unbiased exponent of the block amax, read from its
  fp32 bits, minus emax_elem (2 for E2M1, 8 for E4M3, 15 for E5M2); clamped to [-127, 128];
  byte = e + 127 (NaN amax -> 255; zero or subnormal amax -> 0). Data = x / 2^e with the
  divisor floored at 2^-126. FLOOR can clip: MXFP8 scaled values reach 512 > 448.
- "rceil" (what Blackwell's cvt.rp.satfinite.ue8m0 does; torchao's eager fallback):
  byte = clamp(ceil(log2(amax / max_elem)), -127, 127) + 127 via torch.log2 (NaN -> 255,
  Inf -> 254); data = x * 2^(127 - byte) (x * 1 for byte 0, x * 2^-127 for 254).
Elements are then cast saturating (FP8 clamps to +-max; E2M1 saturates at 6).
"""
from __future__ import annotations

import torch

from ..errors import ParameterError

from ..formats import Element
from .e2m1 import encode_e2m1
from .fp8 import encode_fp8

RULES = ("floor", "rceil")
# Exponent of the largest power of two below each element format's max (OCP MX spec).
EMAX = {"e2m1": 2, "e4m3": 8, "e5m2": 15}


def e8m0_to_float(b: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> fp32 2^(b - 127), built from bits (exact; 255 -> NaN, 0 -> 2^-127)."""
    bi = b.to(torch.int32)
    f = torch.bitwise_left_shift(bi, 23).view(torch.float32)
    f = torch.where(bi == 0, torch.full((), 2.0**-127, device=b.device), f)
    return torch.where(bi == 255, torch.full((), float("nan"), device=b.device), f)


def _encode(d: torch.Tensor, element: Element, has_nan: bool | None = None) -> torch.Tensor:
    return encode_e2m1(d, has_nan) if element.name == "e2m1" else encode_fp8(d, element)


def quantize_mx_blocks(xb: torch.Tensor, element: Element, rule: str = "floor") -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks fp32 [..., nb, k] -> (E8M0 bytes uint8 [..., nb], element codes uint8 [..., nb, k])."""
    amax = xb.abs().amax(dim=-1, keepdim=True)  # [..., nb, 1]; NaN if the block holds one
    has_nan = bool(torch.isnan(amax).any())
    if rule == "floor":
        exp = torch.bitwise_right_shift(amax.view(torch.int32), 23) & 0xFF
        e = (exp - 127 - EMAX[element.name]).clamp(-127, 128)
        b = (e + 127).to(torch.uint8)
        b = torch.where(torch.isnan(amax), 255, b).to(torch.uint8)
        div = torch.bitwise_left_shift(b.to(torch.int32), 23).view(torch.float32).clamp(min=2.0**-126)
        codes = _encode(xb / div, element, has_nan)
    elif rule == "rceil":
        descale = amax / element.max
        normal = (torch.ceil(torch.log2(descale)).clamp(-127, 127) + 127).to(torch.uint8)
        b = torch.where(torch.isnan(descale), 255, torch.where(torch.isinf(descale), 254, normal)).to(torch.uint8)
        bf = b.float()
        rcp = torch.exp2(127.0 - bf)
        rcp = torch.where(b == 0, torch.ones((), device=b.device), rcp)
        rcp = torch.where(b == 254, torch.full((), 2.0**-127, device=b.device), rcp)
        rcp = torch.where(b == 255, descale, rcp)
        codes = _encode((xb * rcp).clamp(-element.max, element.max), element, has_nan)
    else:
        raise ParameterError(f"unknown MX scale rule {rule!r}; choose one of {', '.join(RULES)}")
    return b.squeeze(-1), codes
