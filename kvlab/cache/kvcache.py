"""A KV cache that holds a layout's components in their real packed formats.

`KVCache(layout, engine)` keeps one `KVStore` (kvlab.cache.store) per (layer, component). Append one token
or a chunk at a time with per-layer inputs (`append`), or synthetic content (`append_random`);
`fill(T)` builds the state after T tokens in one step (random content, tiled from a small
quantized pool) so a million-token cache is quick. `read` returns entries dequantized for
attention; `held_bytes` is what the stores hold, to compare with `Layout.session` /
`Allocation.session`.

Compressed components (ratio m) hold one entry per m tokens. The compressor here is a stand-in
for the model's learned one: each pending token's tail row is [kv, gate] (kv = the token's vector,
twice for an overlapping CSA compressor; gate = 0), and an entry is the softmax(gate)-weighted sum
of its tokens' kv, i.e. their mean. A partly filled entry is written as the mean so far; the
tail keeps the raw pending rows (BF16) until the m-th token closes the entry; the stand-in reads
every token through BF16, so entries do not depend on how tokens were chunked. Only the bytes are claimed
faithful, not the values of the model's compressor.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import cdiv
from ..engines import EXACT, Engine, allocate
from ..errors import ParameterError
from ..layout import Component, Layout, build_layout, check_tokens
from .memory import storage_bytes
from .store import KVStore, TailStore, store_for


@dataclass(frozen=True)
class Slot:
    """Where one component sits: its layer and its key inside the layer."""

    layer: int  # layer index
    key: str  # Component.key: "k", "v", "latent", "index", "main", "swa", "main_tail", "index_tail"
    component: Component  # what it stores


class KVCache:
    """Packed cache storage of one layout on one device, exact or paged: one `KVStore` per component."""

    def __init__(self, layout: Layout | str, engine: Engine | None = None, device: str | torch.device = "cpu"):
        self.layout = layout if isinstance(layout, Layout) else build_layout(layout)
        self.engine = engine or EXACT  # exact storage unless a paged engine is given
        self.device = torch.device(device)
        self.tokens = 0  # tokens appended so far
        self.slots: list[Slot] = []
        self.stores: dict[tuple[int, str], KVStore] = {}
        self._tails: dict[tuple[int, str], TailStore] = {}  # (layer, owner key) -> the owner's tail
        for layer in self.layout.layers:
            for c in layer.components:
                if (layer.index, c.key) in self.stores:
                    raise ParameterError(f"layer {layer.index} caches two components named {c.key!r}")
                st = store_for(c, self.engine, self.device)
                self.slots.append(Slot(layer.index, c.key, c))
                self.stores[(layer.index, c.key)] = st
                if isinstance(st, TailStore):
                    self._tails[(layer.index, c.tail_of)] = st

    @classmethod
    def for_model(cls, model, scheme: str = "storage", kv_format=None, paged: bool | Engine = False,
                  device="cpu") -> KVCache:
        """A cache for a catalog model / config: exact storage, or paged=True for the scheme's engine."""
        a = allocate(model, scheme, kv_format)
        engine = paged if isinstance(paged, Engine) else (a.engine if paged else EXACT)
        return cls(a.layout, engine, device)

    # --- inputs ---------------------------------------------------------------------------------
    def input_shapes(self, layer: int) -> dict[str, tuple[int, int]]:
        """Per-token inputs a layer takes: key -> (copies, elements). Tails are derived, not given."""
        return {s.key: (s.component.copies, s.component.entry.elements)
                for s in self.slots if s.layer == layer and s.component.tail_of is None}

    def random_inputs(self, n: int, generator: torch.Generator) -> dict[int, dict[str, torch.Tensor]]:
        """Seeded standard-normal inputs for n tokens, every storing layer: {layer: {key: [n, C, E]}}."""
        out = {}
        for layer in self.layout.layers:
            shapes = self.input_shapes(layer.index)
            if shapes:
                out[layer.index] = {k: torch.randn(n, c, e, generator=generator).to(self.device)  # [n, C, E]
                                    for k, (c, e) in shapes.items()}
        return out

    # --- appending ------------------------------------------------------------------------------
    def append(self, inputs: dict[int, dict[str, torch.Tensor]]) -> None:
        """Append n tokens: inputs[layer][key] is float [n, copies, elements] for every input of every layer."""
        n = None
        for layer in self.layout.layers:
            shapes = self.input_shapes(layer.index)
            got = inputs.get(layer.index, {})
            if set(got) != set(shapes):
                raise ParameterError(f"layer {layer.index}: inputs must be {sorted(shapes)}, got {sorted(got)}")
            for k, (c, e) in shapes.items():
                x = got[k]
                if x.dim() != 3 or tuple(x.shape[1:]) != (c, e):
                    raise ParameterError(f"layer {layer.index} {k}: expected [n, {c}, {e}], got {list(x.shape)}")
                if n is None:
                    n = x.shape[0]
                elif x.shape[0] != n:
                    raise ParameterError(f"layer {layer.index} {k}: {x.shape[0]} tokens, others have {n}")
        if not n:
            return
        for s in self.slots:
            c = s.component
            if c.tail_of is not None:
                continue
            x = inputs[s.layer][s.key].to(self.device).float()  # [n, C, E]
            if c.ratio == 1:
                self.stores[(s.layer, s.key)].append(x)
            else:
                self._append_compressed(s, x)
        for s in self.slots:  # tails last: a compressed component reads its tail's pending tokens first
            c = s.component
            if c.tail_of is not None:
                owner = inputs[s.layer][c.tail_of].to(self.device).float()  # [n, 1, d]
                self.stores[(s.layer, s.key)].append(self._tail_rows(owner, c))
        self.tokens += n

    def append_random(self, n: int, seed: int = 0) -> None:
        """Append n tokens of seeded random content."""
        g = torch.Generator().manual_seed(seed + self.tokens)
        self.append(self.random_inputs(n, g))

    def _append_compressed(self, s: Slot, x: torch.Tensor) -> None:
        """The stand-in compressor: x [n, C, d] joins the pending tokens (read from the tail) and every entry
        it touches is rewritten as the mean of its tokens so far."""
        st, c = self.stores[(s.layer, s.key)], s.component
        m, d = c.ratio, c.entry.elements
        t0, t1 = st.tokens, st.tokens + len(x)
        tail = self._tails.get((s.layer, s.key))
        pend = tail.read()[..., :d] if tail is not None else x.new_zeros(0, 1, d)  # [t0 % m, 1, d] pending kv
        x = x.to(torch.bfloat16).float()  # the compressor reads BF16 rows, as its tail stores them
        xs = torch.cat([pend.expand(-1, c.copies, -1), x]) if len(pend) else x  # [t1 - first * m, C, d]
        first = t0 // m  # the entry the first pending token belongs to
        n_entries = cdiv(t1 - first * m, m)
        pad = n_entries * m - len(xs)
        groups = torch.nn.functional.pad(xs, (0, 0, 0, 0, 0, pad)).reshape(n_entries, m, *xs.shape[1:])  # [E, m, C, d]
        counts = torch.full((n_entries, 1, 1), float(m), device=self.device)  # [E, 1, 1]
        counts[-1] = m - pad  # the last entry may be partly filled
        st.advance(t1)
        st.write(first + torch.arange(n_entries, device=self.device), groups.sum(1) / counts)  # means [E, C, d]

    @staticmethod
    def _tail_rows(owner: torch.Tensor, tail: Component) -> torch.Tensor:
        """The stand-in compressor's tail rows for the owner's inputs [n, 1, d]: [kv, gate 0] with kv the
        token's vector (twice for an overlapping CSA compressor): [n, 1, tail width]."""
        x = owner[:, 0]  # [n, d]
        kv = x.repeat(1, tail.entry.elements // 2 // x.shape[-1])  # [n, width / 2]
        return torch.cat([kv, torch.zeros_like(kv)], dim=-1)[:, None]  # [n, 1, width]

    # --- fast fill --------------------------------------------------------------------------------
    def fill(self, tokens: int, seed: int = 0, pool: int = 16) -> None:
        """Build the state after `tokens` tokens of random content in one step (an empty cache only).

        Each store quantizes `pool` random entries once and tiles their bytes over every row it
        holds: the bytes held are exactly those of a cache that saw `tokens` tokens."""
        tokens = check_tokens(tokens)
        if self.tokens:
            raise ParameterError("fill() builds a cache from empty; this one already holds tokens")
        g = torch.Generator().manual_seed(seed)
        for s in self.slots:
            self.stores[(s.layer, s.key)].fill(tokens, g, pool)
        self.tokens = tokens

    # --- reading ----------------------------------------------------------------------------------
    def read(self, layer: int, key: str) -> torch.Tensor:
        """Entries of a component, oldest first, dequantized: float32 [entries, copies, elements].

        A layer that reuses another's cache reads its source layer's entries."""
        st = self.stores.get((layer, key))
        if st is None:
            src = self.layout.layers[layer].source if 0 <= layer < len(self.layout.layers) else None
            if src is not None and (src, key) in self.stores:
                st = self.stores[(src, key)]
            else:
                raise ParameterError(f"layer {layer} stores no {key!r} (it has "
                                     f"{[s.key for s in self.slots if s.layer == layer]})")
        return st.read()

    # --- bytes ------------------------------------------------------------------------------------
    def tensors(self, grows: bool | None = None) -> list[torch.Tensor]:
        """Every tensor the cache holds. grows=True: pages of growing components; grows=False: pages of
        bounded ones (windows, tails) and all per-tensor scales, as `Layout.session` splits them."""
        out = []
        for s in self.slots:
            st = self.stores[(s.layer, s.key)]
            if grows is None or s.component.grows == grows:
                out.append(st.state())
            if grows is not True:
                out += st.scale_tensors()
        return out

    def held_bytes(self, grows: bool | None = None) -> int:
        """Bytes the cache's tensors hold (storage bytes, deduplicated by data pointer)."""
        return storage_bytes(self.tensors(grows))
