"""A cache stream: one role's tokens of one layer (dense K or V, or the MLA latent with its RoPE key), packed in
kvlab formats (`Stream`) or held as the model's own values (`RawStream`)."""
from __future__ import annotations

import numpy as np
import torch

from ...layout import Component
from .. import kernels
from ..store import RAW, PackedRows


class Stream:
    """One cached stream of a layer (dense K or V, or the MLA latent with its RoPE key): a packed store
    of quantized tokens, then a residual of the newest tokens in the model's dtype.

    Positions: packed rows cover tokens [s0, p0), the residual [p0, tokens)."""

    def __init__(self, stored: Component, batch: int, heads: int, width: int, device, dtype):
        self.stored = stored  # the packed component (its residual split and window)
        self.group = stored.group  # tokens per row (KIVI key groups: G)
        self.window = stored.window  # tokens kept between steps (None: all)
        self.batch, self.heads, self.width = batch, heads, width
        self.dtype = dtype  # the cache's dtype: the residual's, and what `held` returns
        self.packed = PackedRows(stored, batch * heads, device)
        self.pend = torch.zeros(batch, heads, 0, width, dtype=dtype, device=device)  # [B, H, p, W]
        self.tokens = self.s0 = self.p0 = 0
        fast = device.type == "cpu" and kernels.covers(stored.entry, dtype)
        self.decoder = kernels.Decoder(stored.entry, self.group) if fast else None  # the compiled decoder, if it applies

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, n, W] -> [n / G, B*H, G*W] (a key group channel-major: each channel's G tokens together)."""
        b, h, n, w = x.shape
        g = self.group
        if g == 1:  # one token (a decode step) is already in row order: one reshape
            return x.reshape(1, b * h, w) if n == 1 else x.permute(2, 0, 1, 3).reshape(n, b * h, w)
        return x.reshape(b, h, n // g, g, w).permute(2, 0, 1, 4, 3).reshape(n // g, b * h, w * g)

    def held(self) -> torch.Tensor:
        """Every held token, packed ones decoded, then the residual: [B, H, T', W] in the cache's dtype."""
        b, h, w, g = self.batch, self.heads, self.width, self.group
        n, p = self.packed.rows, self.pend.shape[2]
        if n and self.decoder is not None:  # compiled: each packed byte read once, each value written in place
            bf16 = self.dtype == torch.bfloat16
            dst = np.empty((b, h, n * g + p, w), np.uint16 if bf16 else np.float32)  # [B, H, T', W]
            self.decoder.decode(self.packed.numpy(), self.packed.tensor_scales, dst.reshape(b * h, n * g + p, w))
            if p:  # the residual after them (numpy views of both: no torch op per step for the copy)
                dst[:, :, n * g:] = self.pend.view(torch.int16).numpy().view(np.uint16) if bf16 else self.pend.numpy()
            return torch.from_numpy(dst.view(np.int16)).view(self.dtype) if bf16 else torch.from_numpy(dst)
        if n and not p and g == 1 and self.packed.raw == self.dtype:  # raw rows in the cache's dtype: one copy
            return self.packed.store.state().view(self.dtype).view(n, b, h, w).permute(1, 2, 0, 3).contiguous()
        out = torch.empty(b, h, n * g + p, w, dtype=self.dtype, device=self.pend.device)
        if n:  # decoded rows go straight into place (one conversion to the cache's dtype on the way)
            r = self.packed.read()  # [N, B*H, G*W]
            if g == 1:
                out[:, :, :n].copy_(r.view(n, b, h, w).permute(1, 2, 0, 3))
            else:
                out[:, :, :n * g].view(b, h, n, g, w).copy_(r.view(n, b, h, w, g).permute(1, 2, 0, 4, 3))
        if p:
            out[:, :, n * g:].copy_(self.pend)
        return out

    def update(self, x: torch.Tensor) -> torch.Tensor:
        """Store x [B, H, S, W]; return every held token then the new ones, decoded: [B, H, T', W]."""
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        self.tokens += x.shape[2]
        res = self.stored.residual
        if res is None:  # nothing waits: the new tokens go straight into the packed store
            self.packed.append(self._rows(x))
            self.p0 = self.tokens
        else:
            self.pend = torch.cat([self.pend, x], dim=2)
            q = res.quantized(self.tokens)  # tokens that have left the residual
            if q > self.p0:
                n = q - self.p0
                self.packed.append(self._rows(self.pend[:, :, :n]))
                self.pend = self.pend[:, :, n:].clone()  # own storage: the quantized tokens' bytes are freed
                self.p0 = q
        out = self.held()
        if self.window is not None:
            self._evict(self.tokens - self.window)
        return out

    def _evict(self, lo: int) -> None:
        """Keep tokens at positions >= lo."""
        if lo > self.s0:
            drop = min(lo, self.p0) - self.s0
            self.packed.drop_front(drop // self.group)
            self.s0 += drop
        if lo > self.p0:
            self.pend = self.pend[:, :, lo - self.p0:].clone()
            self.p0 = self.s0 = lo

    def tensors(self) -> list[torch.Tensor]:
        return self.packed.tensors() + [self.pend]

    @property
    def count(self) -> int:
        """Tokens held (packed and waiting)."""
        return self.tokens - self.s0

    def keep(self, slots: torch.Tensor) -> None:
        """Keep the held tokens at `slots` [B, H, n] (a press's choice per head, in position order); the
        others' bytes are freed. Packed rows of single tokens are gathered byte for byte; otherwise (a
        residual, KIVI key groups) the kept tokens are decoded and stored again, as a fresh stream of n tokens
        (the layout's rule for n tokens: the newest wait in the residual, groups close every G)."""
        b, h, n = slots.shape
        if not self.pend.shape[2] and self.group == 1 and self.window is None and self.s0 == 0:
            rows = self.packed.packed()  # [N, B*H, E] uint8
            idx = slots.reshape(b * h, n).t()[..., None].expand(-1, -1, rows.shape[2])  # [n, B*H, E]
            self.packed.store.load_state(rows.gather(0, idx).reshape(n, -1).contiguous())  # own storage
            self.packed.store.tokens = n
            self.packed._np = None
            self.tokens = self.p0 = n
            return
        kept = self.held().gather(2, slots[..., None].expand(-1, -1, -1, self.width))  # [B, H, n, W]
        self.packed = PackedRows(self.stored, b * h, self.pend.device)
        self.pend = self.pend[:, :, :0].clone()
        self.tokens = self.s0 = self.p0 = 0
        self.update(kept)

    def reorder(self, index: torch.Tensor) -> None:
        self.packed.reorder(index, self.batch)
        self.pend = self.pend.index_select(0, index.to(self.pend.device))


class RawStream(Stream):
    """A stream whose entries are the model's own values (BF16 / FP16 / FP32 in the cache's dtype, one token a row,
    nothing waiting in a residual): its bytes already are what attention reads, so it holds them laid out as
    attention reads them, [B, H, T, W], grown by one concatenation a step as transformers' DynamicLayer grows —
    no re-layout per step, the same bytes as the packed rows (so the layout's count still holds exactly)."""

    def __init__(self, stored: Component, batch: int, heads: int, width: int, device, dtype):
        super().__init__(stored, batch, heads, width, device, dtype)
        self.packed = None  # no packed rows: `data` is the store
        self.data = torch.zeros(batch, heads, 0, width, dtype=dtype, device=device)  # [B, H, held, W]

    @staticmethod
    def applies(stored: Component, dtype: torch.dtype) -> bool:
        """Every part of the entry raw in `dtype` (an MLA latent and its RoPE key side by side, as the stream
        carries them), unaligned, one token a row, no residual."""
        e = stored.entry
        return (e.align == 1 and all(RAW.get(p.fmt.name) == dtype for p in e.parts) and stored.residual is None
                and stored.group == 1)

    def held(self) -> torch.Tensor:
        return self.data

    def update(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        self.tokens += x.shape[2]
        self.p0 = self.tokens
        out = self.data = torch.cat([self.data, x], dim=2)  # [B, H, held + S, W]
        if self.window is not None:
            self._evict(self.tokens - self.window)
        return out

    def _evict(self, lo: int) -> None:
        if lo > self.s0:
            self.data = self.data[:, :, lo - self.s0:].clone()  # own storage: the evicted tokens' bytes are freed
            self.s0 = lo

    def tensors(self) -> list[torch.Tensor]:
        return [self.data]

    def keep(self, slots: torch.Tensor) -> None:
        self.data = self.data.gather(2, slots[..., None].expand(-1, -1, -1, self.width))  # [B, H, n, W]
        self.tokens = self.p0 = slots.shape[2]
        self.s0 = 0

    def reorder(self, index: torch.Tensor) -> None:
        self.data = self.data.index_select(0, index.to(self.data.device))

