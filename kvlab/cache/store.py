"""The KV store: one cached component of one layer of one sequence, held as packed bytes in its format.

kvlab has one store, used by the attention prototype (kvlab.attention), the measured cache (`KVCache`)
and the transformers cache (kvlab.hf). Its kinds are classes over one interface, and the component
(`kvlab.layout.Component`) picks the class, as a transformers config's `layer_types` picks a cache layer:

  GrowingStore  every entry: ceil(T / m) rows after T tokens (a compressed entry's row exists from its first
                token); paged: ceil(rows / rows per page) pages
  WindowStore   the last min(T, W) tokens in a ring; paged: as many pages as a window can straddle
  StateStore    a linear-attention / SSM layer's fixed-size state (`Component.state`): one row per sequence,
                overwritten as tokens arrive; paged: one page (padded to the engine's state page)
  TailStore     a compressor tail (`Component.tail_of`): the T mod m tokens its owner has not closed into an
                entry yet, in a ring of m - 1 rows; paged: one page sized for m - 1 rows while any is pending

The interface (`KVStore`):
  append(x)    n new tokens' vectors x [n, copies, elements]; returns them as stored (quantized, read back)
  read()       the entries held, oldest first, dequantized: float32 [entries, copies, elements]
  held_bytes   bytes its tensors hold (pages + per-tensor scales): what measurement compares with the layout
  length       tokens appended so far (`entries`: rows held now)
`KVCache` also uses the lower level: advance (size for T tokens), write (values at given rows), fill.

A row is one stored position: `copies` entries of `entry.nbytes` bytes (all KV heads of one token, one
latent, one compressed entry, one pending tail token). Rows live in pages (`RowBuffer`): with exact storage
a page is one row and nothing is rounded; with a paged engine a page holds `Engine.rows_per_page` rows and
is `Engine.page_bytes` long. Bytes are packed and unpacked by kvlab.cache.codec (through kvlab.quant); a
per-tensor scale (FP8 with one FP32 scale, NVFP4's second level) is pinned by the first append, as a
serving engine keeps one k_scale / v_scale rather than rescaling what it has stored.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from ..checks import cdiv, need_int, need_type
from ..engines import EXACT, Engine
from ..errors import CacheFormatError, ParameterError, ShapeError, WrongTypeError
from ..formats import Format, get_format
from ..layout import Component, Entry, Part
from . import codec
from .memory import resolve_device, storage_bytes


@dataclass
class RowBuffer:
    """Rows of `row_bytes` bytes in pages of `per_page` rows, `page_bytes` per page."""

    row_bytes: int  # bytes of one row
    per_page: int  # rows per page (1 = exact storage)
    page_bytes: int  # bytes per page (>= per_page * row_bytes)
    device: torch.device  # where the bytes live
    data: torch.Tensor = field(init=False)  # uint8 [pages, page_bytes]

    def __post_init__(self):
        self.data = torch.empty(0, self.page_bytes, dtype=torch.uint8, device=self.device)  # [0, page B]

    @property
    def pages(self) -> int:
        return self.data.shape[0]

    def resize(self, pages: int) -> None:
        """Hold exactly `pages` pages, keeping the first ones that fit."""
        if pages == self.pages:
            return
        # uninitialized: every row is written before it is read; page padding is never read
        new = torch.empty(pages, self.page_bytes, dtype=torch.uint8, device=self.device)  # [P, page B]
        k = min(pages, self.pages)
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


@dataclass
class KVStore(ABC):
    """The store interface: one component of one layer of one sequence, in packed bytes (see the module
    docstring). Build one with `store_for(component)` or `vector_store(width, fmt)`; the subclasses differ
    only in which rows they keep (`_first_row`, `_end_row`), where a row sits (`slots`) and how many pages
    an engine gives them (`_paged_pages`)."""

    component: Component  # what is stored (entry, copies, ratio, window / tail)
    engine: Engine = EXACT  # exact storage or a paged engine
    device: torch.device | str = "cpu"  # where the bytes live
    tokens: int = field(default=0, init=False)  # tokens appended so far
    tensor_scales: list[torch.Tensor | None] | None = field(default=None, init=False)  # per part; set on first write
    buf: RowBuffer = field(init=False, repr=False)  # the rows

    def __post_init__(self):
        self.device = resolve_device(self.device)
        need_type("engine", self.engine, Engine, "a kvlab.engines.Engine")
        self._check(self.component)
        self.reset()

    @abstractmethod
    def _check(self, c: Component) -> None:
        """Refuse a component this kind of store does not hold."""

    # --- the interface ------------------------------------------------------------------------------
    def append(self, x: torch.Tensor) -> torch.Tensor:
        """Append n tokens' vectors x [n, copies, elements]; returns them as stored (float32, same shape).

        Every row is encoded (the first append pins a per-tensor scale over all of them); the rows the
        store keeps (all, a window's last W, a tail's pending ones) are written."""
        c = self.component
        if c.ratio != 1 and c.tail_of is None:
            raise ParameterError(f"{c.key}: a compressed component's entries are written by its compressor "
                                 "(KVCache), not appended token by token")
        self._check_values(x)
        t0, n = self.tokens, x.shape[0]
        if n == 0:
            return x.float()
        packed = self.encode(x.to(self.device))  # [n, row B]
        self.advance(t0 + n)
        pos = torch.arange(t0, t0 + n, device=self.device)  # [n] token positions
        keep = pos >= self._first_row(t0 + n)  # [n] the rows this store holds
        self.buf.write(self.slots(pos[keep]), packed[keep])
        return self.decode(packed)

    def read(self) -> torch.Tensor:
        """The entries held, oldest first, dequantized: float32 [entries, copies, elements]."""
        return self.decode(self.read_packed())

    @property
    def held_bytes(self) -> int:
        """Bytes this store's tensors hold (pages + per-tensor scales)."""
        return storage_bytes(self.tensors())

    @property
    def length(self) -> int:
        """Tokens appended so far."""
        return self.tokens

    @property
    def entries(self) -> int:
        """Rows held now (the layout's count: `Component.entries`)."""
        return self.component.entries(self.tokens)

    def reset(self) -> None:
        """Empty the store (no tokens, no pinned scale, no pages)."""
        c = self.component
        paged = self.engine.block_tokens is not None
        self.tokens, self.tensor_scales = 0, None
        self.buf = RowBuffer(c.entry_bytes, self.engine.rows_per_page(c) if paged else 1,
                             self.engine.page_bytes(c) if paged else c.entry_bytes, self.device)

    def expect(self, fmt: str | Format | None = None, width: int | None = None) -> KVStore:
        """Check that the entries are in `fmt` and `width` elements wide; CacheFormatError otherwise."""
        e, role = self.component.entry, self.component.key
        if fmt is not None and get_format(fmt).name != e.format_name:
            raise CacheFormatError(f"{role} cache is in {e.format_name}, expected {get_format(fmt).name}")
        if width is not None and width != e.elements:
            raise CacheFormatError(f"{role} cache holds {e.elements}-wide entries, expected {width}")
        return self

    # --- offload: the pages as one tensor, to move between devices -----------------------------------
    def state(self) -> torch.Tensor:
        """The pages, uint8 [pages, page_bytes] (per-tensor scales stay)."""
        return self.buf.data

    def load_state(self, pages: torch.Tensor) -> None:
        """Put back pages from `state()` (same store, possibly moved and back)."""
        self.buf.data = pages

    def drop_state(self) -> None:
        """Forget the pages but keep the counters (an offloaded state lives elsewhere)."""
        self.buf.data = self.buf.data[:0]

    # --- which rows, where ------------------------------------------------------------------------------
    def _end_row(self, tokens: int) -> int:
        """Logical rows written after `tokens` tokens (a token position for windows and tails)."""
        return tokens

    def _first_row(self, tokens: int) -> int:
        """First logical row held after `tokens` tokens."""
        return self._end_row(tokens) - self.component.entries(tokens)

    def slots(self, rows: torch.Tensor) -> torch.Tensor:
        """Buffer slots [k] of logical rows [k]."""
        return rows

    def _paged_pages(self, tokens: int) -> int:
        """Pages held after `tokens` tokens under a paged engine (the engine's own rule)."""
        return self.engine.pages(self.component, tokens)

    def pages_at(self, tokens: int) -> int:
        """Pages held after `tokens` tokens (exact storage: one per row)."""
        if self.engine.block_tokens is None:
            return self.component.entries(tokens)
        return self._paged_pages(tokens)

    def live_rows(self) -> torch.Tensor:
        """Logical indices [entries] of the rows held, oldest first."""
        return torch.arange(self._first_row(self.tokens), self._end_row(self.tokens), device=self.device)

    # --- bytes in, bytes out ------------------------------------------------------------------------------
    def _check_values(self, x: torch.Tensor) -> None:
        c = self.component
        need_type(f"{c.key} values", x, torch.Tensor, "a float tensor [n, copies, elements]")
        if x.is_complex() or x.dtype == torch.bool:
            raise WrongTypeError(f"{c.key} values are {x.dtype}; the store holds real values (a complex tensor "
                                 "would lose its imaginary part): pass a float tensor")
        if x.dim() != 3:
            raise ShapeError(f"{c.key} values must be a tensor [n, copies, elements], got {tuple(x.shape)}")
        if x.shape[-1] != c.entry.elements:
            raise ShapeError(f"{c.key} entries have width {x.shape[-1]}, the store holds {c.entry.elements}")
        if x.shape[1] != c.copies:
            raise ShapeError(f"{c.key} entries have {x.shape[1]} copies, the store holds {c.copies}")

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Pack values x [k, copies, elements] into rows uint8 [k, row_bytes], pinning a per-tensor scale."""
        rows, scales = codec.encode(x.float(), self.component.entry, self.tensor_scales)  # [k, C, entry B]
        if self.tensor_scales is None and any(t is not None for t in scales):
            self.tensor_scales = scales
        return rows.reshape(x.shape[0], self.component.entry_bytes)  # [k, row B]

    def decode(self, rows: torch.Tensor) -> torch.Tensor:
        """Unpack rows uint8 [k, row_bytes] into float32 [k, copies, elements]."""
        c = self.component
        if not len(rows):
            return torch.zeros(0, c.copies, c.entry.elements, device=self.device)
        return codec.decode(rows.reshape(len(rows), c.copies, c.entry.nbytes), c.entry, self.tensor_scales)

    def advance(self, tokens: int) -> None:
        """Size the storage for `tokens` tokens (before writing their rows)."""
        self.buf.resize(self.pages_at(tokens))
        self.tokens = tokens

    def write(self, rows: torch.Tensor, x: torch.Tensor) -> None:
        """Values x [k, copies, elements] at logical rows [k] (rows held after `advance`)."""
        self.buf.write(self.slots(rows), self.encode(x))

    def read_packed(self) -> torch.Tensor:
        """Packed rows held, oldest first: uint8 [entries, row_bytes]."""
        return self.buf.read(self.slots(self.live_rows()))

    def fill(self, tokens: int, generator: torch.Generator, pool: int = 16) -> None:
        """The state after `tokens` tokens of random content, from empty: `pool` seeded random vectors are
        quantized once and their bytes tiled over every row held (the bytes are exactly those of a store
        that saw `tokens` tokens)."""
        tokens, pool = need_int("tokens", tokens, 0), need_int("pool", pool, 1)
        need_type("generator", generator, torch.Generator, "a torch.Generator")
        if self.tokens:
            raise ParameterError("fill() builds a store from empty; this one already holds tokens")
        self.advance(tokens)
        rows = self.live_rows()
        if not len(rows):
            return
        c = self.component
        x = torch.randn(min(pool, len(rows)), c.copies, c.entry.elements, generator=generator)  # [p, C, E]
        self._write_tiled(rows, self.encode(x.to(self.device)))

    def _write_tiled(self, rows: torch.Tensor, packed: torch.Tensor) -> None:
        """packed [p, row B] repeated over rows [k] (a bounded store: at most one window of rows)."""
        tiles = packed.repeat(cdiv(len(rows), len(packed)), 1)[:len(rows)]  # [k, row B]
        self.buf.write(self.slots(rows), tiles)

    def tensors(self) -> list[torch.Tensor]:
        """The tensors it holds: the pages, then any per-tensor scales."""
        return [self.buf.data] + self.scale_tensors()

    def scale_tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.tensor_scales or []) if t is not None]


@dataclass
class GrowingStore(KVStore):
    """Every entry of a growing component: one row per token, or per m tokens when compressed."""

    def _check(self, c: Component) -> None:
        if not c.grows:
            raise ParameterError(f"{c.key} is bounded (window or tail); a GrowingStore holds growing components")

    def _end_row(self, tokens: int) -> int:
        return cdiv(tokens, self.component.ratio)

    def _paged_pages(self, tokens: int) -> int:
        return cdiv(self.component.entries(tokens), self.buf.per_page)

    def append_packed(self, packed: torch.Tensor) -> None:
        """Packed rows [k, row_bytes] of the next k tokens (one row per token), after the rows held: what a cache
        does at each step. Exact storage (a page per row) grows by one concatenation into a buffer of exactly the
        rows held; paged storage sizes its pages first (`advance`), then writes the rows in place."""
        if self.component.ratio != 1:
            raise ParameterError(f"{self.component.key}: append_packed adds one row per token; this component keeps "
                                 f"one entry per {self.component.ratio} tokens")
        n0, b = self.tokens, self.buf
        if b.per_page == 1 and b.page_bytes == b.row_bytes:
            b.data = torch.cat([b.data, packed])  # [n0 + k, row B]
            self.tokens = n0 + len(packed)
        else:
            self.advance(n0 + len(packed))
            b.write_range(n0, packed)

    def _write_tiled(self, rows: torch.Tensor, packed: torch.Tensor, chunk_bytes: int = 1 << 24) -> None:
        """Rows 0 .. k-1 in slot order, a chunk of at most `chunk_bytes` at a time (bounded temporaries)."""
        reps = max(1, min(cdiv(len(rows), len(packed)), chunk_bytes // max(1, packed.numel())))
        block = packed.repeat(reps, 1)  # [<= 16 MiB of rows, row B]
        for a in range(0, len(rows), len(block)):
            self.buf.write_range(a, block[:len(rows) - a])


@dataclass
class WindowStore(KVStore):
    """The last W tokens of a sliding-window component, in a ring."""

    def _check(self, c: Component) -> None:
        if c.window is None:
            raise ParameterError(f"{c.key} has no window; a WindowStore holds windowed components")

    def ring(self) -> int:
        """Ring size in rows once full (exact: W; paged: the rows of the pages a window straddles)."""
        if self.engine.block_tokens is None:
            return self.component.window
        w = self.component.window + self.engine.window_extra  # the tokens this engine keeps (Engine.window_tokens)
        return self.pages_at(w) * self.buf.per_page

    def slots(self, rows: torch.Tensor) -> torch.Tensor:
        return rows % self.ring()


@dataclass
class TailStore(KVStore):
    """A compressor tail: its owner's pending tokens (fewer than m), token p at slot p mod m."""

    def _check(self, c: Component) -> None:
        if c.tail_of is None:
            raise ParameterError(f"{c.key} is not a compressor tail; a TailStore holds one (Component.tail_of)")

    def slots(self, rows: torch.Tensor) -> torch.Tensor:
        return rows % self.component.ratio  # pending tokens of one entry: slots 0 .. m - 2


