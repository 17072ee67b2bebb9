"""The one seam between the transformers cache and kvlab.cache: packed rows of one layout component.

`PackedRows` keeps the entries of one `kvlab.layout.Component` (dense K or V heads, an MLA latent +
RoPE key, a KIVI key group of G tokens) as the exact bytes `kvlab.cache.codec` packs through
`kvlab.quant.quantize`, in a `kvlab.cache.store.RowBuffer` with exact storage (one row per stored
position: the batch's KV heads side by side). Rows are appended at the end and evicted at the front
(a sliding window), so the bytes it holds are always `rows x row bytes` plus the per-tensor scales.
"""
from __future__ import annotations

import torch

from ..cache import codec
from ..cache.store import RowBuffer
from ..layout import Component

RAW = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}  # stored as their own bytes


class PackedRows:
    """Packed entries of one component for `copies` vectors per position (batch x KV heads)."""

    def __init__(self, component: Component, copies: int, device: torch.device):
        self.entry = component.entry  # what one stored vector is (parts and their formats)
        self.copies = copies  # vectors per row: batch x KV heads
        row = copies * self.entry.nbytes
        self.buf = RowBuffer(row, 1, row, device)  # exact storage: a page is one row
        self.tensor_scales: list[torch.Tensor] | None = None  # per-tensor scale bytes, pinned by the first write
        parts = self.entry.parts
        self._raw = RAW.get(parts[0].fmt.name) if len(parts) == 1 and self.entry.align == 1 else None

    @property
    def rows(self) -> int:
        return self.buf.pages

    def append(self, x: torch.Tensor) -> None:
        """Pack x [n, copies, elements] (float) into n new rows."""
        if not len(x):
            return
        if self._raw is not None:  # raw BF16 / FP16 / FP32: the bytes are the values (what codec would store)
            packed = x.to(self._raw).contiguous().view(torch.uint8)
        else:
            packed, scales = codec.encode(x, self.entry, self.tensor_scales)  # [n, copies, entry B]
            if self.tensor_scales is None and any(s is not None for s in scales):
                self.tensor_scales = scales
        # exact storage (one row per page) grows by exactly n rows: the old rows and the new in one copy
        self.buf.data = torch.cat([self.buf.data, packed.reshape(len(x), -1)])

    def drop_front(self, n: int) -> None:
        """Evict the n oldest rows (a sliding window moving on); the rest move into a buffer of their own size."""
        if n > 0:
            self.buf.data = self.buf.data[n:].clone()  # a copy, so the evicted rows' storage is freed

    def read(self) -> torch.Tensor:
        """Every row decoded: [rows, copies, elements], float32 (raw formats: a view of their own dtype)."""
        rows = self.buf.data.view(self.rows, self.copies, self.entry.nbytes)  # [N, C, entry B]
        if self._raw is not None:
            return rows.view(self._raw)
        return codec.decode(rows, self.entry, self.tensor_scales)

    def tensors(self) -> list[torch.Tensor]:
        return [self.buf.data] + [t for t in (self.tensor_scales or []) if t is not None]

    def reorder(self, index: torch.Tensor, batch: int) -> None:
        """Reorder the batch (beam search): rows are [N, batch, heads, entry B]."""
        d = self.buf.data.view(self.rows, batch, -1)
        self.buf.data = d.index_select(1, index.to(d.device)).reshape(self.rows, -1).contiguous()
