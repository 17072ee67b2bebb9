"""Cache layouts: what each layer of a model stores per token, in which format.

A `Layout` lists, per layer, the cached `Component`s: K and V heads, an MLA latent with its
RoPE key, indexer keys, compressed entries at ratio m, sliding-window buffers, compressor
tails. Layers that reuse another layer's cache store nothing. From it come bytes per token
(what grows with context), bounded bytes (windows, tails, per-tensor scales) and exact
session bytes for T tokens. Sizes come from `kvlab.formats` only.

Schemes say which format each component takes:
  storage  the format the model's own implementation stores (checkpoint dtype for dense models,
           DeepSeek's FP8/FP4 entries for V3.2 / V4 / V4.1)
  vllm     what vLLM allocates (same entries, V4 indexer in FP8; paging in `kvlab.engines`)
  bf16     everything in BF16 (how third-party posts count it)
`kv_format` overrides the format of every cached component with one uniform format. Dense and MLA
layouts also take separate K and V formats (MLA: the latent and the RoPE key), KIVI key groups
(integer keys per channel over G tokens), a full-precision residual of recent tokens, and per-layer
overrides of all of these (`KVPlan`): what `kvlab.hf`'s transformers cache stores, predicted here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from .checks import cdiv, need_choice, need_int
from .errors import ConfigError, ParameterError, UnknownFormatError
from .formats import Format, dtype_format, get_format
from .models import ModelSpec, load_model

SCHEMES = ("storage", "vllm", "bf16")


@dataclass(frozen=True)
class Part:
    """A run of elements inside one entry, all in one format."""

    name: str  # "k", "latent", "nope", "rope", ...
    elements: int  # values in this part
    fmt: Format  # their number format

    @property
    def nbytes(self) -> int:
        return self.fmt.entry_bytes(self.elements)


@dataclass(frozen=True)
class Entry:
    """One stored vector (a KV head for one token, a latent, a compressed entry)."""

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
        """Tokens in the quantized store after `tokens` tokens."""
        return max(tokens - self.tokens, 0) // self.block * self.block

    @property
    def max_pending(self) -> int:
        """Most tokens ever waiting in full precision."""
        return self.tokens + self.block - 1


@dataclass(frozen=True)
class Component:
    """One kind of state a layer caches: growing (every token or every m-th), a sliding window, or the
    tail of a compressed component (its < m pending tokens)."""

    role: str  # "k", "v", "latent", "index", "main", "swa", "tail", "k_residual", ...
    entry: Entry  # what one stored entry is
    copies: int = 1  # entries per stored position (KV heads)
    ratio: int = 1  # tokens per entry (1 = every token; m = compressed; a tail: its owner's m)
    window: int | None = None  # keeps only the last `window` tokens (bounded); None grows
    tail_of: str | None = None  # a compressor tail: role of the compressed component whose pending tokens it holds
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

    @property
    def key(self) -> str:
        """Its name inside the layer: the role, or '<owner>_tail' for a compressor tail."""
        return self.role if self.tail_of is None else f"{self.tail_of}_tail"

    @property
    def grows(self) -> bool:
        return self.window is None and self.tail_of is None and not self.pending

    @property
    def tokens_per_entry(self) -> int:
        return self.ratio * self.group

    @property
    def entry_bytes(self) -> int:
        return self.copies * self.entry.nbytes

    @property
    def bytes_per_token(self) -> Fraction:
        return Fraction(self.entry_bytes, self.tokens_per_entry) if self.grows else Fraction(0)

    def held_tokens(self, tokens: int) -> int:
        """Tokens whose state this component holds after `tokens` tokens (window and residual split applied)."""
        held = tokens if self.window is None else min(tokens, self.window)
        if self.residual is not None:
            waiting = min(tokens - self.residual.quantized(tokens), held)
            held = waiting if self.pending else held - waiting
        return held

    def entries(self, tokens: int) -> int:
        """Entries held after `tokens` tokens (a partly filled compressed entry counts: ceil, unless `partial`
        is False; a tail holds the T mod m tokens not yet closed into an entry)."""
        if self.tail_of is not None:
            return tokens % self.ratio
        held = self.held_tokens(tokens)
        return cdiv(held, self.tokens_per_entry) if self.partial else held // self.tokens_per_entry

    @property
    def max_entries(self) -> int | None:
        """Most entries a bounded component ever holds (window W, tail m - 1, a residual R + block - 1);
        None for growing ones."""
        if self.tail_of is not None:
            return self.ratio - 1
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
    mode: str  # "full", "swa", "csa", "hca", "reuse", "reindex", ...
    components: tuple[Component, ...] = ()  # what it stores (empty when it reuses another's)
    source: int | None = None  # layer whose entries it reads, when it stores none itself


@dataclass(frozen=True)
class SessionBytes:
    """Exact bytes of one session of `tokens` tokens."""

    tokens: int  # context length
    growing: int  # state that grows with context (per-token entries, compressed entries)
    bounded: int  # windows, compressor tails and per-tensor scales at this length

    @property
    def total(self) -> int:
        return self.growing + self.bounded


@dataclass(frozen=True)
class Layout:
    """The per-layer cache of one model under one scheme and format."""

    model: ModelSpec  # the model it was derived from
    scheme: str  # "storage", "vllm" or "bf16"
    kv_format: str | None  # uniform override format, if any
    layers: tuple[LayerCache, ...]  # one per decoder layer
    notes: tuple[str, ...] = field(default=())  # assumptions behind the layout

    def components(self, grows: bool | None = None):
        """(layer, component) pairs; grows=True / False keeps growing / bounded ones."""
        for layer in self.layers:
            for c in layer.components:
                if grows is None or c.grows == grows:
                    yield layer, c

    @property
    def bytes_per_token(self) -> Fraction:
        """Bytes that each token of context adds (exact; a Fraction when ratios divide unevenly)."""
        return sum((c.bytes_per_token for _, c in self.components(True)), Fraction(0))

    @property
    def tensor_bytes(self) -> int:
        """Per-tensor scales: one set per cached component per layer."""
        return sum(c.entry.tensor_bytes for _, c in self.components())

    def tensor_bytes_at(self, tokens: int) -> int:
        """Per-tensor scales held after `tokens` tokens: a component's set exists once it holds an entry."""
        return sum(c.entry.tensor_bytes for _, c in self.components() if c.entries(tokens))

    @property
    def bounded_bytes(self) -> int:
        """Bounded state once every window and tail is full, per-tensor scales included."""
        return sum(c.entry_bytes * c.max_entries for _, c in self.components(False)) + self.tensor_bytes

    def session(self, tokens: int, batch: int = 1) -> SessionBytes:
        """Exact bytes after `tokens` tokens: growing entries (ceil per compressed entry) + bounded state.
        `batch` sequences of that length in one cache share its per-tensor scales."""
        tokens = check_tokens(tokens)
        batch = need_int("batch", batch, 1)
        grow = sum(c.bytes_at(tokens) for _, c in self.components(True))
        bound = sum(c.bytes_at(tokens) for _, c in self.components(False))
        return SessionBytes(tokens, batch * grow, batch * bound + self.tensor_bytes_at(tokens))

    @property
    def entries_per_token(self) -> Fraction:
        """Positions (main entries) stored per token, summed over layers."""
        main = {"k", "latent", "main"}
        return sum((Fraction(1, c.ratio) for _, c in self.components(True) if c.role in main), Fraction(0))

    def explain(self) -> list[str]:
        """A step-by-step derivation of bytes per token, with the numbers in it."""
        from .explain import explain_layout
        return explain_layout(self)

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
    """A token count: an integer >= 0 (numpy integers and integral floats accepted)."""
    return need_int("tokens", tokens, 0)


