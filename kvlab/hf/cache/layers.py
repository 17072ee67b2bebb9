"""A cache layer per kind of decoder layer, picked from the config's `layer_types` through one mapping (`LAYERS`),
as transformers' DynamicCache picks DynamicLayer / DynamicSlidingWindowLayer from DYNAMIC_LAYER_TYPE_MAPPING:

  FullLayer     full attention, dense K and V [B, kv_heads, T, head_dim] each; a mechanism (kvlab.hf.mechanisms:
                a window, pooled entries, top-k reads) and a press (kvlab.hf.presses) act here
  SlidingLayer  the model's sliding window over dense K and V: keeps `sliding_window - 1` tokens between steps
                (kvlab.layout.window_held, as DynamicSlidingWindowLayer does); no mechanism, no press
  MlaLayer      full attention of an MLA model (DeepSeek V2 / V3): the latent after kv_a_layernorm as `keys`
                [B, 1, T, kv_lora_rank] and the RoPE key as `values` [B, 1, T, qk_rope_head_dim] in one stream
                (transformers 5.24 models/deepseek_v3/modeling_deepseek_v3.py); presses refuse it

`KvlabLayer` holds what they share: the streams of each role, the positions a press keeps, the sizes of the mask.
"""
from __future__ import annotations

from typing import ClassVar

import torch
from transformers.cache_utils import CacheLayerMixin

from ...attention.compress import pool_keys
from ...errors import ConfigError, ParameterError
from ...layout import Component, LayerCache
from ..mechanisms import DENSE, KeyLayout, Mechanism
from ..presses import PressRun
from .streams import RawStream, Stream


class KvlabLayer(CacheLayerMixin):
    """One decoder layer's cache: a stream per role (`roles`), with a pooling mechanism (csa / hca) also a stream
    of pooled entries per role. A kind of layer says which roles it stores and how (`roles`, `store`), its window
    and mechanism (`make`); everything else is here."""

    is_compileable = False
    is_croppable = False
    full: ClassVar[bool] = True  # a full-attention layer: a mechanism and a press act on it
    press_refusal: ClassVar[str] = ""  # why no press can act on this kind of layer ("": one can)
    key_axis: ClassVar[str] = "token"  # how integer keys are grouped by default ("channel": KIVI, over G tokens)

    def __init__(self, layer: LayerCache, sliding_window: int | None, mech: Mechanism = DENSE,
                 dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.dtype = dtype  # the cache's dtype (its residual and raw tokens); attention gets the model's
        self.plan = layer  # the layout's view of this layer (components, formats)
        self.mech = mech  # what attention may read (DENSE: everything held; sliding layers keep DENSE)
        self.sliding_window = sliding_window  # tokens a query sees (the model's window, or the mechanism's)
        self.is_sliding = sliding_window is not None
        self.cumulative_length = 0  # tokens seen
        self.streams: dict[str, Stream] = {}  # role -> raw tokens ("k", "v" / "latent")
        self.pools: dict[str, Stream] = {}  # role -> pooled entries (csa / hca)
        self.keys_info: KeyLayout | None = None  # what the last update returned, for kvlab_attention
        self.press_run: PressRun | None = None  # a press evicting this layer's tokens (kvlab.hf.presses)
        self._pos: torch.Tensor | None = None  # with a press: [B, Hkv, n] positions of the tokens held at the last
        # pruning (None: never pruned); the tokens after them are the newest (`positions`)
        self.readable: torch.Tensor | None = None  # [B, Hkv, held] slots attention reads (None: all)
        self.seen: list | None = None  # while a context is prefilled for reuse (kvlab.hf.context): each update's K/V

    # --- what a kind of layer says --------------------------------------------------------------------------
    @classmethod
    def make(cls, plan: LayerCache, kwargs: dict, mech: Mechanism, dtype: torch.dtype) -> "KvlabLayer":
        """This kind's layer for one decoder layer: its layout, transformers' kwargs for its type, the cache's
        mechanism (for full-attention layers)."""
        return cls(plan, cls.window_of(kwargs, mech.window), mech, dtype)

    @classmethod
    def window_of(cls, kwargs: dict, mech_window: int | None) -> int | None:
        """Tokens a query of this layer sees (None: all), given transformers' kwargs and a mechanism's window."""
        return mech_window

    @classmethod
    def windowed(cls, mech: Mechanism) -> bool:
        """Does this layer evict by a window (so its keys cannot wait for G tokens to group per channel)?"""
        return mech.window is not None

    def roles(self, key_states: torch.Tensor, value_states: torch.Tensor) -> dict[str, tuple[int, int]]:
        """role -> (heads, width) of the streams that hold this layer's states."""
        raise NotImplementedError

    def store(self, key_states: torch.Tensor, value_states: torch.Tensor, before: int):
        """Store the new states in the streams; return (keys, values) attention reads."""
        raise NotImplementedError

    # --- shared ---------------------------------------------------------------------------------------------
    def _stored(self, role: str) -> Component:
        return next(c for c in self.plan.components if c.role == role)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        b = key_states.shape[0]
        for role, (heads, width) in self.roles(key_states, value_states).items():
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
        keys, values = self.store(key_states, value_states, before)
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


class FullLayer(KvlabLayer):
    """Full attention over dense K and V streams, [B, kv_heads, T, head_dim] each."""

    key_axis = "channel"  # KIVI groups integer keys per channel on the layers that grow

    def roles(self, key_states, value_states):
        h = key_states.shape[1]
        return {"k": (h, key_states.shape[-1]), "v": (h, value_states.shape[-1])}

    def store(self, key_states, value_states, before):
        return self._role("k", key_states, before), self._role("v", value_states, before)


class SlidingLayer(FullLayer):
    """The model's sliding window over dense K and V: `sliding_window - 1` tokens kept between steps."""

    full = False
    key_axis = "token"

    @classmethod
    def make(cls, plan, kwargs, mech, dtype):
        return cls(plan, cls.window_of(kwargs, mech.window), DENSE, dtype)  # a mechanism is for full layers

    @classmethod
    def window_of(cls, kwargs, mech_window):
        return kwargs["sliding_window"]

    @classmethod
    def windowed(cls, mech):
        return True


class MlaLayer(FullLayer):
    """Full attention of an MLA model: the latent and the RoPE key side by side in one stream, [B, 1, T, r + d]."""

    press_refusal = "caches an MLA latent shared by its heads (use a dense model)"
    key_axis = "token"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.split = 0  # width of the latent inside the stream (set at the first update)

    def roles(self, key_states, value_states):
        self.split = key_states.shape[-1]
        return {"latent": (1, self.split + value_states.shape[-1])}

    def store(self, key_states, value_states, before):
        out = self._role("latent", torch.cat([key_states, value_states], dim=-1), before)
        return out[..., :self.split], out[..., self.split:]


# (family, transformers layer type) -> the class that holds it; kvlab.hf.cache.family.layer_kinds reads it
LAYERS: dict[tuple[str, str], type[KvlabLayer]] = {
    ("dense", "full_attention"): FullLayer,
    ("dense", "sliding_attention"): SlidingLayer,
    ("mla", "full_attention"): MlaLayer,
}
