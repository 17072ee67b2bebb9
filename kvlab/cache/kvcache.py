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

from ..checks import cdiv, need_int, need_type
from ..engines import EXACT, Engine, allocate
from ..errors import ParameterError, WrongTypeError
from ..layout import Component, Layout, build_layout, check_tokens
from .memory import check_fits, resolve_device, storage_bytes
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
        if engine is not None:
            need_type("engine", engine, Engine, "a kvlab.engines.Engine (EXACT, VLLM_DENSE, ... or paged(block_tokens))")
        self.engine = engine or EXACT  # exact storage unless a paged engine is given
        self.device = resolve_device(device)
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
        need_type("paged", paged, (bool, Engine), "True, False or a kvlab.engines.Engine")
        a = allocate(model, scheme, kv_format)
        engine = paged if isinstance(paged, Engine) else (a.engine if paged else EXACT)
        return cls(a.layout, engine, device)

    # --- inputs ---------------------------------------------------------------------------------
    def _layer(self, layer) -> int:
        """A layer index of this layout, or an error naming how many layers it has."""
        n = len(self.layout.layers)
        layer = need_int("layer", layer, None)
        if not 0 <= layer < n:
            raise ParameterError(f"layer {layer} is out of range: {self.layout.model.name} has {n} layers "
                                 f"(0 to {n - 1})")
        return layer

    def input_shapes(self, layer: int) -> dict[str, tuple[int, int]]:
        """Per-token inputs a layer takes: key -> (copies, elements). Tails are derived, not given."""
        layer = self._layer(layer)
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
        need_type("inputs", inputs, dict, "a dict {layer: {key: float tensor [n, copies, elements]}} "
                  "(see input_shapes / random_inputs)")
        extra = [k for k in inputs if not (isinstance(k, int) and 0 <= k < len(self.layout.layers))]
        if extra:
            raise ParameterError(f"inputs name layer {extra[0]!r}, but {self.layout.model.name} has "
                                 f"{len(self.layout.layers)} layers (0 to {len(self.layout.layers) - 1})")
        n = None
        for layer in self.layout.layers:
            shapes = self.input_shapes(layer.index)
            got = inputs.get(layer.index, {})
            need_type(f"inputs[{layer.index}]", got, dict, "a dict {key: tensor}")
            if set(got) != set(shapes):
                raise ParameterError(f"layer {layer.index}: inputs must be {sorted(shapes)}, got {sorted(got)}")
            for k, (c, e) in shapes.items():
                x = _real_tensor(f"inputs[{layer.index}][{k!r}]", got[k])
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
        """Append n tokens of seeded random content (refused before allocating when it would not fit)."""
        n = need_int("n", n, 0)
        seed = need_int("seed", seed, 0, SEED_MAX)
        inputs = n * sum(4 * s.component.copies * s.component.entry.elements for s in self.slots
                         if s.component.tail_of is None)  # the float32 random inputs
        grow = self._allocated(self.tokens + n) - self._allocated(self.tokens)
        check_fits(inputs + grow, self.device, f"appending {n:,} tokens to {self.layout.model.name}")
        g = torch.Generator().manual_seed((seed + self.tokens) % (SEED_MAX + 1))
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
        seed = need_int("seed", seed, 0, SEED_MAX)
        pool = need_int("pool", pool, 1)
        if self.tokens:
            raise ParameterError("fill() builds a cache from empty; this one already holds tokens")
        check_fits(self._allocated(tokens), self.device, f"{self.layout.model.name} at {tokens:,} tokens")
        g = torch.Generator().manual_seed(seed)
        for s in self.slots:
            self.stores[(s.layer, s.key)].fill(tokens, g, pool)
        self.tokens = tokens

    # --- reading ----------------------------------------------------------------------------------
    def read(self, layer: int, key: str) -> torch.Tensor:
        """Entries of a component, oldest first, dequantized: float32 [entries, copies, elements].

        A layer that reuses another's cache reads its source layer's entries."""
        layer = self._layer(layer)
        st = self.stores.get((layer, key))
        if st is None:
            src = self.layout.layers[layer].source
            if src is not None and (src, key) in self.stores:
                st = self.stores[(src, key)]
            else:
                has = [s.key for s in self.slots if s.layer == layer]
                raise ParameterError(f"layer {layer} stores no {key!r} (it has {has or 'nothing'}"
                                     + (f"; it reads layer {src}'s: {[s.key for s in self.slots if s.layer == src]}"
                                        if src is not None else "") + ")")
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

    def _allocated(self, tokens: int) -> int:
        """Bytes the engine allocates for this layout after `tokens` tokens (the check before allocating)."""
        return allocate(self.layout, engine=self.engine).session(tokens).total

    def held_bytes(self, grows: bool | None = None) -> int:
        """Bytes the cache's tensors hold (storage bytes, deduplicated by data pointer)."""
        return storage_bytes(self.tensors(grows))


SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed takes a 64-bit seed


def _real_tensor(name: str, x) -> torch.Tensor:
    """A real floating (or integer) tensor; complex values would lose their imaginary part, lists have no shape."""
    need_type(name, x, torch.Tensor, "a float tensor [n, copies, elements]")
    if x.is_complex():
        raise WrongTypeError(f"{name} is complex ({x.dtype}); the cache stores real values and would drop the "
                             "imaginary part: store x.real and x.imag as separate inputs")
    if x.dtype == torch.bool:
        raise WrongTypeError(f"{name} is a bool tensor; the cache stores real values (float tensors)")
    return x