# --- the formats each scheme gives each role --------------------------------------------------
# ENTRY_FORMATS[(family, scheme)][role]: a list of (part, format) where part is "all", "nope" or "rope"
# ("latent" for MLA). None as a format means the checkpoint dtype. Sources: models.md.
V4_ENTRY = (("nope", "fp8_e4m3_b64_ue8m0"), ("rope", "bf16"))  # 448 + 7 + 128 = 583 -> 584 B (align 8)
FP8_DS_MLA = (("latent", "fp8_e4m3_b128"), ("rope", "bf16"))  # 512 + 16 + 128 = 656 B (FlashMLA / vLLM)
ENTRY_FORMATS: dict[tuple[str, str], dict[str, tuple]] = {
    ("dense", "storage"): {"kv": (("all", None),)},
    ("dense", "vllm"): {"kv": (("all", None),)},
    ("mla", "storage"): {"latent": (("latent", None), ("rope", None))},
    ("mla", "vllm"): {"latent": (("latent", None), ("rope", None))},
    ("mla_dsa", "storage"): {"latent": FP8_DS_MLA, "index": (("all", "fp8_e4m3_b128"),)},
    ("mla_dsa", "vllm"): {"latent": FP8_DS_MLA, "index": (("all", "fp8_e4m3_b128"),)},
    ("dsv4", "storage"): {"main": V4_ENTRY, "index": (("all", "mxfp4"),), "swa": V4_ENTRY},
    ("dsv4", "vllm"): {"main": V4_ENTRY, "index": (("all", "fp8_e4m3_b128"),), "swa": V4_ENTRY},
    ("dsv41", "storage"): {"main": (("all", "nvfp4"),), "index": (("all", "mxfp4"),), "swa": V4_ENTRY},
}
ALIGN = {("dsv4", "main"): 8, ("dsv4", "swa"): 8, ("dsv41", "swa"): 8}  # V4's 583 B entry is stored as 584 B


