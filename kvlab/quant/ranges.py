"""The magnitudes each format holds, and what `quantize` does beyond them.

A scaled format reaches as far as its largest element times its largest scale; an unscaled one as far as its
element. `max_input(fmt)` computes it from the formats table (never typed in):

| format (scales)                          | largest |x| kept          | beyond it                                   |
|------------------------------------------|------------------------|---------------------------------------------|
| fp16 (none)                              | 65,504                 | refused: the value would be stored as inf    |
| bf16 / fp32 (none)                       | 3.39e38 / 3.40e38      | refused (bf16), overflow impossible (fp32)   |
| nvfp4 (E4M3 per 16, single level)        | 6 x 448 = 2,688        | RangeWarning: clipped to +-2,688, as torchao |
| nvfp4_2level (+ FP32 per tensor)         | any finite             | the per-tensor scale absorbs the range       |
| MX (E8M0 per 32), FP8 with FP32 scales   | any finite fp32        | -                                            |
| FP8 / E2M1 with FP16 block scales        | elem max x 65,504      | refused: the scale would be inf              |
| int groups, FP16 scale + FP16 zero point | (max - min) / (2^b - 1) <= 65,504 and abs(min) <= 65,504 | refused: decode gives inf / NaN |

Refused input raises `QuantizeError` naming the format that fits (BF16 or FP32 scales, two-level NVFP4);
saturation that the reference implementations perform too (NVFP4 single level, as torchao) warns with
`kvlab.errors.RangeWarning` instead, so results stay bit-exact with them. At the small end, NVFP4 single
level (torchao recipe) floors its block scale at 2^-6, so values below 2^-8 in a block whose amax is under
6 x 2^-6 = 0.09375 round to zero; two-level NVFP4 rescales such a tensor.
"""
from __future__ import annotations

import math
import warnings

import torch

from ..errors import RangeWarning
from ..formats import FP32, Format

UNBOUNDED = math.inf  # a per-tensor FP32 scale (or E8M0 / FP32 block scales) covers any finite fp32 input


def max_input(fmt: Format) -> float:
    """Largest finite |x| that `fmt` keeps without saturating or overflowing (math.inf: any finite fp32)."""
    el = fmt.element
    if fmt.scope == "none":
        return el.max if el.kind == "float" else UNBOUNDED
    if fmt.tensor_scale is not None or fmt.scope == "tensor":
        return UNBOUNDED
    if el.kind == "int":  # any group within +-m has max - min <= 2m and min >= -m: both must fit their types
        return min(fmt.scale.max * el.max / 2, fmt.zero_point.max)
    if fmt.scale.kind == "pow2" or fmt.scale.max >= FP32.max:
        return UNBOUNDED
    return el.max * fmt.scale.max


def fits(fmt: Format) -> str:
    """The format to suggest when `fmt`'s range is too small."""
    if fmt.element.name == "e2m1" and fmt.scale is not None and fmt.scale.name == "e4m3":
        return "nvfp4_2level (a per-tensor FP32 scale above the E4M3 block scales)"
    if fmt.scope == "none":
        return "bf16 or fp32 (or a scaled format such as fp8_e4m3_token)"
    base = fmt.name.split("_g")[0].split("_b")[0]
    sep = "g" if fmt.element.kind == "int" else "b"
    return f"{base}_{sep}{fmt.block}_fp32 or {base}_{sep}{fmt.block}_bf16 (wider block scales)"


def over(amax: torch.Tensor, limit: float) -> tuple[int, int, float]:
    """(groups whose amax exceeds `limit`, groups, largest amax) over finite amax values."""
    amax = amax.detach()
    finite = torch.where(torch.isfinite(amax), amax, torch.zeros((), dtype=amax.dtype, device=amax.device))
    n = int((finite > limit).sum())
    return n, amax.numel(), float(finite.max()) if amax.numel() else 0.0


def warn_saturation(fmt: Format, amax: torch.Tensor, limit: float) -> None:
    """RangeWarning when blocks of finite values exceed what `fmt` keeps (they are clipped to +-limit)."""
    n, total, top = over(amax, limit)
    if n:
        warnings.warn(f"quantize: {n} of {total} blocks of x reach |x| = {top:.4g}, beyond the {limit:,g} that "
                      f"{fmt.name} keeps; they are clipped to +-{limit:,g} (as torchao does); "
                      f"use {fits(fmt)} for this range", RangeWarning, stacklevel=4)
