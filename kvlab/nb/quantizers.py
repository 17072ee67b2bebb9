"""Notebook 03 (quantizers): its parameters, and the formats study behind it: KV samples, format tables, error per
format.

Keys and values are drawn per distribution; every format quantizes them through `kvlab.quant.quantize` (integer
formats with KIVI's grouping: keys per channel over G tokens, values per token), and the errors and byte counts come
from kvlab.quant.metrics, kvlab.attention.metrics (the attention output's error) and kvlab.formats / kvlab.layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..attention.metrics import attention_error
from ..errors import ParameterError
from ..formats import Format, get_format
from ..layout import build_layout
from ..models import catalog_names
from ..quant.api import quantize
from ..quant.metrics import cosine, max_step_error, rel_error, sqnr
from .params import NotebookParams


DISTRIBUTIONS = ("gaussian", "outlier_channels", "student_t")
OUTLIER_GAIN = 10.0  # outlier channels are this many times larger than the rest
OUTLIER_EVERY = 32  # one outlier channel per this many channels


def sample_kv(shape: tuple[int, int, int], distribution: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded K and V [heads, tokens, head_dim] fp32 of one distribution."""
    g = torch.Generator().manual_seed(seed)

    def one() -> torch.Tensor:
        if distribution == "gaussian":
            return torch.randn(shape, generator=g)
        if distribution == "outlier_channels":  # a few channels much larger (as in LLM keys)
            x = torch.randn(shape, generator=g)
            x[..., ::OUTLIER_EVERY] *= OUTLIER_GAIN
            return x
        if distribution == "student_t":  # heavy tails: t with 3 degrees of freedom
            chi2 = (torch.randn(*shape, 3, generator=g) ** 2).sum(-1)
            return torch.randn(shape, generator=g) / torch.sqrt(chi2 / 3)
        raise ParameterError(f"unknown distribution {distribution!r}; choose one of {', '.join(DISTRIBUTIONS)}")

    return one(), one()


def bits_per_element(fmt: Format, d: int) -> float:
    """Stored bits per element of a d-wide vector, scales included (from the formats table)."""
    return fmt.entry_bytes(d) * 8 / d


def format_rows(formats: list[Format], d: int) -> list[dict]:
    """One row per format: element, scale, bits per element and bytes of a d-wide vector."""
    rows = []
    for f in formats:
        scale = "-" if f.scope == "none" else f"{f.scale.name} per {f.block if f.scope == 'block' else f.scope}"
        if f.zero_point:
            scale += f" + {f.zero_point.name} zero"
        if f.tensor_scale:
            scale += f" + {f.tensor_scale.name} per tensor"
        rows.append({"format": f.name, "element": f.element.name, "scale": scale,
                     "bits/element": round(bits_per_element(f, d), 4), f"bytes per {d}-vector": f.entry_bytes(d),
                     "arithmetic": f.describe(d)})
    return rows


def model_rows(models: list[str], formats: list[Format]) -> list[dict]:
    """Bytes of KV cache per token for catalog models with every component in one format."""
    rows = []
    for m in models:
        row = {"model": m}
        for f in formats:
            row[f.name] = float(build_layout(m, kv_format=f).bytes_per_token)
        rows.append(row)
    return rows


def quantize_kv(k: torch.Tensor, v: torch.Tensor, fmt: Format):
    """(QuantizedTensor of K, of V): integer formats group keys per channel (KIVI)."""
    if fmt.element.kind == "int":
        return quantize(k, fmt, axis="channel", pad=True), quantize(v, fmt, pad=True)
    return quantize(k, fmt, pad=True), quantize(v, fmt, pad=True)


def error_rows(formats: list[Format], distributions: list[str], shape, seed: int) -> list[dict]:
    """One row per (format, distribution): bits, SQNR of K and V, relative error, cosine,
    max error in steps and the attention-output error."""
    rows = []
    for dist in distributions:
        k, v = sample_kv(shape, dist, seed)
        for f in formats:
            qk, qv = quantize_kv(k, v, f)
            kh, vh = qk.dequantize(), qv.dequantize()
            rows.append({"format": f.name, "distribution": dist, "bits/element": bits_per_element(f, shape[-1]),
                         "sqnr_k_db": sqnr(k, kh), "sqnr_v_db": sqnr(v, vh), "rel_error_k": rel_error(k, kh),
                         "cosine_k": cosine(k, kh), "max_err_steps_k": max_step_error(k, qk),
                         "attention_error": attention_error(k, v, kh, vh, seed=seed)})
    return rows


def finite(v: float, cap: float = 200.0) -> float:
    """Lossless formats have infinite SQNR: cap for plotting and recording."""
    return cap if math.isinf(v) else v


@dataclass
class QuantizersParams(NotebookParams):
    """Notebook 03's parameters, checked on construction; `kv_shape`, `fmts` and `model_names` are resolved."""

    shape: list  # K and V shape: [heads, tokens, head_dim]
    distributions: list  # synthetic KV data (DISTRIBUTIONS)
    formats: list  # formats to compare
    seed: int  # seed of the synthetic data and the attention queries
    models: list  # catalog models for the bytes table (empty: the whole catalog)
    kv_shape: tuple = field(init=False)  # (heads, tokens, head_dim)
    fmts: list = field(init=False, repr=False)  # the formats, looked up
    model_names: list = field(init=False)  # the models of the bytes table

    def __post_init__(self):
        shape = self.need_ints("shape")
        if len(shape) != 3:
            raise ParameterError(f"parameter shape must be [heads, tokens, head_dim], got {self.shape!r}")
        self.kv_shape = tuple(shape)
        self.need_names("distributions", DISTRIBUTIONS)
        self.fmts = [self.need_lookup("formats", get_format, f) for f in self.need_names("formats")]
        for fmt in self.fmts:
            if fmt.element.kind == "int" and shape[1] % fmt.block:
                raise ParameterError(f"parameter shape: tokens ({shape[1]}) must be a multiple of {fmt.name}'s group "
                                     f"of {fmt.block} (KIVI groups keys over tokens)")
        self.need_int("seed", 0)
        known = catalog_names()
        self.model_names = self.need_names("models", known, empty=True) or known
