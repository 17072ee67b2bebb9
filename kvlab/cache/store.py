"""Byte storage of one cached component of one layer: rows in pages, as an engine allocates them.

A row is one stored position: `copies` entries of `entry.nbytes` bytes (all KV heads of one
token, one latent, one compressed entry, one pending tail token). Rows live in pages of
`per_page` rows, each page `page_bytes` long (rounding padding at its end): with exact storage a
page is one row and nothing is rounded; with a paged engine a page holds `Engine.rows_per_page`
rows (ceil(block_tokens / m)) and its bytes are rounded up to `page_align` (`Engine.page_bytes`).
All pages of a component are one uint8 tensor [pages, page_bytes], reallocated when it grows.

What a component keeps after T tokens:
  growing     ceil(T / m) rows (a compressed entry's slot exists from its first token)
  window W    the last min(T, W) rows, in a ring; paged: as many pages as a window can straddle
  tail        the T mod m pending tokens of a compressor; paged: one page sized for m - 1 pending
              tokens (`Engine.rows_per_page`) while anything is pending.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..engines import Engine
from ..errors import ParameterError
from ..layout import Component


@dataclass
class RowBuffer:
    """Rows of `row_bytes` bytes in pages of `per_page` rows, `page_bytes` per page."""

    row_bytes: int  # bytes of one row
    per_page: int  # rows per page (1 = exact storage)
    page_bytes: int  # bytes per page (>= per_page * row_bytes)
    device: torch.device  # where the bytes live
    data: torch.Tensor = field(init=False)  # uint8 [pages, page_bytes]

    def __post_init__(self):
        self.data = torch.empty(0, self.page_bytes, dtype=torch.uint8, device=self.device)

    @property
    def pages(self) -> int:
        return self.data.shape[0]

    @property
    def capacity(self) -> int:
        return self.pages * self.per_page

    def resize(self, pages: int, keep: int | None = None) -> None:
        """Hold exactly `pages` pages, keeping the first `keep` (default all that fit)."""
        if pages == self.pages:
            return
        # uninitialized: every row is written before it is read; page padding is never read
        new = torch.empty(pages, self.page_bytes, dtype=torch.uint8, device=self.device)  # [P, page B]
        k = min(pages, self.pages if keep is None else keep)
        if k:
            new[:k] = self.data[:k]
        self.data = new

    def _rows(self) -> torch.Tensor:
        """View of the row area: [pages, per_page, row_bytes] (page padding excluded)."""
        return self.data[:, :self.per_page * self.row_bytes].view(self.pages, self.per_page, self.row_bytes)

    def write(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """rows [k, row_bytes] into slots [k] (row indices)."""
        self._rows()[slots // self.per_page, slots % self.per_page] = rows

    def write_range(self, start: int, rows: torch.Tensor) -> None:
        """rows [k, row_bytes] into slots start .. start + k - 1 (no index tensors for exact storage)."""
        if self.per_page == 1:
            self.data[start:start + len(rows)] = rows
        else:
            self.write(torch.arange(start, start + len(rows), device=self.device), rows)

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows at slots [k] -> [k, row_bytes]."""
        return self._rows()[slots // self.per_page, slots % self.per_page]


def _pages_for(rows: int, per_page: int) -> int:
    return -(-rows // per_page)


@dataclass
class ComponentStore:
    """The bytes of one component of one layer, appendable and readable."""

    component: Component  # what is stored (entry, copies, ratio, window / tail)
    engine: Engine  # exact storage or a paged engine
    device: torch.device  # where the bytes live
    tokens: int = 0  # tokens seen so far
    buf: RowBuffer = field(init=False)  # the rows
    tensor_scales: list[torch.Tensor] | None = None  # per-tensor scale bytes, one per part (set on first write)

    def __post_init__(self):
        c = self.component
        if c.window is not None and c.ratio != 1:
            raise ParameterError(f"{c.role}: a windowed component with ratio {c.ratio} is not supported")
        row = c.entry_bytes
        if self.engine.block_tokens is None:
            self.buf = RowBuffer(row, 1, row, self.device)
        else:
            self.buf = RowBuffer(row, self.engine.rows_per_page(c), self.engine.page_bytes(c), self.device)

    # --- how many rows / pages at T tokens ----------------------------------------------------
    @property
    def kind(self) -> str:
        c = self.component
        return "tail" if c.fixed_entries is not None else ("window" if c.window is not None else "growing")

    def rows_at(self, tokens: int) -> int:
        """Rows held after `tokens` tokens (the layout's own count)."""
        return self.component.entries(tokens)

    def pages_at(self, tokens: int) -> int:
        """Pages held after `tokens` tokens."""
        if self.engine.block_tokens is None:
            return self.rows_at(tokens)
        if self.kind == "window":  # the engine's rule: as many pages as the window can straddle
            return self.engine.pages(self.component, tokens)
        return _pages_for(self.rows_at(tokens), self.buf.per_page)

    def ring(self) -> int:
        """Ring size in rows of a window once full (exact: W; paged: its pages' rows)."""
        w = self.component.window
        return self.pages_at(w) * self.buf.per_page if self.engine.block_tokens else w

    def slots(self, rows_idx: torch.Tensor) -> torch.Tensor:
        """Row slots of logical rows (a window's positions wrap around its ring)."""
        return rows_idx % self.ring() if self.kind == "window" else rows_idx

    # --- growth --------------------------------------------------------------------------------
    def advance(self, tokens: int) -> None:
        """Size the storage for `tokens` tokens (called before writing their rows)."""
        self.buf.resize(self.pages_at(tokens))
        self.tokens = tokens

    def live_rows(self) -> torch.Tensor:
        """Logical indices of the rows held, oldest first (window: positions; else entry indices)."""
        c, t = self.component, self.tokens
        if self.kind == "window":
            w = min(t, c.window)
            return torch.arange(t - w, t, device=self.device)
        return torch.arange(self.rows_at(t), device=self.device)

    def write(self, rows_idx: torch.Tensor, packed: torch.Tensor) -> None:
        """packed uint8 [k, row_bytes] at logical rows [k]."""
        self.buf.write(self.slots(rows_idx), packed)

    def write_tiled(self, packed: torch.Tensor, chunk_bytes: int = 1 << 24) -> None:
        """Fill every live row with `packed` [p, row_bytes] repeated, a chunk at a time (bounded temporaries)."""
        rows = self.live_rows()
        if self.kind == "window":  # at most one window: index writes
            tiles = packed.repeat(-(-len(rows) // len(packed)), 1)[:len(rows)]
            self.buf.write(self.slots(rows), tiles)
            return
        reps = max(1, min(-(-len(rows) // len(packed)), chunk_bytes // max(1, packed.numel())))
        block = packed.repeat(reps, 1)  # [<= 16 MiB of rows, row B]
        for a in range(0, len(rows), len(block)):
            self.buf.write_range(a, block[:len(rows) - a])

    def read_packed(self) -> torch.Tensor:
        """Packed rows held, oldest first: uint8 [k, row_bytes]."""
        return self.buf.read(self.slots(self.live_rows()))

    # --- bytes -----------------------------------------------------------------------------------
    def tensors(self) -> list[torch.Tensor]:
        out = [self.buf.data]
        if self.tensor_scales:
            out += [t for t in self.tensor_scales if t is not None]
        return out

    @property
    def nbytes(self) -> int:
        """Bytes this store holds (pages + per-tensor scales)."""
        return sum(t.untyped_storage().nbytes() for t in self.tensors())
