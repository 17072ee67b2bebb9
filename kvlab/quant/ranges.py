"""The magnitudes each format holds, and what `quantize` does beyond them.

A scaled format reaches as far as its largest element times its largest scale; an unscaled one as far as its
element. `max_input(fmt)` computes it from the formats table (never typed in):

| format (scales)                          | largest |x| kept          | beyond it                                   |
|------------------------------------------|------------------------|---------------------------------------------|
| fp16 (none)                              | 65,504                 | refused: the value would be stored as inf    |
| bf16 / fp32 (none)                       | 3.39e38 / 3.40e38      | refused (bf16), overflow impossible (fp32)   |
| nvfp4 (E4M3 per 16, single level)        | 6 x 448 = 2,688        | refused: it would be clipped to +-2,688      |
| nvfp4_2level (+ FP32 per tensor)         | any finite             | the per-tensor scale absorbs the range       |
| MX (E8M0 per 32), FP8 with FP32 scales   | any finite fp32        | -                                            |
| FP8 / E2M1 with FP16 block scales        | elem max x 65,504      | refused: the scale would be inf              |
| int groups, FP16 scale + FP16 zero point | (max - min) / (2^b - 1) <= 65,504 and abs(min) <= 65,504 | refused: decode gives inf / NaN |

The rule: where `quantize` chooses the scales, finite values the format cannot hold are refused with `QuantizeError`
naming the largest |x|, the range and the formats that fit (two-level NVFP4, FP32 or BF16 block scales, BF16 or
FP32 storage); nothing is clipped or stored as inf behind the caller's back. torchao clips NVFP4 single level at
2,688 instead; kvlab matches it bit for bit on everything it accepts. Two exceptions are the caller's choice, not
the format's range: a scale the caller pins (`scale=`, `global_scale=`, as a serving engine keeps its k_scale)
saturates what exceeds it, as that engine's cast does, and +-Inf saturates as torchao's NVFP4 and MX do. Within
the range, MX's FLOOR scale rule rounds scaled values up to 512 > 448 (MXFP8) by design (OCP MX spec). At the
small end, NVFP4 single level (torchao recipe) floors its block scale at 2^-6, so values below 2^-8 in a block
whose amax is under 6 x 2^-6 = 0.09375 round to zero; two-level NVFP4 rescales such a tensor.
"""
from __future__ import annotations

import math

import torch

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
        two = "nvfp4_2level" if fmt.block == 16 else f"nvfp4_2level_b{fmt.block}"
        return (f"{two} (a per-tensor FP32 scale above the E4M3 block scales) or nvfp4_b{fmt.block}_fp32 "
                "(FP32 block scales)")
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

