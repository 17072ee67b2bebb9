"""NVFP4: E2M1 elements, one E4M3 scale per 16, optionally an FP32 per-tensor scale above them.

Recipes (`recipe=` option):
- "torchao" (default; torchao 0.18 prototype/mx_formats/nvfp4_tensor.py `nvfp4_quantize`): block scale bs = amax / 6; single level
  s = e4m3(clamp(bs, 2^-6, 448)), data = x * (1 / s); two level with global decode scale g,
  s = e4m3(clamp(bs / g, 2^-6, 448)), data = x * ((1 / g) / s). A multiply by a reciprocal,
  not a division. An all-zero block gets scale byte 0x08 (2^-6); Inf gives 448 (0x7E); NaN
  gives a NaN scale (0x7F) and NaN codes (0x3 / 0xB).
- "modelopt" (NVIDIA TensorRT Model Optimizer, modelopt nvfp4_tensor.py): a zero block
  scale is replaced by 1.0 (0x38), the floor is 2^-9 (subnormal E4M3 scales allowed), data
  = x / (s * g) (a division), and the sign comes from x < 0 (so -0.0 gives code 0, not 0x8).
- "te" (TransformerEngine's reference recipe, custom_recipes/quantization_nvfp4.py): torchao's arithmetic without the
  2^-6 floor, so tiny blocks get subnormal or zero scales; a zero scale gives zero codes
  (kvlab's guard for the 0 x Inf the reference would compute).
All three agree on ordinary data and differ on zero, tiny and wide-range blocks (tested).

The global scale g defaults to amax(finite |x|) / (448 x 6) (torchao
`per_tensor_amax_to_scale`), 1.0 for a tensor without finite non-zero values.
"""
from __future__ import annotations

import torch

from ..errors import ParameterError

from .e2m1 import encode_e2m1

RECIPES = ("torchao", "modelopt", "te")
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_TINY = 2.0**-6  # smallest normal E4M3 (torch.finfo(float8_e4m3fn).tiny)
E4M3_SUBNORMAL_MIN = 2.0**-9  # smallest subnormal E4M3


def global_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """torchao's per-tensor decode scale g = amax / (448 x 6); 1.0 when amax is 0."""
    g = amax.float() / (E4M3_MAX * E2M1_MAX)
    return torch.where(g > 0, g, torch.ones((), device=g.device))


def quantize_nvfp4_blocks(xb: torch.Tensor, recipe: str = "torchao",
                          global_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks fp32 [..., nb, 16] -> (scale bytes uint8 [..., nb], E2M1 codes uint8 [..., nb, 16])."""
    amax = xb.abs().amax(dim=-1)  # [..., nb]; NaN if the block holds one
    has_nan = bool(torch.isnan(amax).any())
    bs = amax / E2M1_MAX
    g = global_scale
    if recipe == "torchao":
        s8 = (bs if g is None else bs / g).clamp(E4M3_TINY, E4M3_MAX).to(torch.float8_e4m3fn)
        s = s8.float()
        r = (1.0 / s) if g is None else (1.0 / g) / s
        codes = encode_e2m1(xb * r.unsqueeze(-1), has_nan)
    elif recipe == "te":
        s8 = (bs if g is None else bs / g).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
        s = s8.float()
        r = (1.0 / s) if g is None else (1.0 / g) / s
        r = torch.where(s == 0, torch.zeros((), device=s.device), r)
        codes = encode_e2m1(xb * r.unsqueeze(-1), has_nan)
    elif recipe == "modelopt":
        raw = bs if g is None else bs / g
        raw = torch.where(raw == 0, torch.ones((), device=raw.device), raw)
        s8 = raw.clamp(E4M3_SUBNORMAL_MIN, E4M3_MAX).to(torch.float8_e4m3fn)
        s = s8.float()
        d = xb / (s if g is None else s * g).unsqueeze(-1)
        codes = encode_e2m1(d, has_nan) & 7 | ((d < 0).to(torch.uint8) << 3)
    else:
        raise ParameterError(f"unknown NVFP4 recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    return s8.view(torch.uint8), codes