@dataclass
class StateStore(KVStore):
    """A fixed-size per-sequence state (linear attention, SSM): one row, rewritten with every token."""

    def _check(self, c: Component) -> None:
        if not c.state:
            raise ParameterError(f"{c.key} is not a fixed-size state; a StateStore holds one (Component.state)")

    def _end_row(self, tokens: int) -> int:
        return 1 if tokens else 0

    def slots(self, rows: torch.Tensor) -> torch.Tensor:
        return rows * 0  # every token's state lands in the one row


def store_for(component: Component, engine: Engine = EXACT, device: str | torch.device = "cpu") -> KVStore:
    """The store that holds `component`: a TailStore for a compressor tail, a WindowStore for a window,
    a StateStore for a fixed-size state, a GrowingStore otherwise."""
    if component.state:
        return StateStore(component, engine, device)
    if component.tail_of is not None:
        return TailStore(component, engine, device)
    if component.window is not None:
        return WindowStore(component, engine, device)
    return GrowingStore(component, engine, device)


def vector_store(width: int, fmt: str | Format = "bf16", role: str = "kv", window: int | None = None,
                 copies: int = 1, engine: Engine = EXACT, device: str | torch.device = "cpu") -> KVStore:
    """A store of `copies` vectors of `width` elements per token in one format (a window of the last
    `window` tokens, or growing): what an attention layer caches for its keys, values or latents."""
    need_int("width", width, 1)
    need_int("copies", copies, 1)
    if window is not None:
        need_int("window", window, 1)
    f = get_format(fmt)
    return store_for(Component(role, Entry((Part(role, width, f),)), copies=copies, window=window), engine, device)
