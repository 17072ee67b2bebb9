"""A transformers cache that keeps keys and values packed in kvlab formats (issue 11).

`make_cache(model or config, kv_format=..., ...)` returns a `KvlabCache`: a `transformers.Cache` whose
layers (`KvlabLayer`, a `CacheLayerMixin` as transformers' own `DynamicLayer` and `QuantizedLayer` are)
store what the model hands `cache.update`:

  dense (Llama, Mistral, Qwen2/3, Gemma 3)  K and V, [B, kv_heads, T, head_dim] each
  MLA (DeepSeek V2 / V3)                    the latent after kv_a_layernorm as `keys` [B, 1, T, kv_lora_rank]
                                            and the RoPE key as `values` [B, 1, T, qk_rope_head_dim]
                                            (transformers 5.24 models/deepseek_v3/modeling_deepseek_v3.py)

Each stream is packed by `kvlab.cache.codec` through `kvlab.quant.quantize` into exact rows
(`kvlab.hf.store.PackedRows`); the most recent tokens may wait unquantized in a residual, integer keys
may be grouped per channel over G tokens (KIVI), and every layer can take its own plan. What the layers
hold is a `kvlab.layout.Layout` of the same config: `nbytes` (measured from the tensors) equals
`predicted_bytes()` (`Layout.session`) exactly.

Sliding layers keep `sliding_window - 1` tokens between steps, as transformers' `DynamicSlidingWindowLayer`
does (the next query brings the window to `sliding_window`): the layout's one rule, kvlab.layout.window_held.
Attention reads what the cache holds: new tokens are stored first, then every held token is returned
decoded (an engine's kernel reads its quantized cache the same way), so even a prefill sees quantized K/V.
"""
from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from ..cache.memory import storage_bytes
from ..errors import ConfigError, ParameterError
from ..layout import Component, LayerCache, Layout, build_layout, check_tokens
from ..models import ModelSpec, spec_from_config
from ..attention.compress import pool_keys
from ..quant import QuantizeError, quantize
from .mechanisms import DENSE, KeyLayout, Mechanism, mechanism_layout, parse_mechanism, use_kvlab_attention
from . import kernels
from .presses import PressPlan, PressRun, check_attention, layer_bytes, make_plan
from .store import RAW, PackedRows

# transformers model types whose attention hands the cache plain K/V (dense) or the MLA latent + RoPE key.
DENSE_TYPES = ("llama", "mistral", "ministral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gemma3", "gpt_oss",
               "cohere2")
MLA_TYPES = ("deepseek_v2", "deepseek_v3")
SUPPORTED = DENSE_TYPES + MLA_TYPES
LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers layer types a KvlabLayer can stand for


def _text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def check_family(config) -> str:
    """'dense' or 'mla' for a supported transformers config; a ConfigError naming the type otherwise."""
    text = _text_config(config)
    mt = getattr(text, "model_type", None)
    if mt not in SUPPORTED:
        raise ConfigError(f"kvlab.hf caches support model types {', '.join(SUPPORTED)}; this model is {mt!r} "
                          f"({type(text).__name__})")
    return "mla" if mt in MLA_TYPES else "dense"


def hf_spec(config, dtype: torch.dtype, window: int | None = None) -> ModelSpec:
    """kvlab's spec of a transformers config as its cache holds it: each layer's window as transformers reads
    it (the layout keeps `window - 1` tokens of it between steps, kvlab.layout.window_held, as
    DynamicSlidingWindowLayer does), the cache dtype is the states' dtype; `window` (a mechanism's) gives
    every full-attention layer that window too."""
    text = _text_config(config)
    types, kwargs = get_layer_types_and_kwargs(text)
    bad = sorted(set(types) - set(LAYER_TYPES))
    if bad:
        raise ConfigError(f"kvlab.hf caches hold full and sliding attention layers; this "
                          f"{text.model_type} config has layer types {', '.join(bad)}")
    cfg = json.loads(text.to_json_string())
    spec = spec_from_config(cfg, cfg.get("_name_or_path") or text.model_type, source="transformers config")
    windows = tuple(kw["sliding_window"] if t == "sliding_attention" else window for t, kw in zip(types, kwargs))
    return replace(spec, layer_windows=windows if any(w is not None for w in windows) else (),
                   torch_dtype=str(dtype).replace("torch.", ""))


