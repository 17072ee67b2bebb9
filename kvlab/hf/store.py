"""The one seam between the transformers cache and kvlab.cache: packed rows of one layout component.

`PackedRows` keeps the entries of one `kvlab.layout.Component` (dense K or V heads, an MLA latent +
RoPE key, a KIVI key group of G tokens, a pooled entry) in a `kvlab.cache.store` KVStore: exact storage,
one row per stored entry holding the batch's copies side by side, packed by `kvlab.cache.codec` through
`kvlab.quant.quantize` (the store's `encode`, which also pins a per-tensor scale at the first write).

The store is used as a plain growing store of rows, oldest first: the transformers layer decides which
tokens are rows (a residual keeps the newest ones unquantized, a KIVI key group becomes a row only once
its G tokens are in) and evicts a sliding window's oldest rows itself (`drop_front`). kvlab's
WindowStore ring keeps its last W tokens in rotated slots and knows no residual split; rows kept in
order let the decoder (kvlab.hf.kernels) write them straight into the tensor attention reads.
The bytes held are always `rows x row bytes` plus the per-tensor scales: `Layout.session`'s count.
"""
from __future__ import annotations

import numpy as np
import torch

from ..cache.store import GrowingStore, store_for
from ..layout import Component
from ..quant.fp8 import encode_fp8

RAW = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}  # stored as their own bytes


class PackedRows:
    """Packed entries of one component for `copies` vectors per row (batch x KV heads)."""

    def __init__(self, component: Component, copies: int, device: torch.device):
        self.entry = component.entry  # what one stored vector is (parts and their formats)
        self.copies = copies  # vectors per row: batch x KV heads
        self.store: GrowingStore = store_for(Component(component.role, component.entry, copies), device=device)
        parts = self.entry.parts
        self.raw = RAW.get(parts[0].fmt.name) if len(parts) == 1 and self.entry.align == 1 else None  # raw dtype
        self.entry_bytes = self.entry.nbytes  # bytes of one stored vector
        f = parts[0].fmt
        one_scale = len(parts) == 1 and self.entry.align == 1 and f.scope == "tensor" and f.zero_point is None
        self.fp8 = f.element if one_scale and f.element.name in ("e4m3", "e5m2") else None  # per-tensor FP8
        self._np = None  # a numpy view of the rows held (the same bytes), rebuilt after they change

    @property
    def rows(self) -> int:
        return self.store.tokens

    @property
    def tensor_scales(self) -> list[torch.Tensor | None] | None:
        return self.store.tensor_scales

    def append(self, x: torch.Tensor) -> None:
        """Pack x [n, copies, elements] (float) into n new rows."""
        n = len(x)
        if not n:
            return
        if self.raw is not None:  # raw BF16 / FP16 / FP32: the bytes are the values (what codec would store)
            packed = (x if x.dtype == self.raw else x.to(self.raw)).reshape(n, -1).contiguous().view(torch.uint8)
        elif self.fp8 is not None and self.store.tensor_scales is not None:
            # per-tensor FP8 once its scale is pinned: kvlab.quant.quantize's own two steps for this scope
            # (x / s, then encode_fp8's saturating RNE), without its per-call checks and packing of parts
            s = self.store.tensor_scales[0].contiguous().view(torch.float32).reshape(())
            packed = encode_fp8(x.float() / s, self.fp8).reshape(n, -1)  # [n, row B]
        else:
            packed = self.store.encode(x)  # [n, row B]
        self.store.append_packed(packed)
        self._np = None

    def drop_front(self, n: int) -> None:
        """Evict the n oldest rows (a sliding window moving on): the rest move into a buffer of their own size."""
        if n > 0:
            self.store.load_state(self.store.state()[n:].clone())  # a copy, so the evicted rows' storage is freed
            self.store.tokens -= n
            self._np = None

    def packed(self) -> torch.Tensor:
        """The rows held, oldest first: uint8 [rows, copies, entry B] (a view of the store's pages)."""
        return self.store.state().view(self.rows, self.copies, self.entry_bytes)

    def numpy(self) -> np.ndarray:
        """`packed()` as a numpy array over the same bytes (no copy; kept until the rows change)."""
        if self._np is None:
            self._np = self.packed().numpy()
        return self._np

    def read(self) -> torch.Tensor:
        """Every row decoded: [rows, copies, elements], float32 (raw formats: a view in their own dtype)."""
        rows = self.packed()
        if self.raw is not None:
            return rows.view(self.raw)
        return self.store.decode(rows.reshape(self.rows, -1))

    def tensors(self) -> list[torch.Tensor]:
        return self.store.tensors()

    def reorder(self, index: torch.Tensor, batch: int) -> None:
        """Reorder the batch (beam search): rows are [N, batch, heads, entry B]."""
        d = self.store.state().view(self.rows, batch, -1)
        self.store.load_state(d.index_select(1, index.to(d.device)).reshape(self.rows, -1).contiguous())
        self._np = None