def _entry(spec: ModelSpec, family: str, scheme: str, role: str, dims: dict[str, int],
           kv_format: Format | None) -> Entry:
    """Build the entry of `role` with part sizes `dims` under a scheme or a uniform format."""
    if kv_format is not None or scheme == "bf16":
        fmt = kv_format or get_format("bf16")
        return Entry((Part(role, sum(dims.values()), fmt),))
    recipe = ENTRY_FORMATS.get((family, scheme))
    if recipe is None:
        raise ParameterError(f"{spec.name}: no published {scheme!r} layout for a {family} model "
                             f"({spec.description}); use one of: "
                             f"{', '.join(s for s in SCHEMES if (family, s) in ENTRY_FORMATS or s == 'bf16')}")
    parts = []
    for part, fname in recipe[role]:
        n = sum(dims.values()) if part == "all" else dims[part]
        parts.append(Part(role if part == "all" else part, n,
                          _dtype_format(spec) if fname is None else get_format(fname)))
    return Entry(tuple(parts), ALIGN.get((family, role), 1) if kv_format is None else 1)


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
    def uniform(self) -> bool:
        """One format for K and V, nothing held back: what a plain `kv_format` describes."""
        return (self.k_format == self.v_format and self.residual == 0 and self.block == 1
                and not self.key_groups and not self.value_groups)

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
        raise ParameterError("give kv_format, or k_format and v_format, not both")
    k = get_format(k_format if kv_format is None else kv_format) if (k_format or kv_format) is not None else None
    v = get_format(v_format if kv_format is None else kv_format) if (v_format or kv_format) is not None else None
    return KVPlan(k, v, need_int("residual", residual, 0), need_int("block", block, 1),
                  need_choice("key_axis", key_axis, KEY_AXES), need_choice("value_axis", value_axis, KEY_AXES))


def _layer_plans(spec: ModelSpec, base: dict, per_layer: dict | None) -> tuple[KVPlan, ...]:
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
        unknown = set(o) - {"kv_format", "k_format", "v_format", "residual", "block", "key_axis", "value_axis"}
        if unknown:
            raise ParameterError(f"per_layer[{i}]: unknown option(s) {', '.join(sorted(unknown))}; known: kv_format, "
                                 "k_format, v_format, residual, block, key_axis, value_axis")
        args.update(o)
        plans.append(kv_plan(**args))
    return tuple(plans)


