"""The one seam between the cache and the quantizers (`kvlab.quant`, issue 3).

`pack` turns vectors into their packed bytes per the formats table; `unpack` reverses it.
Unscaled float formats (bf16 / fp16 / fp32) are their raw bytes.
"""
from __future__ import annotations

import torch

from ..errors import UnknownFormatError
from ..formats import Format

RAW = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def pack(x: torch.Tensor, fmt: Format, tensor_scale: torch.Tensor | None = None
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [M, n] float -> (uint8 [M, fmt.entry_bytes(n)], uint8 [fmt.tensor_bytes] or None)."""
    m, n = x.shape
    if fmt.name in RAW:
        return x.to(RAW[fmt.name]).contiguous().view(torch.uint8).reshape(m, fmt.entry_bytes(n)), None
    raise UnknownFormatError(f"format {fmt.name}: packing needs kvlab.quant (issue 3)")


def unpack(rows: torch.Tensor, fmt: Format, n: int, tensor_scale: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 [M, fmt.entry_bytes(n)] -> float32 [M, n]."""
    if fmt.name in RAW:
        return rows.contiguous().view(RAW[fmt.name]).float()
    raise UnknownFormatError(f"format {fmt.name}: unpacking needs kvlab.quant (issue 3)")
