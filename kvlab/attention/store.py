"""A small KV store: entries appended in a kvlab number format, read back dequantized.

Two backends behind one interface (append / read / nbytes / state):
  packed=True   the entries live as packed bytes in kvlab.cache's `ComponentStore` (element codes and
                scale bytes, exactly `Format.entry_bytes` per entry, encoded and decoded by
                kvlab.cache.codec through kvlab.quant): attention reads the real packed cache;
                `nbytes` is the bytes the store's tensors hold.
  packed=False  the dequantized values `kvlab.quant.quantize(x, fmt).dequantize()` are kept as float32
                (fast; any batch size); `nbytes` is entries x `Format.entry_bytes`.
Both hold the same values, except for per-tensor-scaled formats (fp8_e4m3): the packed store pins the scale of
its first append, as a cache does, the unpacked one scales each append on its own. Unscaled float formats (fp32, bf16, fp16) are a dtype cast. A bounded store
(`window`) keeps only its last `window` entries.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..formats import Format, get_format
from .checks import AttentionShapeError, CacheFormatError, need_dims, need_int

_CASTS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def roundtrip(x: torch.Tensor, fmt: str | Format) -> torch.Tensor:
    """`x` as stored in `fmt` and read back (float32), quantized along the last dim."""
    f = get_format(fmt)
    if f.name in _CASTS:
        return x.to(_CASTS[f.name]).to(torch.float32)
    from ..quant import quantize

    pad = f.scope == "block" and x.shape[-1] % f.block != 0  # a partial last block (its scale is still stored)
    return quantize(x.float(), f, pad=pad).dequantize().to(torch.float32)


@dataclass
class KVStore:
    """Entries of one cached component (one width, one format), appended along time."""

    width: int  # elements per entry
    fmt: Format | str = "bf16"  # storage number format
    role: str = "kv"  # what it holds: "k", "v", "latent", "main", "index", "swa", ...
    window: int | None = None  # keep only the last `window` entries (bounded); None grows
    packed: bool = False  # hold packed bytes in a kvlab.cache ComponentStore (one sequence)
    _data: torch.Tensor | None = field(default=None, repr=False)  # [B, N, width] dequantized values (unpacked)
    _packed: object = field(default=None, repr=False)  # the ComponentStore (packed)
    appended: int = 0  # entries ever appended (positions of the kept ones end here)

    def __post_init__(self):
        self.fmt = get_format(self.fmt)
        need_int("width", self.width)
        if self.window is not None:
            need_int("window", self.window)
        if self.packed:
            self._packed = self._new_packed()

    def _new_packed(self):
        from ..cache import ComponentStore
        from ..engines import EXACT
        from ..layout import Component, Entry, Part
        comp = Component(self.role, Entry((Part(self.role, self.width, self.fmt),)), window=self.window)
        return ComponentStore(comp, EXACT, torch.device("cpu"))

    def append(self, x: torch.Tensor) -> torch.Tensor:
        """Append entries x [B, n, width] (stored in the format); returns them as stored (dequantized)."""
        need_dims(f"{self.role} entries", x, 3, "[B, n, width]")
        if x.shape[-1] != self.width:
            raise AttentionShapeError(f"{self.role} entries have width {x.shape[-1]}, the store holds {self.width}")
        if self.packed:
            return self._append_packed(x)
        if self._data is not None and x.shape[0] != self._data.shape[0]:
            raise AttentionShapeError(f"{self.role} entries have batch {x.shape[0]}, the store has {self._data.shape[0]}")
        x = roundtrip(x, self.fmt)
        self._data = x if self._data is None else torch.cat([self._data, x], dim=1)
        if self.window is not None:
            self._data = self._data[:, -self.window:]
        self.appended += x.shape[1]
        return x

    def _append_packed(self, x: torch.Tensor) -> torch.Tensor:
        from ..cache import codec
        if x.shape[0] != 1:
            raise AttentionShapeError(f"a packed {self.role} store holds one sequence; got batch {x.shape[0]}")
        st, n = self._packed, x.shape[1]
        entry = st.component.entry
        t0 = st.tokens
        st.advance(t0 + n)
        if n == 0:
            return x.float()
        rows, ts = codec.encode(x[0].float()[:, None, :], entry, st.tensor_scales)  # [n, 1, entry B]
        if st.tensor_scales is None and any(t is not None for t in ts):
            st.tensor_scales = ts
        pos = torch.arange(t0, t0 + n)
        keep = pos >= t0 + n - self.window if self.window is not None else torch.ones(n, dtype=torch.bool)
        st.write(pos[keep], rows[keep].reshape(int(keep.sum()), -1))
        self.appended += n
        return codec.decode(rows, entry, st.tensor_scales)[:, 0][None]  # [1, n, width]

    def read(self) -> torch.Tensor:
        """The kept entries, dequantized: [B, N, width] float32 (N = 0 when empty)."""
        if self.packed:
            from ..cache import codec
            st = self._packed
            rows = st.read_packed()
            if not len(rows):
                return torch.zeros(1, 0, self.width)
            return codec.decode(rows.reshape(len(rows), 1, -1), st.component.entry, st.tensor_scales)[:, 0][None]
        if self._data is None:
            return torch.zeros(1, 0, self.width)
        return self._data

    @property
    def entries(self) -> int:
        if self.packed:
            return len(self._packed.live_rows())
        return 0 if self._data is None else self._data.shape[1]

    @property
    def first_position(self) -> int:
        """Index (in appended order) of the first kept entry."""
        return self.appended - self.entries

    @property
    def nbytes(self) -> int:
        """Bytes the kept entries take (per sequence): held by the packed tensors, or entries x entry bytes."""
        if self.packed:
            return self._packed.nbytes
        return self.entries * self.fmt.entry_bytes(self.width)

    def clear(self) -> None:
        self._data, self.appended = None, 0
        if self.packed:
            self._packed = self._new_packed()

    # --- offload: the state as one tensor (packed bytes, or values) -------------------------------
    def state(self) -> torch.Tensor | None:
        """What the store holds, as a tensor to move between devices (packed: uint8 pages)."""
        return self._packed.buf.data if self.packed else self._data

    def load_state(self, t: torch.Tensor | None) -> None:
        """Put back a tensor from `state()` (same store, moved)."""
        if self.packed:
            self._packed.buf.data = t
        else:
            self._data = t

    def drop_state(self) -> None:
        """Forget the contents but keep the counters (an offloaded state lives elsewhere)."""
        if self.packed:
            self._packed.buf.data = self._packed.buf.data[:0]
        else:
            self._data = None

    def expect(self, fmt: str | Format | None = None, width: int | None = None) -> "KVStore":
        """Check that this store is in `fmt` with entries of `width`; CacheFormatError otherwise."""
        if fmt is not None and get_format(fmt).name != self.fmt.name:
            raise CacheFormatError(f"{self.role} cache is in {self.fmt.name}, expected {get_format(fmt).name}")
        if width is not None and width != self.width:
            raise CacheFormatError(f"{self.role} cache holds {self.width}-wide entries, expected {width}")
        return self