def _dtype_format(spec: ModelSpec) -> Format:
    """The checkpoint dtype's format, or a ConfigError naming the model and the field."""
    try:
        return dtype_format(spec.torch_dtype)
    except UnknownFormatError as e:
        raise ConfigError(f"{spec.name}: {e}") from None


def build_layout(model: str | ModelSpec, scheme: str = "storage", kv_format: str | Format | None = None, *,
                 k_format: str | Format | None = None, v_format: str | Format | None = None, residual: int = 0,
                 block: int = 1, key_axis: str = "token", value_axis: str = "token",
                 per_layer: dict | None = None) -> Layout:
    """The cache layout of a model (catalog name, config path or spec) under a scheme and format.

    Dense and MLA models also take separate K / V formats (MLA: latent / RoPE key), KIVI key groups
    (key_axis="channel"), a full-precision residual of `residual` recent tokens quantized `block` at a
    time, and per-layer overrides {layer: {option: value}} of any of these (see `KVPlan`)."""
    spec = load_model(model)
    if scheme not in SCHEMES:
        raise ParameterError(f"unknown layout scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    base = dict(kv_format=kv_format, k_format=k_format, v_format=v_format, residual=residual, block=block,
                key_axis=key_axis, value_axis=value_axis)
    default = kv_plan(**base)
    if default.uniform and not per_layer:
        fmt = default.k_format
        builder = {"dense": _dense, "mla": _mla, "mla_dsa": _mla, "dsv4": _dsv4, "dsv41": _dsv41}[spec.family]
        layers, notes = builder(spec, scheme, fmt)
        return Layout(spec, scheme, fmt.name if fmt else None, tuple(layers), tuple(notes))
    if spec.family not in ("dense", "mla", "mla_dsa"):
        raise ParameterError(f"{spec.name}: separate K/V formats, a residual, key groups and per-layer plans apply "
                             f"to dense and MLA models, not to a {spec.family} model ({spec.description})")
    plans = _layer_plans(spec, base, per_layer)
    layers, notes = (_dense_planned if spec.family == "dense" else _mla_planned)(spec, scheme, plans)
    labels = dict.fromkeys(p.label() for p in plans)
    return Layout(spec, scheme, next(iter(labels)) if len(labels) == 1 else "per-layer", tuple(layers),
                  tuple(notes))


def _dense(spec, scheme, fmt):
    e = _entry(spec, "dense", scheme, "kv", {"all": spec.head_dim}, fmt)
    layers = []
    for i, w in enumerate(spec.layer_windows or (None,) * spec.num_layers):
        comps = tuple(Component(r, e, copies=spec.num_kv_heads, window=w) for r in ("k", "v"))
        layers.append(LayerCache(i, "sliding" if w else "full", comps))
    notes = []
    if any(spec.layer_windows):
        notes.append("sliding-window layers keep only their last `sliding_window` tokens: bounded, not per-token")
    return layers, notes


def _mla(spec, scheme, fmt):
    family = spec.family
    lat = _entry(spec, family, scheme, "latent", {"latent": spec.kv_lora_rank, "rope": spec.qk_rope_head_dim}, fmt)
    index = [Component("index", _entry(spec, family, scheme, "index", {"all": spec.index_head_dim}, fmt))] \
        if spec.index_head_dim else []
    notes = ["MLA caches one latent (kv_lora_rank) plus the decoupled RoPE key per token per layer, shared by all heads"]
    windows = spec.layer_windows or (None,) * spec.num_layers  # (a cache that keeps a window of an MLA model)
    return [LayerCache(i, "mla", (Component("latent", lat, window=w), *index)) for i, w in enumerate(windows)], notes


