"""Pack float vectors into a layout Entry's bytes and back, through `kvlab.quant`.

An entry is its parts' packed bytes side by side (each part: element codes, then its own
scale bytes, exactly `Format.entry_bytes` long), zero-padded to the entry's alignment. Per-tensor
scales (FP8 with one FP32 scale per tensor, NVFP4's second level) are kept once per component.
All quantizing is done by `kvlab.quant.quantize`; this module only places its bytes.
"""
from __future__ import annotations

import torch

from ..errors import ShapeError
from ..layout import Entry
from . import quantizer


def encode(x: torch.Tensor, entry: Entry, tensor_scales: list[torch.Tensor] | None = None
           ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Pack x [N, copies, elements] into uint8 [N, copies, entry.nbytes].

    `tensor_scales` (one uint8 tensor per part, from an earlier call) pins per-tensor scales so
    later appends stay on the first chunk's scale; returns the packed rows and those scales."""
    n, copies, elements = x.shape
    if elements != entry.elements:
        raise ShapeError(f"entry holds {entry.elements} elements per copy, got {elements}")
    out = torch.zeros(n, copies, entry.nbytes, dtype=torch.uint8, device=x.device)  # [N, C, entry B]
    scales_out, off, pos = [], 0, 0
    for i, p in enumerate(entry.parts):
        xs = x[..., off:off + p.elements].reshape(n * copies, p.elements)  # [N*C, n_p]
        pinned = tensor_scales[i] if tensor_scales else None
        rows, ts = quantizer.pack(xs, p.fmt, pinned)  # [N*C, part B], per-tensor scale bytes
        out[..., pos:pos + p.nbytes] = rows.reshape(n, copies, p.nbytes)  # [N, C, part B]
        scales_out.append(ts)
        off += p.elements
        pos += p.nbytes
    return out, scales_out


def decode(rows: torch.Tensor, entry: Entry, tensor_scales: list[torch.Tensor] | None,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Unpack uint8 rows [N, copies, entry.nbytes] into [N, copies, elements] in `dtype` (decoded in float32)."""
    n, copies, _ = rows.shape
    out, pos = [], 0
    for i, p in enumerate(entry.parts):
        part = rows[..., pos:pos + p.nbytes].reshape(n * copies, p.nbytes)  # [N*C, part B]
        ts = tensor_scales[i] if tensor_scales else None
        out.append(quantizer.unpack(part, p.fmt, p.elements, ts, dtype).reshape(n, copies, p.elements))  # [N, C, n_p]
        pos += p.nbytes
    if len(out) == 1:
        return out[0]
    return torch.cat(out, dim=-1) if out else rows.new_zeros(n, copies, 0, dtype=dtype)  # [N, C, elements]

