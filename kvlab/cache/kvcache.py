"""A KV cache that holds a layout's components in their real packed formats.

`KVCache(layout, engine)` keeps one `ComponentStore` per (layer, component). Append one token
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

from ..engines import EXACT, Engine, allocate
from ..errors import ParameterError
from ..layout import Component, Layout, build_layout, check_tokens
from . import codec
from .store import ComponentStore


@dataclass(frozen=True)
class Slot:
    """Where one component sits: its layer and its key inside the layer."""

    layer: int  # layer index
    key: str  # "k", "v", "latent", "index", "main", "swa", "main_tail", "index_tail"
    component: Component  # what it stores


def _keys(components) -> list[str]:
    """Unique keys per layer; the i-th tail belongs to the i-th compressed component."""
    compressed = [c.role for c in components if c.ratio > 1 and c.fixed_entries is None]
    keys, tails = [], 0
    for c in components:
        if c.fixed_entries is not None:
            keys.append(f"{compressed[tails]}_tail" if tails < len(compressed) else f"tail{tails}")
            tails += 1
        else:
            keys.append(c.role)
    return keys


class KVCache:
    """Packed cache storage of one layout on one device, exact or paged."""

    def __init__(self, layout: Layout | str, engine: Engine | None = None, device: str | torch.device = "cpu"):
        self.layout = layout if isinstance(layout, Layout) else build_layout(layout)
        self.engine = engine or EXACT  # exact storage unless a paged engine is given
        self.device = torch.device(device)
        self.tokens = 0  # tokens appended so far
        self.slots: list[Slot] = []
        self.stores: dict[tuple[int, str], ComponentStore] = {}
        for layer in self.layout.layers:
            for key, c in zip(_keys(layer.components), layer.components):
                self.slots.append(Slot(layer.index, key, c))
                self.stores[(layer.index, key)] = ComponentStore(c, self.engine, self.device)
        self._tails = {(s.layer, s.key[:-5]): (s.layer, s.key) for s in self.slots if s.key.endswith("_tail")}

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
                for s in self.slots if s.layer == layer and s.component.fixed_entries is None}

    def random_inputs(self, n: int, generator: torch.Generator) -> dict[int, dict[str, torch.Tensor]]:
        """Seeded standard-normal inputs for n tokens, every storing layer."""
        out = {}
        for layer in self.layout.layers:
            shapes = self.input_shapes(layer.index)
            if shapes:
                out[layer.index] = {k: torch.randn(n, c, e, generator=generator).to(self.device)
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
        t0, t1 = self.tokens, self.tokens + n
        for s in self.slots:
            if s.component.fixed_entries is None:
                self._append(s, inputs[s.layer][s.key].to(self.device).float(), t0, t1)
        for s in self.slots:  # tails last: compressed components read the old tail first
            if s.component.fixed_entries is not None:
                self._append_tail(s, inputs, t0, t1)
        self.tokens = t1

    def append_random(self, n: int, seed: int = 0) -> None:
        """Append n tokens of seeded random content."""
        g = torch.Generator().manual_seed(seed + self.tokens)
        self.append(self.random_inputs(n, g))

    def _encode(self, st: ComponentStore, x: torch.Tensor) -> torch.Tensor:
        rows, ts = codec.encode(x, st.component.entry, st.tensor_scales)  # [k, C, entry B]
        if st.tensor_scales is None and any(t is not None for t in ts):
            st.tensor_scales = ts
        return rows.reshape(x.shape[0], st.component.entry_bytes)

    def _pending_kv(self, layer: int, key: str, width: int) -> torch.Tensor:
        """The kv of a compressed component's pending tokens, from its tail: [p, 1, width]."""
        tail = self._tails.get((layer, key))
        if tail is None:
            return torch.zeros(0, 1, width, device=self.device)
        st = self.stores[tail]
        rows = st.read_packed().reshape(-1, 1, st.component.entry.nbytes)
        return codec.decode(rows, st.component.entry, st.tensor_scales)[..., :width]

    def _append(self, s: Slot, x: torch.Tensor, t0: int, t1: int) -> None:
        st, c = self.stores[(s.layer, s.key)], s.component
        st.advance(t1)
        if c.ratio == 1:
            pos = torch.arange(t0, t1, device=self.device)
            keep = pos >= t1 - c.window if c.window is not None else slice(None)
            st.write(pos[keep], self._encode(st, x[keep]))
            return
        # compressed: group tokens by entry; the first group may continue pending tokens
        m = c.ratio
        pend = self._pending_kv(s.layer, s.key, c.entry.elements)  # [t0 % m, 1, d]
        x = x.to(torch.bfloat16).float()  # the compressor reads BF16 rows, as its tail stores them
        xs = torch.cat([pend.expand(-1, c.copies, -1), x]) if len(pend) else x  # tokens from entry start
        first = t0 // m
        n_entries = -(-(t1 - first * m) // m)
        pad = n_entries * m - len(xs)
        groups = torch.nn.functional.pad(xs, (0, 0, 0, 0, 0, pad)).reshape(n_entries, m, *xs.shape[1:])  # [E, m, C, d]
        counts = torch.full((n_entries, 1, 1), float(m), device=self.device)
        counts[-1] = m - pad  # the last entry may be partly filled
        means = groups.sum(1) / counts  # [E, C, d]
        st.write(first + torch.arange(n_entries, device=self.device), self._encode(st, means))

    def _append_tail(self, s: Slot, inputs, t0: int, t1: int) -> None:
        st, c = self.stores[(s.layer, s.key)], s.component
        src = s.key[:-5]
        m, width = c.ratio, c.entry.elements
        keep = t1 % m  # pending after this chunk
        old = self._tail_rows(st)  # [t0 % m, width] decoded before resizing
        st.advance(t1)
        if not keep:
            return
        x = inputs[s.layer][src].to(self.device).float()[:, 0]  # [n, d]
        kv = x.repeat(1, width // 2 // x.shape[-1])  # [n, width/2]: kv (twice when overlapping)
        rows = torch.cat([kv, torch.zeros_like(kv)], dim=-1)  # [n, width]: kv + gate 0
        allrows = torch.cat([old, rows]) if t1 - t0 < keep else rows
        tail = allrows[-keep:]  # the last `keep` tokens
        st.write(torch.arange(keep, device=self.device), self._encode(st, tail[:, None, :]))

    def _tail_rows(self, st: ComponentStore) -> torch.Tensor:
        if st.tokens % st.component.ratio == 0:
            return torch.zeros(0, st.component.entry.elements, device=self.device)
        rows = st.read_packed().reshape(-1, 1, st.component.entry.nbytes)
        return codec.decode(rows, st.component.entry, st.tensor_scales)[:, 0]

    # --- fast fill --------------------------------------------------------------------------------
    def fill(self, tokens: int, seed: int = 0, pool: int = 16) -> None:
        """Build the state after `tokens` tokens of random content in one step (an empty cache only).

        Each component quantizes `pool` random entries once and tiles their bytes over every row
        it holds: the bytes held are exactly those of a cache that saw `tokens` tokens."""
        tokens = check_tokens(tokens)
        if self.tokens:
            raise ParameterError("fill() builds a cache from empty; this one already holds tokens")
        g = torch.Generator().manual_seed(seed)
        for s in self.slots:
            st, c = self.stores[(s.layer, s.key)], s.component
            st.advance(tokens)
            rows = st.live_rows()
            if not len(rows):
                continue
            x = torch.randn(min(pool, len(rows)), c.copies, c.entry.elements, generator=g).to(self.device)
            st.write_tiled(self._encode(st, x))  # [pool, row B] tiled over every row held
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
        c = st.component
        rows = st.read_packed().reshape(-1, c.copies, c.entry.nbytes)
        return codec.decode(rows, c.entry, st.tensor_scales)

    # --- bytes ------------------------------------------------------------------------------------
    def tensors(self, grows: bool | None = None) -> list[torch.Tensor]:
        """Every tensor the cache holds. grows=True: pages of growing components; grows=False: pages of
        bounded ones (windows, tails) and all per-tensor scales, as `Layout.session` splits them."""
        out = []
        for s in self.slots:
            st = self.stores[(s.layer, s.key)]
            if grows is None or s.component.grows == grows:
                out.append(st.buf.data)
            if grows is not True and st.tensor_scales:
                out += [t for t in st.tensor_scales if t is not None]
        return out

    def held_bytes(self, grows: bool | None = None) -> int:
        """Bytes the cache's tensors hold (storage bytes, deduplicated by data pointer)."""
        from .memory import storage_bytes
        return storage_bytes(self.tensors(grows))
