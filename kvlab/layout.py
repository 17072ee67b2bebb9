"""Cache layouts: what each layer of a model stores per token, in which format.

A `Layout` lists, per layer, the cached `Component`s: K and V heads, an MLA latent with its
RoPE key, indexer keys, compressed entries at ratio m, sliding-window buffers, compressor
tails, and the fixed-size convolution / recurrent state of linear-attention and SSM layers.
Layers that reuse another layer's cache store nothing. From it come bytes per token (what
grows with context), bounded bytes (windows, tails, states, per-tensor scales) and exact
session bytes for T tokens. Sizes come from `kvlab.formats` only.

Which components a layer holds is its family's knowledge (`kvlab.families`: one module per
family, behind a registry); this module holds the data types and the one entry point,
`build_layout`.

Schemes say which format each component takes:
  storage  the format the model's own implementation stores (checkpoint dtype for dense models,
           DeepSeek's FP8/FP4 entries for V3.2 / V4 / V4.1, transformers' state dtypes for hybrids)
  vllm     what vLLM allocates (same entries, V4 indexer in FP8, vLLM's state shapes; paging in
           `kvlab.engines`)
  bf16     everything in BF16 (how third-party posts count it)
`kv_format` overrides the format of every cached attention component with one uniform format;
`k_format` / `v_format` give keys and values their own (an MLA latent counts as keys, its RoPE key
as values). A `Shard` selects the part one GPU holds under tensor, decode-context and pipeline
parallelism (kvlab.serving.parallel). Dense and MLA layouts also take a `KVPlan` beyond formats:
KIVI key groups (integer keys per channel over G tokens), a full-precision residual of recent tokens,
and per-layer overrides -- what `kvlab.hf`'s transformers cache stores, predicted here.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from fractions import Fraction

import math

import numpy as np

from .checks import cdiv, need_choice, need_int
from .errors import ParameterError
from .formats import Format, get_format
from .models import ModelSpec, load_model
from .registry import get_family

SCHEMES = ("storage", "vllm", "bf16")

# What a sliding-window layer holds between decode steps. Its query at position t sees the W tokens t - W + 1 .. t
# (itself included), so the W - 1 tokens before it are all that must stay: the next step brings its own K/V.
# kvlab's layouts count `window_held(W) = W - 1`, the rule of transformers and vLLM; an engine that keeps more
# says so in kvlab.engines (Engine.window_extra). Each implementation's rule, with its source:
WINDOW_RULES = {  # implementation -> (tokens held beyond W - 1, source)
    "transformers": (0, "transformers 5.24 cache_utils.py DynamicSlidingWindowLayer.update keeps "
                        "full_key_states[:, :, -sliding_window + 1:]"),
    "vllm": (0, "vllm/v1/core/single_type_kv_cache_manager.py SlidingWindowManager.get_num_skipped_tokens = "
                "num_computed_tokens - sliding_window + 1: blocks wholly before that token are freed "
                "(remove_skipped_blocks), so the last W - 1 tokens' blocks stay"),
    "sglang": (1, "sglang python/sglang/srt/mem_cache/common.py free_swa_out_of_window_slots: SWA slots before "
                  "pre_len - max(sliding_window_size, page_size) (page-floored) are freed: the last W tokens stay"),
    "deepseek_v4": (1, "DeepSeek V4 / V4.1 (kvlab.families.deepseek_v4): DeepSeek's reference inference keeps a "
                       "ring of window_size entries, and so do kvlab's V4-like prototype and its layout; transformers' "
                       "DeepseekV4HCACache keeps sliding_window - 1 (models/deepseek_v4/modeling_deepseek_v4.py)"),
    "trtllm": (1, "TensorRT-LLM KvCacheConfig.max_attention_window = sliding_window: a rolling buffer of W tokens "
                  "per sequence (examples/llama/README.md, Mistral: 'rolling buffer cache')"),
}


def _min(a, b):
    """min for ints, elementwise for int arrays (so one formula prices one context or many)."""
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


def _max(a, b):
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def window_held(window: int | None) -> int | None:
    """Tokens a sliding layer whose query sees `window` tokens keeps between steps (W - 1; None: no window)."""
    if window is None:
        return None
    return need_int("sliding window", window, 1) - 1


@dataclass(frozen=True)
class Part:
    """A run of elements inside one entry, all in one format."""

    name: str  # "k", "latent", "nope", "rope", "conv", "ssm", ...
    elements: int  # values in this part
    fmt: Format  # their number format

    @property
    def nbytes(self) -> int:
        return self.fmt.entry_bytes(self.elements)


@dataclass(frozen=True)
class Entry:
    """One stored vector (a KV head for one token, a latent, a compressed entry, a layer's state)."""

    parts: tuple[Part, ...]  # concatenated parts
    align: int = 1  # the entry's bytes are rounded up to a multiple of this

    @property
    def nbytes(self) -> int:
        return cdiv(sum(p.nbytes for p in self.parts), self.align) * self.align

    @property
    def elements(self) -> int:
        return sum(p.elements for p in self.parts)

    @property
    def tensor_bytes(self) -> int:
        """Per-tensor scales of its parts (one set per component per layer)."""
        return sum(p.fmt.tensor_bytes for p in self.parts)

    @property
    def format_name(self) -> str:
        names = dict.fromkeys(p.fmt.name for p in self.parts)
        return "+".join(names)

    def describe(self) -> str:
        """Arithmetic of the entry's bytes, e.g. '512 x 4 bits / 8 + 32 x 1 B e4m3 scale = ... = 288 B'."""
        if len(self.parts) == 1 and self.align == 1:
            return self.parts[0].fmt.describe(self.elements)
        inner = " + ".join(f"{p.name} {p.fmt.describe(p.elements)}" for p in self.parts)
        raw = sum(p.nbytes for p in self.parts)
        pad = f", padded to a multiple of {self.align} B = {self.nbytes:,} B" if self.nbytes != raw else ""
        return f"{inner}; total {raw:,} B{pad}"


@dataclass(frozen=True)
class Residual:
    """A full-precision residual (KIVI): the most recent `tokens` tokens wait unquantized in the model's
    dtype, and older tokens move into the quantized store `block` at a time, so between `tokens` and
    `tokens + block - 1` tokens wait (all of them while fewer have been seen)."""

    tokens: int  # R: recent tokens always kept in full precision
    block: int = 1  # tokens quantized together (a multiple of a KIVI key group's G)

    def quantized(self, tokens: int) -> int:
        """Tokens in the quantized store after `tokens` tokens (an int, or an int array elementwise)."""
        return _max(tokens - self.tokens, 0) // self.block * self.block

    @property
    def max_pending(self) -> int:
        """Most tokens ever waiting in full precision."""
        return self.tokens + self.block - 1


@dataclass(frozen=True)
class Component:
    """One kind of state a layer caches: growing (every token or every m-th), a sliding window, the
    tail of a compressed component (its < m pending tokens), or a fixed-size state (a linear-attention
    or SSM layer's convolution and recurrent state: one per sequence, whatever its length)."""

    role: str  # "k", "v", "latent", "index", "main", "swa", "tail", "state", "k_residual", ...
    entry: Entry  # what one stored entry is
    copies: int = 1  # entries per stored position (KV heads)
    ratio: int = 1  # tokens per entry (1 = every token; m = compressed; a tail: its owner's m)
    window: int | None = None  # keeps only the last `window` tokens (bounded); None grows
    tail_of: str | None = None  # a compressor tail: role of the compressed component whose pending tokens it holds
    state: bool = False  # a fixed-size per-sequence state (held from the first token on, never grows)
    interleave: int = 1  # decode-context-parallel ranks its entries are interleaved over (this GPU keeps 1 in n)
    group: int = 1  # tokens packed side by side into one entry (KIVI keys: G tokens x D channels, per channel)
    residual: Residual | None = None  # the split between a quantized store and its full-precision residual
    pending: bool = False  # this component is the residual: it holds the tokens not yet quantized
    partial: bool = True  # a partly filled compressed entry is held (ceil); False: complete entries only (floor)

    def __post_init__(self):
        if self.tail_of is not None and (self.ratio < 2 or self.window is not None):
            raise ParameterError(f"a tail of {self.tail_of!r} needs its owner's ratio m >= 2 and no window, "
                                 f"got ratio {self.ratio}, window {self.window}")
        if self.window is not None and self.tokens_per_entry != 1:
            raise ParameterError(f"{self.role}: a windowed component keeps tokens one by one (ratio 1, group 1), "
                                 f"got ratio {self.ratio}, group {self.group}")
        if self.state and (self.window is not None or self.tail_of is not None or self.ratio != 1):
            raise ParameterError(f"{self.role}: a fixed-size state has no window, tail or ratio")
        if self.interleave != 1 and (not self.grows or self.residual is not None):
            raise ParameterError(f"{self.role}: only growing components without a residual are interleaved over "
                                 f"context-parallel ranks, got interleave {self.interleave}")

    @property
    def key(self) -> str:
        """Its name inside the layer: the role, or '<owner>_tail' for a compressor tail."""
        return self.role if self.tail_of is None else f"{self.tail_of}_tail"

    @property
    def grows(self) -> bool:
        return self.window is None and self.tail_of is None and not self.state and not self.pending

    @property
    def tokens_per_entry(self) -> int:
        return self.ratio * self.group

    @property
    def entry_bytes(self) -> int:
        return self.copies * self.entry.nbytes

    @property
    def bytes_per_token(self) -> Fraction:
        return Fraction(self.entry_bytes, self.tokens_per_entry * self.interleave) if self.grows else Fraction(0)

    def held_tokens(self, tokens: int) -> int:
        """Tokens whose state this component holds after `tokens` tokens (window and residual split applied; an
        int, or an int array elementwise)."""
        held = tokens if self.window is None else _min(tokens, self.window)
        if self.residual is not None:
            waiting = _min(tokens - self.residual.quantized(tokens), held)
            held = waiting if self.pending else held - waiting
        return held

    def entries(self, tokens: int) -> int:
        """Entries held after `tokens` tokens (a partly filled compressed entry counts: ceil, unless `partial`
        is False; a tail holds the T mod m tokens not yet closed into an entry; a state is one entry once a
        token was seen; with entries interleaved over n ranks, the first rank's share: ceil(entries / n)). An int,
        or an int array elementwise."""
        if self.tail_of is not None:
            return tokens % self.ratio
        if self.state:
            return (tokens > 0) * 1 if isinstance(tokens, np.ndarray) else (1 if tokens else 0)
        held = self.held_tokens(tokens)
        per = self.tokens_per_entry * self.interleave
        return cdiv(held, per) if self.partial else held // per

    @property
    def max_entries(self) -> int | None:
        """Most entries a bounded component ever holds (window W, tail m - 1, state 1, a residual R + block - 1);
        None for growing ones."""
        if self.tail_of is not None:
            return self.ratio - 1
        if self.state:
            return 1
        if self.pending:
            most = self.residual.max_pending
            return cdiv(most if self.window is None else min(most, self.window), self.tokens_per_entry)
        return self.window

    def bytes_at(self, tokens: int) -> int:
        return self.entry_bytes * self.entries(tokens)


@dataclass(frozen=True)
class LayerCache:
    """What one layer caches."""

    index: int  # layer number
    mode: str  # "full", "swa", "csa", "hca", "reuse", "reindex", "linear", "hybrid", ...
    components: tuple[Component, ...] = ()  # what it stores (empty when it reuses another's)
    source: int | None = None  # layer whose entries it reads, when it stores none itself


@dataclass(frozen=True)
class SessionBytes:
    """Exact bytes of one session of `tokens` tokens."""

    tokens: int  # context length
    growing: int  # state that grows with context (per-token entries, compressed entries)
    bounded: int  # windows, compressor tails, fixed-size states and per-tensor scales at this length

    @property
    def total(self) -> int:
        return self.growing + self.bounded


@dataclass(frozen=True)
class Shard:
    """The part of a model's cache one GPU holds (kvlab.serving.parallel gives the rules and their sources)."""

    tp: int = 1  # tensor-parallel ranks the attention heads (and linear-layer heads) are split over
    dcp: int = 1  # decode-context-parallel ranks the split components' entries are interleaved over
    pp: int = 1  # pipeline stages
    stage: int = 0  # which stage this GPU is (it holds that stage's layers only)

    def __post_init__(self):
        need_int("tp", self.tp, 1)
        need_int("dcp", self.dcp, 1)
        need_int("pp", self.pp, 1)
        need_int("stage", self.stage, 0, self.pp - 1)

    @property
    def whole(self) -> bool:
        return self.tp == self.dcp == self.pp == 1

    def label(self) -> str:
        parts = [f"TP {self.tp}"] + ([f"DCP {self.dcp}"] if self.dcp > 1 else []) + (
            [f"PP stage {self.stage} of {self.pp}"] if self.pp > 1 else [])
        return ", ".join(parts)


WHOLE = Shard()

PP_SOURCE = ("vllm/distributed/utils.py get_pp_indices: num_layers // pp per stage, the remainder one each to the "
             "stages before the last, from the second-to-last backwards")


def stage_sizes(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, as vLLM's get_pp_indices assigns them."""
    num_layers, pp = need_int("num_layers", num_layers, 1), need_int("pp", pp, 1)
    if pp > num_layers:
        raise ParameterError(f"PP {pp} exceeds the model's {num_layers} layers: every stage needs a layer")
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):  # the remainder goes to the stages before the last, backwards
        sizes[-i] += 1
    return sizes


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The layer indices pipeline stage `stage` holds."""
    sizes = stage_sizes(num_layers, pp)
    need_int("stage", stage, 0, pp - 1)
    start = sum(sizes[:stage])
    return range(start, start + sizes[stage])


@dataclass(frozen=True)
class Layout:
    """The per-layer cache of one model under one scheme and format (on one GPU, when sharded)."""

    model: ModelSpec  # the model it was derived from
    scheme: str  # "storage", "vllm" or "bf16"
    kv_format: str | None  # override format(s), if any: a name, or 'k=A v=B'
    layers: tuple[LayerCache, ...]  # one per decoder layer (one stage's layers when sharded)
    notes: tuple[str, ...] = field(default=())  # assumptions behind the layout
    shard: Shard = WHOLE  # the part of the model one GPU holds (WHOLE: the whole model)

    def components(self, grows: bool | None = None):
        """(layer, component) pairs; grows=True / False keeps growing / bounded ones."""
        for layer in self.layers:
            for c in layer.components:
                if grows is None or c.grows == grows:
                    yield layer, c

    @property
    def family(self):
        """The model family (kvlab.families) that built this layout."""
        return get_family(self.model.family)

    @property
    def bytes_per_token(self) -> Fraction:
        """Bytes that each token of context adds (exact; a Fraction when ratios divide unevenly)."""
        return sum((c.bytes_per_token for _, c in self.components(True)), Fraction(0))

    @property
    def tensor_bytes(self) -> int:
        """Per-tensor scales: one set per cached component per layer."""
        return sum(c.entry.tensor_bytes for _, c in self.components())

    @property
    def bounded_bytes(self) -> int:
        """Bounded state once every window and tail is full, fixed-size states and per-tensor scales included."""
        return sum(c.entry_bytes * c.max_entries for _, c in self.components(False)) + self.tensor_bytes

    @property
    def state_bytes(self) -> int:
        """Fixed-size per-sequence state (linear-attention / SSM layers), part of `bounded_bytes`."""
        return sum(c.entry_bytes for _, c in self.components(False) if c.state)

    @cached_property
    def distinct(self) -> tuple[tuple[Component, int], ...]:
        """Each distinct component with the number of layers that hold it (sessions are priced per kind: a
        43-layer V4 stack has 7 kinds, so the serving roofline can price thousands of contexts a step)."""
        return tuple(Counter(c for _, c in self.components()).items())

    def tensor_bytes_at(self, tokens: int) -> int:
        """Per-tensor scales held after `tokens` tokens: a component's set exists once it holds an entry."""
        return sum(k * c.entry.tensor_bytes for c, k in self.distinct if c.entries(tokens))

    def totals(self, tokens) -> np.ndarray:
        """[N] SessionBytes.total of one session at each context length in `tokens` (ints >= 1), in one pass: the
        serving roofline reads every decode request's cache each step."""
        t = np.asarray(tokens, dtype=np.int64)  # [N]
        if t.size and int(t.min()) < 1:
            raise ParameterError(f"context lengths must be at least 1 token, got {int(t.min())}")
        out = np.zeros(t.shape, np.int64)
        for c, entry_bytes, tensor_bytes in self._priced:
            n = c.entries(t)  # [N]
            out += entry_bytes * n + tensor_bytes * (n > 0)
        return out

    @cached_property
    def _priced(self) -> tuple[tuple[Component, int, int], ...]:
        """(component, its entry bytes, its per-tensor scale bytes) over all the layers holding it."""
        return tuple((c, k * c.entry_bytes, k * c.entry.tensor_bytes) for c, k in self.distinct)

    def session(self, tokens: int, batch: int = 1) -> SessionBytes:
        """Exact bytes after `tokens` tokens: growing entries (ceil per compressed entry) + bounded state.
        `batch` sequences of that length in one cache share its per-tensor scales."""
        tokens = check_tokens(tokens)
        batch = need_int("batch", batch, 1)
        grow = bound = 0
        for c, k in self.distinct:
            if c.grows:
                grow += k * c.bytes_at(tokens)
            else:
                bound += k * c.bytes_at(tokens)
        return SessionBytes(tokens, batch * grow, batch * bound + self.tensor_bytes_at(tokens))

    @property
    def entries_per_token(self) -> Fraction:
        """Positions (main entries) stored per token, summed over layers."""
        main = {"k", "latent", "main"}
        return sum((Fraction(1, c.ratio * c.interleave) for _, c in self.components(True) if c.role in main),
                   Fraction(0))

    def explain(self) -> list[str]:
        """A step-by-step derivation of bytes per token, with the numbers in it."""
        return self.family.explain(self)

    def rows(self) -> list[dict]:
        """One row per (layer, component): for tables."""
        out = []
        for layer in self.layers:
            if not layer.components:
                out.append(dict(layer=layer.index, mode=layer.mode, role="-", format="-", entry_bytes=0, copies=0,
                                ratio=0, window=None, bytes_per_token=0.0, source=layer.source))
            for c in layer.components:
                out.append(dict(layer=layer.index, mode=layer.mode, role=c.role, format=c.entry.format_name,
                                entry_bytes=c.entry.nbytes, copies=c.copies, ratio=c.ratio,
                                window=c.window or c.max_entries, bytes_per_token=float(c.bytes_per_token),
                                source=layer.source))
        return out


def check_tokens(tokens) -> int:
    """A token count: an integer >= 0 (numpy integers accepted, floats refused)."""
    return need_int("tokens", tokens, 0)


KEY_AXES = ("token", "channel")


@dataclass(frozen=True)
class KVPlan:
    """How one dense or MLA layer stores what transformers caches as keys and values (MLA: the latent
    and the RoPE key): their formats, KIVI key grouping, and a full-precision residual."""

    k_format: Format | None = None  # keys / the MLA latent (None: the scheme's format)
    v_format: Format | None = None  # values / the MLA RoPE key (None: the scheme's format)
    residual: int = 0  # most recent tokens kept unquantized, in the model's dtype (KIVI's R)
    block: int = 1  # tokens quantized together once they leave the residual
    key_axis: str = "token"  # "channel": integer keys grouped per channel over G tokens (KIVI)
    value_axis: str = "token"  # "channel": integer values grouped the same way (transformers' QuantizedCache)

    @property
    def formats_only(self) -> bool:
        """Nothing beyond K and V formats (no residual, block or channel groups): the families' own builders."""
        return self.residual == 0 and self.block == 1 and not self.key_groups and not self.value_groups

    @property
    def same_formats(self) -> bool:
        """One format (or none) for K and V alike."""
        return self.k_format == self.v_format

    @property
    def uniform(self) -> bool:
        """One format for K and V, nothing held back: what a plain `kv_format` describes."""
        return self.formats_only and self.same_formats

    @property
    def key_groups(self) -> bool:
        return self.key_axis == "channel" and self.k_format is not None and self.k_format.element.kind == "int"

    @property
    def value_groups(self) -> bool:
        return self.value_axis == "channel" and self.v_format is not None and self.v_format.element.kind == "int"

    def label(self) -> str:
        """A short name: 'nvfp4', 'k=int4 v=int2 residual=128', ..."""
        if self.uniform:
            return self.k_format.name if self.k_format else "default"
        out = [f"k={self.k_format.name if self.k_format else 'default'}"
               + ("/channel" if self.key_groups else ""),
               f"v={self.v_format.name if self.v_format else 'default'}" + ("/channel" if self.value_groups else "")]
        out += [f"residual={self.residual}"] if self.residual else []
        out += [f"block={self.block}"] if self.block > 1 else []
        return " ".join(out)


def kv_plan(kv_format=None, k_format=None, v_format=None, residual: int = 0, block: int = 1,
            key_axis: str = "token", value_axis: str = "token") -> KVPlan:
    """A validated KVPlan: `kv_format` for both K and V, or `k_format` / `v_format` separately."""
    if kv_format is not None and (k_format is not None or v_format is not None):
        raise ParameterError("give kv_format, or k_format and/or v_format, not both")
    k_name = k_format if kv_format is None else kv_format  # None: the scheme's; anything else a name ('' is none)
    v_name = v_format if kv_format is None else kv_format
    k = None if k_name is None else get_format(k_name)
    v = None if v_name is None else get_format(v_name)
    return KVPlan(k, v, need_int("residual", residual, 0), need_int("block", block, 1),
                  need_choice("key_axis", key_axis, KEY_AXES), need_choice("value_axis", value_axis, KEY_AXES))


PLAN_OPTIONS = ("kv_format", "k_format", "v_format", "residual", "block", "key_axis", "value_axis")


def layer_plans(spec: ModelSpec, base: dict, per_layer: dict | None) -> tuple[KVPlan, ...]:
    """One KVPlan per layer: the defaults in `base`, overridden per layer by per_layer[i] (a dict of
    kv_plan's arguments, or a KVPlan)."""
    per_layer = per_layer or {}
    if not isinstance(per_layer, dict):
        raise ParameterError(f"per_layer must map layer indices to overrides, got {type(per_layer).__name__}")
    for i in per_layer:
        need_int("per_layer layer index", i, 0, spec.num_layers - 1)
    plans = []
    for i in range(spec.num_layers):
        o = per_layer.get(i, {})
        if isinstance(o, KVPlan):
            plans.append(o)
            continue
        if not isinstance(o, dict):
            raise ParameterError(f"per_layer[{i}] must be a dict of kv_plan arguments or a KVPlan, got {o!r}")
        args = dict(base)
        if args.get("kv_format") is not None:  # expand, so a per-layer k_format keeps the default v_format
            args["k_format"] = args["v_format"] = args.pop("kv_format")
        if o.get("kv_format") is not None:
            args.pop("k_format", None), args.pop("v_format", None)
        unknown = set(o) - set(PLAN_OPTIONS)
        if unknown:
            raise ParameterError(f"per_layer[{i}]: unknown option(s) {', '.join(sorted(unknown))}; known: "
                                 f"{', '.join(PLAN_OPTIONS)}")
        args.update(o)
        plans.append(kv_plan(**args))
    return tuple(plans)


def split_residual(spec: ModelSpec, role: str, stored: Entry, elements: int, copies: int, window: int | None,
                   plan: KVPlan, waiting_fmt: Format, group: int = 1) -> tuple[Component, ...]:
    """The stored component of `role` and, when tokens wait unquantized, its residual (in `waiting_fmt`, the
    model's dtype)."""
    block = plan.block if group == 1 else math.lcm(plan.block, group)
    if plan.residual == 0 and block == 1:
        return (Component(role, stored, copies, window=window),)
    res = Residual(plan.residual, block)
    waiting = Entry((Part(role, elements, waiting_fmt),))
    return (Component(role, stored, copies, window=window, group=group, residual=res),
            Component(f"{role}_residual", waiting, copies, window=window, residual=res, pending=True))


def build_layout(model: str | ModelSpec, scheme: str = "storage", kv_format: str | Format | None = None, *,
                 k_format: str | Format | None = None, v_format: str | Format | None = None,
                 shard: Shard | None = None, residual: int = 0, block: int = 1, key_axis: str = "token",
                 value_axis: str = "token", per_layer: dict | None = None) -> Layout:
    """The cache layout of a model (catalog name, config path, Hub id or spec) under a scheme and format;
    with `shard`, the part one GPU holds (its stage's layers, its share of heads and of interleaved tokens).

    Dense and MLA models also take KIVI key groups (key_axis="channel"), a full-precision residual of
    `residual` recent tokens quantized `block` at a time, and per-layer overrides {layer: {option: value}}
    of any of these (see `KVPlan`): the layout of kvlab.hf's transformers cache."""
    spec = load_model(model)
    if scheme not in SCHEMES:
        raise ParameterError(f"unknown layout scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    base = dict(kv_format=kv_format, k_format=k_format, v_format=v_format, residual=residual, block=block,
                key_axis=key_axis, value_axis=value_axis)
    plan = kv_plan(**base)
    shard = WHOLE if shard is None else shard
    if not isinstance(shard, Shard):
        raise ParameterError(f"shard must be a kvlab.layout.Shard, got {type(shard).__name__}")
    family = get_family(spec.family)
    if plan.formats_only and not per_layer:
        layers, notes = family.build(spec, scheme, plan, shard)
        label = None if plan.k_format is None and plan.v_format is None else plan.label()
    else:
        if not shard.whole:
            raise ParameterError("a residual, key groups and per-layer plans describe one GPU's whole cache; "
                                 "give them without a shard")
        plans = layer_plans(spec, base, per_layer)
        layers, notes = family.build_planned(spec, scheme, plans)
        labels = dict.fromkeys(p.label() for p in plans)
        label = next(iter(labels)) if len(labels) == 1 else "per-layer"
    if shard.pp > 1:
        keep = set(stage_layers(spec.num_layers, shard.pp, shard.stage))
        layers = [l for l in layers if l.index in keep]
    return Layout(spec, scheme, label, tuple(layers), tuple(notes), shard)


def bytes_per_token(model, scheme: str = "storage", kv_format=None) -> Fraction:
    """Shortcut: bytes per token of a model's layout."""
    return build_layout(model, scheme, kv_format).bytes_per_token
