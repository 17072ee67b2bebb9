"""Error metrics of an approximation against its reference: a quantized tensor against its full-precision
original, an approximate attention output against the dense one (kvlab.attention uses these too).
Sums are accumulated in fp64, so the figures do not depend on the order torch adds float32 values in."""
from __future__ import annotations

import math

import torch

from ..errors import ShapeError
from .tensor import QuantizedTensor


def _pair(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape != y.shape:
        raise ShapeError(f"metrics: shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}")
    return x.float(), y.float()


def _sumsq(t: torch.Tensor) -> float:
    """sum t^2, accumulated in fp64."""
    return float(torch.sum(t * t, dtype=torch.float64))


def sqnr(x: torch.Tensor, y: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB: 10 log10(sum x^2 / sum (x - y)^2); inf if equal."""
    x, y = _pair(x, y)
    noise = _sumsq(x - y)
    signal = _sumsq(x)
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def rel_error(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """||approx - ref|| / ||ref|| (Frobenius); 0 when both are zero, inf when only `ref` is."""
    ref, approx = _pair(ref, approx)
    noise, signal = _sumsq(approx - ref), _sumsq(ref)
    if signal == 0:
        return 0.0 if noise == 0 else math.inf
    return math.sqrt(noise / signal)


def cosine(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors (0 when either is zero)."""
    ref, approx = _pair(ref, approx)
    norms = math.sqrt(_sumsq(ref) * _sumsq(approx))
    return float(torch.sum(ref * approx, dtype=torch.float64)) / norms if norms else 0.0


def max_step_error(x: torch.Tensor, q: QuantizedTensor) -> float:
    """Largest |x - dequantized| in units of the element's step (QuantizedTensor.step):
    at most 0.5 for round-to-nearest without clipping."""
    err = (x.float() - q.dequantize(torch.float32)).abs()
    step = q.step()
    ratio = torch.where(step > 0, err / step, torch.where(err > 0, math.inf, 0.0))
    return float(ratio.max()) if ratio.numel() else 0.0
