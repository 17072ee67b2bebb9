"""Error metrics of a quantized tensor against its full-precision original."""
from __future__ import annotations

import math

import torch

from .tensor import QuantizedTensor


def _pair(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape != y.shape:
        raise ValueError(f"metrics: shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}")
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


def rel_error(x: torch.Tensor, y: torch.Tensor) -> float:
    """||x - y|| / ||x|| (Frobenius)."""
    x, y = _pair(x, y)
    return math.sqrt(_sumsq(x - y) / _sumsq(x))


def cosine(x: torch.Tensor, y: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors."""
    x, y = _pair(x, y)
    return float(torch.sum(x * y, dtype=torch.float64)) / math.sqrt(_sumsq(x) * _sumsq(y))


def max_step_error(x: torch.Tensor, q: QuantizedTensor) -> float:
    """Largest |x - dequantized| in units of the element's step (QuantizedTensor.step):
    at most 0.5 for round-to-nearest without clipping."""
    err = (x.float() - q.dequantize(torch.float32)).abs()
    step = q.step()
    ratio = torch.where(step > 0, err / step, torch.where(err > 0, math.inf, 0.0))
    return float(ratio.max()) if ratio.numel() else 0.0


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v in fp32: q [..., Tq, D], k [..., T, D], v [..., T, Dv] -> [..., Tq, Dv]."""
    q, k, v = q.float(), k.float(), v.float()
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return w @ v


def attention_error(k: torch.Tensor, v: torch.Tensor, k_hat: torch.Tensor, v_hat: torch.Tensor,
                     q: torch.Tensor | None = None, queries: int = 16, seed: int = 0) -> float:
    """Relative error of the attention output from dequantized K, V against full-precision K, V.
    q defaults to `queries` seeded Gaussian queries scaled like the keys."""
    if q is None:
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn(*k.shape[:-2], queries, k.shape[-1], generator=gen)
        q = q.to(k.device) * k.float().std()
    ref = attention(q, k, v)
    return rel_error(ref, attention(q, k_hat, v_hat))