def _check_formats(layout: Layout) -> None:
    """Refuse formats kvlab.quant cannot quantize before the first token, naming them."""
    for _, c in layout.components():
        for p in c.entry.parts:
            try:
                quantize(torch.zeros(1, p.elements), p.fmt, pad=p.fmt.scope == "block")
            except QuantizeError as e:
                raise ParameterError(f"format {p.fmt.name} cannot hold a KV cache here: {e}") from None


class Stream:
    """One cached stream of a layer (dense K or V, or the MLA latent with its RoPE key): a packed store
    of quantized tokens, then a residual of the newest tokens in the model's dtype.

    Positions: packed rows cover tokens [s0, p0), the residual [p0, tokens)."""

    def __init__(self, stored: Component, batch: int, heads: int, width: int, device, dtype):
        self.stored = stored  # the packed component (its residual split and window)
        self.group = stored.group  # tokens per row (KIVI key groups: G)
        self.window = stored.window  # tokens kept between steps (None: all)
        self.batch, self.heads, self.width = batch, heads, width
        self.dtype = dtype  # the cache's dtype: the residual's, and what `held` returns
        self.packed = PackedRows(stored, batch * heads, device)
        self.pend = torch.zeros(batch, heads, 0, width, dtype=dtype, device=device)  # [B, H, p, W]
        self.tokens = self.s0 = self.p0 = 0
        fast = device.type == "cpu" and kernels.covers(stored.entry, dtype)
        self.decoder = kernels.Decoder(stored.entry, self.group) if fast else None  # the compiled decoder, if it applies

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, n, W] -> [n / G, B*H, G*W] (a key group channel-major: each channel's G tokens together)."""
        b, h, n, w = x.shape
        g = self.group
        if g == 1:  # one token (a decode step) is already in row order: one reshape
            return x.reshape(1, b * h, w) if n == 1 else x.permute(2, 0, 1, 3).reshape(n, b * h, w)
        return x.reshape(b, h, n // g, g, w).permute(2, 0, 1, 4, 3).reshape(n // g, b * h, w * g)

    def held(self) -> torch.Tensor:
        """Every held token, packed ones decoded, then the residual: [B, H, T', W] in the cache's dtype."""
        b, h, w, g = self.batch, self.heads, self.width, self.group
        n, p = self.packed.rows, self.pend.shape[2]
        if n and self.decoder is not None:  # compiled: each packed byte read once, each value written in place
            bf16 = self.dtype == torch.bfloat16
            dst = np.empty((b, h, n * g + p, w), np.uint16 if bf16 else np.float32)  # [B, H, T', W]
            self.decoder.decode(self.packed.numpy(), self.packed.tensor_scales, dst.reshape(b * h, n * g + p, w))
            if p:  # the residual after them (numpy views of both: no torch op per step for the copy)
                dst[:, :, n * g:] = self.pend.view(torch.int16).numpy().view(np.uint16) if bf16 else self.pend.numpy()
            return torch.from_numpy(dst.view(np.int16)).view(self.dtype) if bf16 else torch.from_numpy(dst)
        if n and not p and g == 1 and self.packed.raw == self.dtype:  # raw rows in the cache's dtype: one copy
            return self.packed.store.state().view(self.dtype).view(n, b, h, w).permute(1, 2, 0, 3).contiguous()
        out = torch.empty(b, h, n * g + p, w, dtype=self.dtype, device=self.pend.device)
        if n:  # decoded rows go straight into place (one conversion to the cache's dtype on the way)
            r = self.packed.read()  # [N, B*H, G*W]
            if g == 1:
                out[:, :, :n].copy_(r.view(n, b, h, w).permute(1, 2, 0, 3))
            else:
                out[:, :, :n * g].view(b, h, n, g, w).copy_(r.view(n, b, h, w, g).permute(1, 2, 0, 4, 3))
        if p:
            out[:, :, n * g:].copy_(self.pend)
        return out

    def update(self, x: torch.Tensor) -> torch.Tensor:
        """Store x [B, H, S, W]; return every held token then the new ones, decoded: [B, H, T', W]."""
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        self.tokens += x.shape[2]
        res = self.stored.residual
        if res is None:  # nothing waits: the new tokens go straight into the packed store
            self.packed.append(self._rows(x))
            self.p0 = self.tokens
        else:
            self.pend = torch.cat([self.pend, x], dim=2)
            q = res.quantized(self.tokens)  # tokens that have left the residual
            if q > self.p0:
                n = q - self.p0
                self.packed.append(self._rows(self.pend[:, :, :n]))
                self.pend = self.pend[:, :, n:].clone()  # own storage: the quantized tokens' bytes are freed
                self.p0 = q
        out = self.held()
        if self.window is not None:
            self._evict(self.tokens - self.window)
        return out

    def _evict(self, lo: int) -> None:
        """Keep tokens at positions >= lo."""
        if lo > self.s0:
            drop = min(lo, self.p0) - self.s0
            self.packed.drop_front(drop // self.group)
            self.s0 += drop
        if lo > self.p0:
            self.pend = self.pend[:, :, lo - self.p0:].clone()
            self.p0 = self.s0 = lo

    def tensors(self) -> list[torch.Tensor]:
        return self.packed.tensors() + [self.pend]

    @property
    def count(self) -> int:
        """Tokens held (packed and waiting)."""
        return self.tokens - self.s0

    def keep(self, slots: torch.Tensor) -> None:
        """Keep the held tokens at `slots` [B, H, n] (a press's choice per head, in position order); the
        others' bytes are freed. Packed rows of single tokens are gathered byte for byte; otherwise (a
        residual, KIVI key groups) the kept tokens are decoded and stored again, as a fresh stream of n tokens
        (the layout's rule for n tokens: the newest wait in the residual, groups close every G)."""
        b, h, n = slots.shape
        if not self.pend.shape[2] and self.group == 1 and self.window is None and self.s0 == 0:
            rows = self.packed.packed()  # [N, B*H, E] uint8
            idx = slots.reshape(b * h, n).t()[..., None].expand(-1, -1, rows.shape[2])  # [n, B*H, E]
            self.packed.store.load_state(rows.gather(0, idx).reshape(n, -1).contiguous())  # own storage
            self.packed.store.tokens = n
            self.packed._np = None
            self.tokens = self.p0 = n
            return
        kept = self.held().gather(2, slots[..., None].expand(-1, -1, -1, self.width))  # [B, H, n, W]
        self.packed = PackedRows(self.stored, b * h, self.pend.device)
        self.pend = self.pend[:, :, :0].clone()
        self.tokens = self.s0 = self.p0 = 0
        self.update(kept)

    def reorder(self, index: torch.Tensor) -> None:
        self.packed.reorder(index, self.batch)
        self.pend = self.pend.index_select(0, index.to(self.pend.device))


class RawStream(Stream):
    """A stream whose entries are the model's own values (BF16 / FP16 / FP32 in the cache's dtype, one token a row,
    nothing waiting in a residual): its bytes already are what attention reads, so it holds them laid out as
    attention reads them, [B, H, T, W], grown by one concatenation a step as transformers' DynamicLayer grows —
    no re-layout per step, the same bytes as the packed rows (so the layout's count still holds exactly)."""

    def __init__(self, stored: Component, batch: int, heads: int, width: int, device, dtype):
        super().__init__(stored, batch, heads, width, device, dtype)
        self.packed = None  # no packed rows: `data` is the store
        self.data = torch.zeros(batch, heads, 0, width, dtype=dtype, device=device)  # [B, H, held, W]

    @staticmethod
    def applies(stored: Component, dtype: torch.dtype) -> bool:
        """Every part of the entry raw in `dtype` (an MLA latent and its RoPE key side by side, as the stream
        carries them), unaligned, one token a row, no residual."""
        e = stored.entry
        return (e.align == 1 and all(RAW.get(p.fmt.name) == dtype for p in e.parts) and stored.residual is None
                and stored.group == 1)

    def held(self) -> torch.Tensor:
        return self.data

    def update(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        self.tokens += x.shape[2]
        self.p0 = self.tokens
        out = self.data = torch.cat([self.data, x], dim=2)  # [B, H, held + S, W]
        if self.window is not None:
            self._evict(self.tokens - self.window)
        return out

    def _evict(self, lo: int) -> None:
        if lo > self.s0:
            self.data = self.data[:, :, lo - self.s0:].clone()  # own storage: the evicted tokens' bytes are freed
            self.s0 = lo

    def tensors(self) -> list[torch.Tensor]:
        return [self.data]

    def keep(self, slots: torch.Tensor) -> None:
        self.data = self.data.gather(2, slots[..., None].expand(-1, -1, -1, self.width))  # [B, H, n, W]
        self.tokens = self.p0 = slots.shape[2]
        self.s0 = 0

    def reorder(self, index: torch.Tensor) -> None:
        self.data = self.data.index_select(0, index.to(self.data.device))


class KvlabLayer(CacheLayerMixin):
    """One decoder layer's cache: dense K and V streams, or one MLA latent + RoPE key stream; with a
    pooling mechanism (csa / hca) also a stream of pooled entries per role."""

    is_compileable = False
    is_croppable = False

    def __init__(self, layer: LayerCache, kind: str, sliding_window: int | None, mech: Mechanism = DENSE,
                 dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.dtype = dtype  # the cache's dtype (its residual and raw tokens); attention gets the model's
        self.plan = layer  # the layout's view of this layer (components, formats)
        self.kind = kind  # "dense" or "mla"
        self.mech = mech  # what attention may read (DENSE: everything held; sliding layers keep DENSE)
        self.sliding_window = sliding_window  # tokens a query sees (the model's window, or the mechanism's)
        self.is_sliding = sliding_window is not None
        self.cumulative_length = 0  # tokens seen
        self.streams: dict[str, Stream] = {}  # role -> raw tokens ("k", "v" / "latent")
        self.pools: dict[str, Stream] = {}  # role -> pooled entries (csa / hca)
        self.split = 0  # MLA: width of the latent inside the stream
        self.keys_info: KeyLayout | None = None  # what the last update returned, for kvlab_attention
        self.press_run: PressRun | None = None  # a press evicting this layer's tokens (kvlab.hf.presses)
        self._pos: torch.Tensor | None = None  # with a press: [B, Hkv, n] positions of the tokens held at the last
        # pruning (None: never pruned); the tokens after them are the newest (`positions`)
        self.readable: torch.Tensor | None = None  # [B, Hkv, held] slots attention reads (None: all)
        self.seen: list | None = None  # while a context is prefilled for reuse (kvlab.hf.context): each update's K/V

    def _stored(self, role: str) -> Component:
        return next(c for c in self.plan.components if c.role == role)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        b, h = key_states.shape[:2]
        if self.kind == "mla":
            self.split = key_states.shape[-1]
            shapes = {"latent": (1, self.split + value_states.shape[-1])}
        else:
            shapes = {"k": (h, key_states.shape[-1]), "v": (h, value_states.shape[-1])}
        for role, (heads, width) in shapes.items():
            kind = RawStream if RawStream.applies(self._stored(role), self.dtype) else Stream
            self.streams[role] = kind(self._stored(role), b, heads, width, self.device, self.dtype)
            if self.mech.ratio is not None:
                self.pools[role] = Stream(self._stored(f"{role}_pooled"), b, heads, width, self.device, self.dtype)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.seen is not None:
            self.seen.append((key_states, value_states))
        before = self.cumulative_length
        self.cumulative_length += key_states.shape[-2]
        if self.kind == "mla":
            out = self._role("latent", torch.cat([key_states, value_states], dim=-1), before)
            keys, values = out[..., :self.split], out[..., self.split:]
        else:
            keys, values = self._role("k", key_states, before), self._role("v", value_states, before)
        if not self.mech.dense:
            self._publish(before, keys.shape[-2], kwargs.get("kwargs"))
        if self.press_run is not None:
            self._press(before, keys.shape[:2], kwargs.get("kwargs"))
        if keys.dtype != key_states.dtype:  # a cache kept in another dtype than the model computes in
            keys, values = keys.to(key_states.dtype), values.to(value_states.dtype)
        return keys, values

    def _role(self, role: str, x: torch.Tensor, before: int) -> torch.Tensor:
        """Store x [B, H, S, W] in the role's stream; return its pooled entries (if any) then its raw tokens."""
        raw = self.streams[role].update(x)  # [B, H, kept + S, W], the last token at position `now - 1`
        pool = self.pools.get(role)
        if pool is None:
            return raw
        m, now = self.mech.ratio, self.cumulative_length
        n0, n1 = before // m, now // m  # complete entries before and after this update
        new = raw[:, :, :0]
        if n1 > n0:
            first = now - raw.shape[2]  # position of raw's first token
            back = 1 if self.mech.overlap and n0 > 0 else 0  # CSA: the window before pools into the entry too
            seg = raw[:, :, (n0 - back) * m - first:n1 * m - first]
            new = pool_keys(seg, m, self.mech.overlap)[:, :, back:].to(raw.dtype)  # [B, H, n1 - n0, W]
        return torch.cat([pool.update(new), raw], dim=2)

    def _publish(self, before: int, returned: int, attn_kwargs) -> None:
        """Tell kvlab_attention which positions the returned keys cover, through the attention kwargs."""
        if not isinstance(attn_kwargs, dict):
            raise ConfigError("this model's attention does not hand its kwargs to the cache, so kvlab mechanisms "
                              "cannot reach its attention function")
        now, dev = self.cumulative_length, self.device
        m = self.mech.ratio
        n = now // m if m else 0
        raw = torch.arange(now - (returned - n), now, device=dev)
        e = torch.arange(n, device=dev)
        start = torch.cat([(e - (1 if self.mech.overlap else 0)).clamp_min(0) * m, raw]) if m else raw
        end = torch.cat([(e + 1) * m - 1, raw]) if m else raw
        self.keys_info = KeyLayout(self.mech, torch.arange(before, now, device=dev), start, end, n)
        attn_kwargs["kvlab_keys"] = self.keys_info

    def _press(self, before: int, shape, attn_kwargs) -> None:
        """Track the new tokens' positions and hand the press to kvlab_attention through the attention kwargs."""
        if not isinstance(attn_kwargs, dict):
            raise ConfigError("this model's attention does not hand its kwargs to the cache, so a press cannot "
                              "reach its attention function")
        run = self.press_run
        if self.readable is not None:  # new tokens are read by every head (their positions: `positions`)
            b, h = shape
            new = torch.ones(b, h, self.cumulative_length - before, dtype=torch.bool, device=self.device)
            self.readable = torch.cat([self.readable, new], dim=2)
        elif run.done():
            return  # the context is compressed and every head reads all it holds: plain SDPA, nothing to hand over
        run.read = False
        attn_kwargs["kvlab_press"] = run

    @property
    def held_tokens(self) -> int:
        """Tokens (slots per KV head) the layer holds."""
        return next(iter(self.streams.values())).count if self.streams else 0

    @property
    def positions(self) -> torch.Tensor:
        """[B, Hkv, held] LongTensor: the original position of each token held, sorted (kvpress's kept set).
        Tokens that entered after the last pruning are the newest, contiguous up to now: they are only
        written out here, when read (not every step)."""
        n, dev = self.held_tokens, getattr(self, "device", None)
        tail = n - (0 if self._pos is None else self._pos.shape[2])  # tokens held since the last pruning
        if tail == 0 and self._pos is not None:
            return self._pos
        heads = next(iter(self.streams.values())).heads if self.streams else 0
        new = torch.arange(self.cumulative_length - tail, self.cumulative_length, device=dev).expand(
            self.batch, heads, -1)  # [B, Hkv, tail]
        if self._pos is None:
            return new
        self._pos = torch.cat([self._pos, new], dim=2)
        return self._pos

    def query_positions(self, q: int) -> torch.Tensor:
        """[q] positions of the last update's q tokens."""
        return torch.arange(self.cumulative_length - q, self.cumulative_length, device=self.device)

    def keep(self, slots: torch.Tensor, readable: torch.Tensor | None = None) -> None:
        """Keep the held tokens at `slots` [B, Hkv, n] (sorted) and free the rest; `readable` [B, Hkv, n]
        marks those attention reads (a per-head budget that holds more than some heads keep)."""
        pos = self.positions.gather(2, slots)  # [B, Hkv, n], read before the streams shrink
        for s in self.streams.values():
            s.keep(slots)
        self._pos = pos
        prev = None if self.readable is None else self.readable.gather(2, slots)
        self.readable = readable if prev is None else (prev if readable is None else prev & readable)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of what the next update returns, as transformers' dynamic layers say."""
        past = self.cumulative_length
        if self.press_run is not None:  # evicted tokens: the held ones all precede the queries
            held = self.held_tokens
            return held + query_length, past - held
        pooled = past // self.mech.ratio if self.mech.ratio else 0
        if self.sliding_window is None:
            return past + query_length, 0
        w = self.sliding_window
        kept = min(past, w - 1)
        return pooled + kept + query_length, max(past - w + 1, 0)

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return self.sliding_window if self.sliding_window is not None and not self.mech.ratio else -1

    def reset(self) -> None:
        self.streams, self.pools, self.cumulative_length, self.is_initialized = {}, {}, 0, False
        self.keys_info = None
        self._pos = self.readable = None
        if self.press_run is not None:  # a new sequence: its first forward is a new context
            plan = self.press_run.plan
            plan.context, plan.kept = None, {}
            self.press_run = PressRun(plan, self, self.press_run.index)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for s in (*self.streams.values(), *self.pools.values()):
            s.reorder(beam_idx)
        if self._pos is not None:
            self._pos = self._pos.index_select(0, beam_idx.to(self._pos.device))

    def offload(self):
        raise ParameterError("kvlab caches are not offloadable (offloading=True is not supported)")

    prefetch = offload

    def tensors(self) -> list[torch.Tensor]:
        return [t for s in (*self.streams.values(), *self.pools.values()) for t in s.tensors()]

    @property
    def batch(self) -> int:
        return next(iter(self.streams.values())).batch if self.streams else 0


class KvlabCache(Cache):
    """A transformers Cache whose layers hold K/V packed in kvlab formats; `nbytes` == `predicted_bytes()`."""

    def __init__(self, config, options: dict, dtype: torch.dtype = torch.bfloat16, mechanism=None,
                 follow: bool = True, press: PressPlan | None = None):
        self.config = _text_config(config)
        self.kind = check_family(self.config)
        self.mech = parse_mechanism(mechanism)  # applies to the full-attention layers
        self.options = dict(options)  # build_layout's format options (kv_format, k_format, ..., per_layer)
        self.follow = follow  # take the states' dtype at the first update (else keep `dtype`)
        types, kwargs = get_layer_types_and_kwargs(self.config)
        self.full = [t == "full_attention" for t in types]  # layers a mechanism applies to
        if not self.mech.dense and not any(self.full):
            raise ParameterError(f"mechanism {self.mech.label()} applies to full-attention layers; this "
                                 f"{self.config.model_type} model has none (every layer already slides)")
        self._last: KeyLayout | None = None  # the last update's key layout, to check kvlab_attention read it
        self._due: PressRun | None = None  # the press run of the last layer updated, to check its attention ran
        self.layout = self._build(dtype)
        layers = []
        for lc, full, kw in zip(self.layout.layers, self.full, kwargs):
            window = self.mech.window if full else kw.get("sliding_window")
            layers.append(KvlabLayer(lc, self.kind, window, self.mech if full else DENSE, dtype))
        super().__init__(layers=layers)
        self.press = press  # a press and its budget (kvlab.hf.presses), acting on the full-attention layers
        if press is not None:
            if not self.mech.dense:
                raise ParameterError(f"give a press or a mechanism, not both (press {press.label()}, mechanism "
                                     f"{self.mech.label()})")
            if self.kind == "mla":
                raise ParameterError(f"press {press.press.name} scores dense K/V heads; this {self.config.model_type} "
                                     "model caches an MLA latent shared by its heads (use a dense model)")
            if not any(self.full):
                raise ParameterError(f"press {press.press.name} acts on full-attention layers; this "
                                     f"{self.config.model_type} model has none")
            press.applies = tuple(self.full)
            for i, (lyr, full) in enumerate(zip(self.layers, self.full)):
                if full:
                    lyr.press_run = PressRun(press, lyr, i)

    def _build(self, dtype: torch.dtype) -> Layout:
        spec = hf_spec(self.config, dtype, self.mech.window)
        layout = mechanism_layout(build_layout(spec, "storage", **self.options), self.mech, self.full)
        _check_formats(layout)
        return layout

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layer = self.layers[layer_idx]
        if self.follow and not layer.is_initialized and key_states.dtype != self.dtype:
            self.layout = self._build(key_states.dtype)  # the residual holds the states' dtype
            for lyr, lc in zip(self.layers, self.layout.layers):
                lyr.plan, lyr.dtype = lc, key_states.dtype
        if self._last is not None and not self._last.read:
            raise ParameterError(f"mechanism {self.mech.label()} needs kvlab's attention function: call "
                                 "kvlab.hf.use_kvlab_attention(model) (make_cache(model, mechanism=...) does it)")
        if self.press is not None:
            check_attention(self._due, self.press)  # the last press handed to attention must have reached it
            if self.press.context is None and not layer.cumulative_length and layer_idx == self.full.index(True):
                self.press.context = key_states.shape[-2]  # the first forward is the context
                self.press.kept = self.press.resolve(self.press.context, self.layout, key_states.shape[0])
        out = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        self._last = layer.keys_info
        self._due = layer.press_run
        return out

    def load_context(self, context) -> "KvlabCache":
        """Hold a context prefilled once (`kvlab.hf.context.prefill`) as this cache holds it: each layer's K/V stored
        in its formats, and, with a press, compressed once by it, scored from the prefill's queries and the keys
        as this cache holds them. The cache ends where a forward of the context through it would leave it, had its
        attention read the context at the model's precision (the question-agnostic protocol: kvlab.quality.prompt).
        Returns the cache."""
        if not all(hasattr(context, a) for a in ("keys", "values", "queries", "scaling", "mechanism")):
            raise ParameterError(f"load_context takes a kvlab.hf.context.Context, got {type(context).__name__}")
        if self.tokens:
            raise ParameterError(f"load_context fills an empty cache; this one holds {self.tokens:,} tokens")
        if len(context.keys) != len(self.layers):
            raise ParameterError(f"the context was prefilled through {len(context.keys)} layers; this cache has "
                                 f"{len(self.layers)} (another model?)")
        if context.mechanism != self.mech.label():
            raise ParameterError(f"the context was prefilled with mechanism {context.mechanism}; this cache reads "
                                 f"{self.mech.label()} (a mechanism changes the prefill's attention: prefill with it)")
        if self.press is not None and self.press.press.needs and not context.queries:
            raise ParameterError(f"press {self.press.label()} scores with the prefill's queries: prefill with "
                                 "queries=True")
        for i, (k, v) in enumerate(zip(context.keys, context.values)):
            attn = {}  # what attention would be handed; the prefill's own attention already ran
            keys, values = self.update(k, v, i, kwargs=attn)
            if self._last is not None:
                self._last.read = True
            run = self.layers[i].press_run
            if run is not None:
                q = context.queries.get(i)
                run.after(q, keys, values, context.scaling.get(i, keys.shape[-1] ** -0.5))
                run.forwards += 1
                run.read = True
        return self

    @property
    def runs(self) -> list[PressRun]:
        """The press at work in each layer it acts on (kvlab.hf.presses.run)."""
        return [layer.press_run for layer in self.layers if layer.press_run is not None]

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.layout.model.torch_dtype)

    @property
    def tokens(self) -> int:
        return max((layer.cumulative_length for layer in self.layers), default=0)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the cache holds: packed rows, per-tensor scales, residual tokens."""
        return [t for layer in self.layers for t in layer.tensors()]

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds, measured from its tensors' storages (each counted once)."""
        return storage_bytes(self.tensors())

    def predicted_bytes(self, tokens: int | None = None) -> int:
        """kvlab's prediction (`Layout.session`) for this config and plan at `tokens` (default: what it holds)."""
        tokens = self.tokens if tokens is None else check_tokens(tokens)
        batch = max((layer.batch for layer in self.layers), default=0) or 1
        if self.press is not None and self.press.context is not None:  # each layer: the press's kept count
            return sum(layer_bytes(self.layout, i, self.press.held(i, tokens), batch)
                       for i in range(len(self.layers)))
        return self.layout.session(tokens, batch).total

    @property
    def kv_format(self) -> str:
        """The plan's label ('nvfp4', 'k=int4/channel v=int4 residual=32', 'per-layer', ...)."""
        return self.layout.kv_format or self.layout.model.torch_dtype


def make_cache(config_or_model, kv_format=None, k_format=None, v_format=None, residual: int = 0, *,
               block: int = 1, key_axis: str | None = None, value_axis: str = "token", per_layer: dict | None = None,
               mechanism=None, dtype: torch.dtype | None = None, press=None, keep: float | int | None = None,
               keep_bytes: int | None = None, press_mode: str = "prefill",
               press_options: dict | None = None) -> KvlabCache:
    """A transformers cache for a model (or its config) that keeps K and V packed in kvlab formats.

    kv_format: one format for K and V (None: the model's dtype, as DynamicCache holds them);
    k_format / v_format: separate formats (MLA: the latent and the RoPE key);
    residual: the most recent tokens kept unquantized (KIVI's R); block: tokens quantized together;
    key_axis: "channel" groups integer keys per channel over G tokens (KIVI), "token" along head_dim;
        default: "channel" on the growing layers of dense models, "token" elsewhere;
    value_axis: "token" (KIVI, the default) or "channel" (integer values grouped as keys are, as transformers'
        QuantizedCache groups both);
    per_layer: {layer: {option: value}} overrides of any of the above;
    mechanism: what attention reads on full-attention layers ('window=64', 'topk=32', 'capped=16x8,topk=32',
        'csa=4,topk=32,window=64', 'hca=32,window=64'; kvlab.hf.mechanisms); given a model, switches it to
        kvlab's attention function (SDPA itself wherever no mechanism applies);
    dtype: the dtype the cache keeps unquantized tokens in (its residual; attention still gets the model's
        dtype); default: the states' own, taken at the first update;
    press: a token-eviction method on full-attention layers (kvlab.hf.presses.PRESSES: 'snapkv', 'knorm',
        'streaming_llm', 'tova', 'h2o', 'expected_attention', 'random', 'pyramidkv', 'adakv', 'keydiff',
        'lagkv', 'chunkkv', 'cur'), with keep (< 1: the fraction of the context's tokens kept; >= 1:
        tokens) or keep_bytes (bytes the cache holds after compressing the context); press_mode "prefill" (kvpress:
        the first forward is the context, compressed once) or "decode" (evicted back to the budget after every
        forward: h2o, tova, streaming_llm); press_options: the press's own fields (window_size, n_sink, seed,
        inner, ...). Given a model, switches it to kvlab's attention function.
    """
    model = config_or_model if hasattr(config_or_model, "config") and hasattr(config_or_model, "forward") else None
    config = model.config if model is not None else config_or_model
    if not hasattr(config, "to_json_string"):
        raise ParameterError(f"make_cache takes a transformers model or config, got {type(config_or_model).__name__}")
    kind = check_family(config)
    mech = parse_mechanism(mechanism)
    if key_axis is None and kind == "dense":  # KIVI on growing layers; a window evicts token by token
        types, _ = get_layer_types_and_kwargs(_text_config(config))
        per_layer = dict(per_layer or {})
        for i, t in enumerate(types):
            windowed = t == "sliding_attention" or mech.window is not None
            if windowed and isinstance(per_layer.get(i, {}), dict):
                per_layer[i] = {"key_axis": "token", "value_axis": "token", **per_layer.get(i, {})}
    key_axis = key_axis or ("channel" if kind == "dense" else "token")
    follow = dtype is None
    if dtype is None:
        dtype = model.dtype if model is not None else (getattr(_text_config(config), "dtype", None) or torch.bfloat16)
        dtype = getattr(torch, str(dtype).replace("torch.", "")) if not isinstance(dtype, torch.dtype) else dtype
    options = dict(kv_format=kv_format, k_format=k_format, v_format=v_format, residual=residual, block=block,
                   key_axis=key_axis, value_axis=value_axis, per_layer=per_layer)
    plan = None
    if press is not None:
        plan = make_plan(press, keep, keep_bytes, press_mode, press_options)
        plan.rotary = _rotary(model)
    elif keep is not None or keep_bytes is not None:
        raise ParameterError("keep / keep_bytes are a press's budget: give press=... too")
    cache = KvlabCache(config, options, dtype, mech, follow, plan)
    if model is not None and (not mech.dense or plan is not None):
        use_kvlab_attention(model)
    return cache


def _rotary(model):
    """The model's rotary embedding (presses that rotate query statistics, kvpress's ExpectedAttention) as
    rotary(x, position_ids) -> (cos, sin). A model with one RoPE per layer type (Gemma 3: `rope_type` a dict, its
    forward taking `layer_type`) gives the full-attention layers' one: presses act there alone."""
    inner = getattr(model, "model", None)
    inner = getattr(inner, "language_model", inner)
    rope = getattr(inner, "rotary_emb", None)
    if rope is not None and isinstance(getattr(rope, "rope_type", None), dict):
        return partial(rope, layer_type="full_attention")
    return rope