def _split(spec: ModelSpec, role: str, stored: Entry, elements: int, copies: int, window: int | None,
           plan: KVPlan, group: int = 1) -> tuple[Component, ...]:
    """The stored component of `role` and, when tokens wait unquantized, its residual (model dtype)."""
    block = plan.block if group == 1 else math.lcm(plan.block, group)
    if plan.residual == 0 and block == 1:
        return (Component(role, stored, copies, window=window),)
    res = Residual(plan.residual, block)
    waiting = Entry((Part(role, elements, _dtype_format(spec)),))
    return (Component(role, stored, copies, window=window, group=group, residual=res),
            Component(f"{role}_residual", waiting, copies, window=window, residual=res, pending=True))


def _dense_planned(spec, scheme, plans):
    d = spec.head_dim
    layers = []
    for i, w in enumerate(spec.layer_windows or (None,) * spec.num_layers):
        p = plans[i]
        comps = []
        for role, fmt in (("k", p.k_format), ("v", p.v_format)):
            e = _entry(spec, "dense", scheme, role, {"all": d}, fmt) if fmt else _entry(
                spec, "dense", scheme, "kv", {"all": d}, None)
            group = 1
            if (p.key_groups if role == "k" else p.value_groups):
                if w is not None:
                    raise ParameterError(f"{spec.name} layer {i}: per-channel groups of {role.upper()} (KIVI keys) "
                                         f"need a growing cache; a sliding-window layer ({w} tokens) evicts tokens "
                                         f"one at a time (use {'key' if role == 'k' else 'value'}_axis='token' for it)")
                group = fmt.block
                e = Entry((Part(role, group * d, fmt),))  # G tokens x D channels, channel-major
            comps += _split(spec, role, e, d, spec.num_kv_heads, w, p, group)
        layers.append(LayerCache(i, "sliding" if w else "full", tuple(comps)))
    notes = []
    if any(spec.layer_windows):
        notes.append("sliding-window layers keep only their last `sliding_window` tokens: bounded, not per-token")
    if any(p.key_groups or p.value_groups for p in plans):
        notes.append("integer keys (values) grouped per channel (KIVI): one entry holds G tokens x head_dim, the G "
                     "tokens of a channel sharing one scale and zero point; an incomplete group waits unquantized")
    if any(p.residual or p.block > 1 for p in plans):
        notes.append("a residual holds the most recent tokens unquantized in the model dtype; older tokens are "
                     "quantized a block at a time")
    return layers, notes


def _mla_planned(spec, scheme, plans):
    family = spec.family
    dims = {"latent": spec.kv_lora_rank, "rope": spec.qk_rope_head_dim}
    base = _entry(spec, family, scheme, "latent", dims, None) if scheme != "bf16" else Entry(
        (Part("latent", dims["latent"], get_format("bf16")), Part("rope", dims["rope"], get_format("bf16"))))
    layers = []
    windows = spec.layer_windows or (None,) * spec.num_layers
    for i, p in enumerate(plans):
        if p.key_groups or p.value_groups:
            raise ParameterError(f"{spec.name}: per-channel groups (KIVI) apply to dense K and V; MLA caches a "
                                 "latent and a RoPE key, quantized per token (use key_axis='token')")
        if p.uniform and p.k_format is not None:
            lat = Entry((Part("latent", sum(dims.values()), p.k_format),))
        else:
            fmts = {"latent": p.k_format, "rope": p.v_format}
            lat = Entry(tuple(Part(q.name, q.elements, fmts.get(q.name) or q.fmt) for q in base.parts), base.align)
        comps = list(_split(spec, "latent", lat, sum(dims.values()), 1, windows[i], p))
        if spec.index_head_dim:
            comps.append(Component("index", _entry(spec, family, scheme, "index", {"all": spec.index_head_dim}, None)))
        layers.append(LayerCache(i, "mla", tuple(comps)))
    notes = ["MLA caches one latent (kv_lora_rank) plus the decoupled RoPE key per token per layer, shared by all "
             "heads; a K format applies to the latent, a V format to the RoPE key (what transformers caches as "
             "keys and values)"]
    return layers, notes


