"""FP8 E4M3 / E5M2 casts and FP8 quantization with FP32 scales (per tensor, token or block).

Casts are saturating, round to nearest even: clamp to +-max, then torch's cast (torch 2.13
rounds RNE; E5M2 would overflow to Inf without the clamp; checked in tests/test_quant_casts.py). +-Inf saturates to
+-max; NaN stays NaN (E4M3 0x7F / E5M2 0x7F with its sign).

Scales (kvlab's definition; vLLM's KV cache convention): s = amax / max_elem over the finite
values of the scale's group, with s = 1.0 for a group with no finite non-zero value; codes
= cast(x / s) (a division, as vLLM's cache writer does); decode = value x s. vLLM's
calibration sets k_scale = amax(k) / 200 and v_scale = amax(v) / 100 (vLLM
`calculate_kv_scales`, K_SCALE_CONSTANT / V_SCALE_CONSTANT in vllm/envs.py) — pass them as `scale=`.
"""
from __future__ import annotations

import torch

from ..formats import Element

_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}

# vLLM's dynamic KV scale calibration divisors (vllm/envs.py K_SCALE_CONSTANT, V_SCALE_CONSTANT).
VLLM_K_DIVISOR = 200.0
VLLM_V_DIVISOR = 100.0


def fp8_dtype(element: Element) -> torch.dtype:
    return _DTYPES[element.name]


def encode_fp8(x: torch.Tensor, element: Element) -> torch.Tensor:
    """fp32 -> FP8 codes (uint8), saturating RNE."""
    return x.float().clamp(-element.max, element.max).to(fp8_dtype(element)).view(torch.uint8)


def decode_fp8(codes: torch.Tensor, element: Element) -> torch.Tensor:
    """FP8 codes (uint8) -> fp32 values."""
    return codes.view(fp8_dtype(element)).float()


def finite_amax(x: torch.Tensor, dim=None, keepdim: bool = False) -> torch.Tensor:
    """amax of |x| over the finite values (NaN and Inf ignored)."""
    a = x.abs()
    a = torch.where(torch.isfinite(a), a, torch.zeros((), dtype=a.dtype, device=a.device))
    return a.amax() if dim is None else a.amax(dim=dim, keepdim=keepdim)


def fp32_scale(amax: torch.Tensor, element: Element) -> torch.Tensor:
    """s = amax / max_elem, 1.0 where amax is zero."""
    s = amax.float() / element.max
    return torch.where(s > 0, s, torch.ones((), device=s.device))


def vllm_kv_scales(k: torch.Tensor, v: torch.Tensor) -> tuple[float, float]:
    """vLLM's first-batch calibration: (k_scale, v_scale) = (amax(k) / 200, amax(v) / 100)."""
    return (float(finite_amax(k.float())) / VLLM_K_DIVISOR, float(finite_amax(v.float())) / VLLM_V_DIVISOR)


def quantize_fp8_scaled(x: torch.Tensor, element: Element, scale: torch.Tensor) -> torch.Tensor:
    """codes = saturating cast of x / scale (scale broadcast against x)."""
    return encode_fp8(x.float() / scale, element)
