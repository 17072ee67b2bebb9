"""How an engine allocates a layout: exact storage, or paged blocks with page alignment.

Exact storage holds each entry's bytes and nothing more. A paged engine allocates every
growing component in pages of `block_tokens` tokens (a page of a ratio-m component holds
block_tokens / m entries) and rounds each page up to a multiple of `page_align` bytes;
bounded components take the pages that their window can touch, and a compressor tail one page
sized for its m - 1 pending tokens.

vLLM's rules (../shared/reference/serving.md, models.md):
  dense attention: 16-token blocks, page = block x heads x head_size x dtype per K and V
  MLA / DSA (FlashMLA): 64-token blocks
  DeepSeek V4: 256-token logical blocks, each page rounded up to a multiple of 576 B
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .checks import cdiv, need_int, need_type
from .layout import Component, Layout, SessionBytes, build_layout, check_tokens


@dataclass(frozen=True)
class Engine:
    """An allocation policy."""

    name: str  # "exact" or an engine's name
    block_tokens: int | None = None  # tokens per page (None: exact storage, no pages)
    page_align: int = 1  # each page's bytes rounded up to a multiple of this
    source: str = ""  # where the rule comes from

    def __post_init__(self):
        if self.block_tokens is not None:
            need_int("block_tokens", self.block_tokens, 1)
        need_int("page_align", self.page_align, 1)

    def rows_per_page(self, c: Component) -> int:
        """Entries one page of component c holds: block_tokens / m for growing and windowed components; a
        compressor tail (at most m - 1 pending tokens) is one buffer page sized for all of them."""
        if c.tail_of is not None:
            return c.max_entries
        return cdiv(self.block_tokens, c.tokens_per_entry)

    def page_bytes(self, c: Component) -> int:
        """Bytes of one page of component c (one layer)."""
        return cdiv(self.rows_per_page(c) * c.entry_bytes, self.page_align) * self.page_align

    def pages(self, c: Component, tokens: int) -> int:
        """Pages component c holds after `tokens` tokens."""
        if c.tail_of is not None:  # compressor tail: its one buffer page while anything is pending
            return 1 if c.entries(tokens) else 0
        if c.window is not None:  # a window of W tokens touches at most ceil((W-1)/B) + 1 blocks
            w = c.held_tokens(tokens)
            return 0 if w == 0 else cdiv(w - 1, self.block_tokens) + 1
        return cdiv(c.held_tokens(tokens), self.block_tokens)


EXACT = Engine("exact", source="the layout's own bytes, nothing rounded")
VLLM_DENSE = Engine("vllm", 16, 1, "vllm/v1/kv_cache_interface.py AttentionSpec.real_page_size_bytes: 16-token blocks")
VLLM_MLA = Engine("vllm", 64, 1, "vLLM FlashMLA backends: 64-token blocks")
VLLM_V4 = Engine("vllm", 256, 576, "vLLM DeepSeek V4: 256-token logical blocks, pages rounded up to a multiple of 576 B")


def engine_for(layout: Layout) -> Engine:
    """The engine a layout's scheme implies: vLLM's paging for 'vllm', exact storage otherwise."""
    if layout.scheme != "vllm":
        return EXACT
    return {"dense": VLLM_DENSE, "mla": VLLM_MLA, "mla_dsa": VLLM_MLA}.get(layout.model.family, VLLM_V4)


@dataclass(frozen=True)
class Allocation:
    """A layout as an engine allocates it."""

    layout: Layout  # what is stored
    engine: Engine  # how it is allocated

    @property
    def paged(self) -> bool:
        return self.engine.block_tokens is not None

    @property
    def bytes_per_token(self) -> Fraction:
        """Allocated bytes per token of context, amortized over full pages (padding included)."""
        if not self.paged:
            return self.layout.bytes_per_token
        per_block = sum(self.engine.page_bytes(c) for _, c in self.layout.components(True))
        return Fraction(per_block, self.engine.block_tokens)

    @property
    def padding_per_token(self) -> Fraction:
        return self.bytes_per_token - self.layout.bytes_per_token

    def session(self, tokens: int) -> SessionBytes:
        """Allocated bytes after `tokens` tokens (whole pages when paged)."""
        tokens = check_tokens(tokens)
        if not self.paged:
            return self.layout.session(tokens)
        e = self.engine
        grow = sum(e.pages(c, tokens) * e.page_bytes(c) for _, c in self.layout.components(True))
        bound = sum(e.pages(c, tokens) * e.page_bytes(c) for _, c in self.layout.components(False))
        return SessionBytes(tokens, grow, bound + self.layout.tensor_bytes_at(tokens))

    def explain(self) -> list[str]:
        lines = self.layout.explain()
        if not self.paged:
            return lines
        e = self.engine
        lines.append(f"{e.name} allocation: {e.block_tokens}-token blocks"
                     + (f", pages rounded up to a multiple of {e.page_align} B" if e.page_align > 1 else ""))
        seen = {}
        for layer, c in self.layout.components(True):
            key = (c.role, c.tokens_per_entry, c.entry_bytes)
            seen.setdefault(key, [0, c])[0] += 1
        total = 0
        for (role, ratio, eb), (n, c) in seen.items():
            entries = cdiv(e.block_tokens, ratio)
            pb = e.page_bytes(c)
            total += n * pb
            pad = f" -> {pb:,} B" if pb != entries * eb else ""
            lines.append(f"  {role} page (ratio {ratio}): {entries} entries x {eb:,} B = {entries * eb:,} B{pad}, "
                         f"x {n} layers")
        from .explain import fmt_bytes
        lines.append(f"  {total:,} B per {e.block_tokens} tokens = {fmt_bytes(self.bytes_per_token)} B per token "
                     f"({fmt_bytes(self.padding_per_token)} B of page padding)")
        return lines


def allocate(model, scheme: str = "storage", kv_format=None, engine: Engine | None = None) -> Allocation:
    """Build a model's layout and allocate it with `engine` (default: the one the scheme implies)."""
    layout = model if isinstance(model, Layout) else build_layout(model, scheme, kv_format)
    if engine is not None:
        need_type("engine", engine, Engine, "a kvlab.engines.Engine (EXACT, VLLM_DENSE, ... or paged(block_tokens))")
    return Allocation(layout, engine or engine_for(layout))


def paged(block_tokens: int, page_align: int = 1, name: str = "paged") -> Engine:
    """A custom paged engine."""
    return Engine(need_type("name", name, str, "a name"), need_int("block_tokens", block_tokens, 1),
                  need_int("page_align", page_align, 1))