def _v4_entries(spec, scheme, fmt) -> tuple[Entry, Entry, Entry]:
    """(main entry, indexer key, SWA entry) of a DeepSeek V4-family model; main and SWA entries are NoPE + RoPE."""
    dims = {"nope": spec.head_dim - spec.qk_rope_head_dim, "rope": spec.qk_rope_head_dim}
    return (_entry(spec, spec.family, scheme, "main", dims, fmt),
            _entry(spec, spec.family, scheme, "index", {"all": spec.index_head_dim}, fmt),
            _entry(spec, spec.family, scheme, "swa", dims, fmt))


def _tail(owner: Component, entry_dims: int, overlap: bool) -> Component:
    """The tail of compressed component `owner`: the kv and gate projections of its < m pending tokens, in BF16.

    Assumption (documented, bounded): an overlapping (CSA) compressor keeps projections of width
    2d, a non-overlapping (HCA) one width d, as in DeepSeek's reference compressor."""
    width = 2 * entry_dims * (2 if overlap else 1)  # kv + gate
    return Component("tail", Entry((Part("tail", width, get_format("bf16")),)), ratio=owner.ratio,
                     tail_of=owner.role)


def _dsv4(spec, scheme, fmt):
    main, index, swa = _v4_entries(spec, scheme, fmt)
    layers = []
    for i, m in enumerate(spec.compress_ratios):
        comps = [Component("swa", swa, window=spec.sliding_window)]
        if m:
            csa = m < 128  # CSA layers carry indexer keys; HCA (m = 128) do not
            owners = [(Component("main", main, ratio=m), spec.head_dim, csa)]
            if csa:
                owners.append((Component("index", index, ratio=m), spec.index_head_dim, True))
            comps += [c for c, _, _ in owners]
            if m > 1:
                comps += [_tail(c, dims, overlap) for c, dims, overlap in owners]
        layers.append(LayerCache(i, "swa" if not m else ("csa" if m < 128 else "hca"), tuple(comps)))
    notes = ["every layer keeps a sliding window of `sliding_window` tokens (bounded)",
             "CSA layers (ratio 4) store a compressed entry and an indexer key per 4 tokens; HCA (ratio 128) "
             "an entry per 128 tokens and no indexer key",
             "compressor tails (pending tokens' kv and gate projections, BF16) are bounded state"]
    return layers, notes


def _dsv41(spec, scheme, fmt):
    main, index, swa = _v4_entries(spec, scheme, fmt)
    sources = sorted(spec.kv_source_layers)
    layers = []
    for i, m in enumerate(spec.compress_ratios):
        comps = [Component("swa", swa, window=spec.sliding_window)]
        if not m:
            layers.append(LayerCache(i, "swa", tuple(comps)))
            continue
        if i in sources:
            owners = [(Component("main", main, ratio=m), spec.head_dim), (Component("index", index, ratio=m),
                                                                           spec.index_head_dim)]
            comps += [c for c, _ in owners]
            if m > 1:
                comps += [_tail(c, dims, True) for c, dims in owners]
            layers.append(LayerCache(i, "full", tuple(comps)))
        else:
            src = max((s for s in sources if s <= i), default=None)
            mode = "reindex" if i in spec.index_source_layers else "reuse"
            layers.append(LayerCache(i, mode, tuple(comps), source=src))
    notes = ["only kv_source_layer_ids (Full layers) store entries; Reindex and Reuse layers read their source's "
             "entries and store none",
             "index_source_layer_ids that are not KV sources (Reindex layers) are assumed to score over their "
             "source's indexer keys and store none (the published 890 B/token requires it)",
             "every layer keeps a 128-token FP8 sliding window (bounded; V4's 584 B entry assumed)"]
    return layers, notes


def bytes_per_token(model, scheme: str = "storage", kv_format=None) -> Fraction:
    """Shortcut: bytes per token of a model's layout."""
    return build_layout(model, scheme, kv_format).bytes_per_token
