"""A small KV store: entries appended in a kvlab number format, read back dequantized.

Values go through `kvlab.quant.quantize(x, fmt).dequantize()` on write (the reference
quantizers), so what attention reads is exactly what the format can hold; bytes come from
`Format.entry_bytes`. Unscaled float formats (fp32, bf16, fp16) are a dtype cast and need no
quantizer. A bounded store (`window`) keeps only its last `window` entries.
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
    try:
        from ..quant import quantize
    except ImportError:  # the reference quantizers (issue 3) are not in this tree
        raise CacheFormatError(f"format {f.name} needs kvlab.quant.quantize (reference quantizers); "
                               f"only {', '.join(_CASTS)} work without it") from None
    pad = f.scope == "block" and x.shape[-1] % f.block != 0  # a partial last block (its scale is still stored)
    return quantize(x.float(), f, pad=pad).dequantize().to(torch.float32)


@dataclass
class KVStore:
    """Entries of one cached component (one width, one format), appended along time."""

    width: int  # elements per entry
    fmt: Format | str = "bf16"  # storage number format
    role: str = "kv"  # what it holds: "k", "v", "latent", "main", "index", "swa", ...
    window: int | None = None  # keep only the last `window` entries (bounded); None grows
    _data: torch.Tensor | None = field(default=None, repr=False)  # [B, N, width] dequantized values
    appended: int = 0  # entries ever appended (positions of the kept ones end here)

    def __post_init__(self):
        self.fmt = get_format(self.fmt)
        need_int("width", self.width)
        if self.window is not None:
            need_int("window", self.window)

    def append(self, x: torch.Tensor) -> torch.Tensor:
        """Append entries x [B, n, width] (stored in the format); returns them as stored (dequantized)."""
        need_dims(f"{self.role} entries", x, 3, "[B, n, width]")
        if x.shape[-1] != self.width:
            raise AttentionShapeError(f"{self.role} entries have width {x.shape[-1]}, the store holds {self.width}")
        if self._data is not None and x.shape[0] != self._data.shape[0]:
            raise AttentionShapeError(f"{self.role} entries have batch {x.shape[0]}, the store has {self._data.shape[0]}")
        x = roundtrip(x, self.fmt)
        self._data = x if self._data is None else torch.cat([self._data, x], dim=1)
        if self.window is not None:
            self._data = self._data[:, -self.window:]
        self.appended += x.shape[1]
        return x

    def read(self) -> torch.Tensor:
        """The kept entries, dequantized: [B, N, width] float32 (N = 0 when empty)."""
        if self._data is None:
            return torch.zeros(1, 0, self.width)
        return self._data

    @property
    def entries(self) -> int:
        return 0 if self._data is None else self._data.shape[1]

    @property
    def first_position(self) -> int:
        """Index (in appended order) of the first kept entry."""
        return self.appended - self.entries

    @property
    def nbytes(self) -> int:
        """Bytes the kept entries take in the format (per sequence), from kvlab.formats."""
        return self.entries * self.fmt.entry_bytes(self.width)

    def clear(self) -> None:
        self._data, self.appended = None, 0

    def expect(self, fmt: str | Format | None = None, width: int | None = None) -> "KVStore":
        """Check that this store is in `fmt` with entries of `width`; CacheFormatError otherwise."""
        if fmt is not None and get_format(fmt).name != self.fmt.name:
            raise CacheFormatError(f"{self.role} cache is in {self.fmt.name}, expected {get_format(fmt).name}")
        if width is not None and width != self.width:
            raise CacheFormatError(f"{self.role} cache holds {self.width}-wide entries, expected {width}")
        return self
