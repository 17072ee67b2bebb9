"""Values as a format stores them: quantize, then read back, without keeping the bytes.

For the weight-free accuracy studies (kvlab.attention.evaluate), where what matters is the stored value
and the bytes come from the formats table; the packed bytes themselves live in kvlab.cache's stores.
"""
from __future__ import annotations

import torch

from ..formats import Format, get_format
from .api import quantize
from .tensor import TORCH_DTYPES


def roundtrip(x: torch.Tensor, fmt: str | Format) -> torch.Tensor:
    """`x` as stored in `fmt` and read back (float32, same shape), quantized along the last dim.

    Unscaled float formats (fp32, bf16, fp16) are a dtype cast; a block format takes a partial last block
    (its scale is still stored)."""
    f = get_format(fmt)
    if f.name in TORCH_DTYPES:
        return x.to(TORCH_DTYPES[f.name]).to(torch.float32)
    pad = f.scope == "block" and x.shape[-1] % f.block != 0
    return quantize(x.float(), f, pad=pad).dequantize().to(torch.float32)
