"""The one seam between the cache and the quantizers: `kvlab.quant.quantize` (issue 3).

`pack` turns vectors into the bytes of one stored entry part (codes, then the part's own scale
bytes: `Format.entry_bytes` long) plus the format's per-tensor scale bytes, if any; `unpack`
rebuilds a `QuantizedTensor` from those bytes and dequantizes it. Every format of the table goes
through this path, BF16 / FP16 / FP32 included (stored as their raw bytes by kvlab.quant).
"""
from __future__ import annotations

import torch

from ..formats import Format
from ..quant import QuantizedTensor, quantize


def pack(x: torch.Tensor, fmt: Format, tensor_scale: torch.Tensor | None = None
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [M, n] float -> (uint8 [M, fmt.entry_bytes(n)], uint8 [fmt.tensor_bytes] or None).

    `tensor_scale` (bytes from an earlier call) pins the per-tensor scale, as a serving engine
    keeps one k_scale / v_scale for the whole cache rather than rescaling what it has stored."""
    m, n = x.shape
    opts = {}
    if tensor_scale is not None and fmt.scope == "tensor":
        opts["scale"] = tensor_scale.contiguous().view(torch.float32).reshape(())
    elif tensor_scale is not None and fmt.tensor_scale is not None:
        opts["global_scale"] = tensor_scale.contiguous().view(torch.float32).reshape(())
    q = quantize(x, fmt, pad=fmt.scope == "block", **opts)
    codes = q.codes.reshape(m, fmt.data_bytes(n))  # [M, data B]
    if fmt.scope == "tensor":
        return codes, q.scales.reshape(-1)
    rows = torch.cat([codes, q.scales.reshape(m, fmt.scale_bytes(n))], dim=-1)  # [M, entry B]
    return rows, (q.global_scale.reshape(-1) if q.global_scale is not None else None)


def unpack(rows: torch.Tensor, fmt: Format, n: int, tensor_scale: torch.Tensor | None = None,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [M, fmt.entry_bytes(n)] (+ per-tensor scale bytes) -> [M, n] in `dtype` (decoded in float32)."""
    m, d = rows.shape[0], fmt.data_bytes(n)
    codes = rows[:, :d]  # decoders read uint8 codes through any strides
    if fmt.element.bits > 8:  # raw BF16 / FP16 / FP32 bytes are viewed as their dtype: own, aligned storage
        codes = codes.clone()
    if fmt.scope == "tensor":
        scales, gs = tensor_scale, None
    else:
        scales, gs = rows[:, d:], (tensor_scale if fmt.tensor_scale is not None else None)
        if scales.is_contiguous():  # one row: its own, aligned storage (decoders copy strided ones anyway)
            scales = scales.clone()
    q = QuantizedTensor(fmt=fmt, shape=(m, n), dtype=torch.float32, codes=codes, scales=scales, global_scale=gs)
    return q.dequantize(dtype)
