"""A transformers cache that keeps keys and values packed in kvlab formats (issue 11).

`make_cache(model or config, kv_format=..., ...)` returns a `KvlabCache`: a `transformers.Cache` whose
layers (a `KvlabLayer` per kind, kvlab.hf.cache.layers, picked from the config's layer_types; a `CacheLayerMixin`
as transformers' own `DynamicLayer` and `QuantizedLayer` are) store what the model hands `cache.update`:

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

from functools import partial

import torch
from transformers.cache_utils import Cache

from ...cache.memory import storage_bytes
from ...errors import ParameterError
from ...layout import Layout, build_layout, check_tokens
from ...quant import QuantizeError, quantize
from ..mechanisms import KeyLayout, mechanism_layout, parse_mechanism, use_kvlab_attention
from ..presses import PressPlan, PressRun, check_attention, compose, layer_bytes
from .family import check_family, hf_spec, layer_kinds, text_config
from .layers import LAYERS


def _check_formats(layout: Layout) -> None:
    """Refuse formats kvlab.quant cannot quantize before the first token, naming them."""
    for _, c in layout.components():
        for p in c.entry.parts:
            try:
                quantize(torch.zeros(1, p.elements), p.fmt, pad=p.fmt.scope == "block")
            except QuantizeError as e:
                raise ParameterError(f"format {p.fmt.name} cannot hold a KV cache here: {e}") from None


class KvlabCache(Cache):
    """A transformers Cache whose layers hold K/V packed in kvlab formats; `nbytes` == `predicted_bytes()`."""

    def __init__(self, config, options: dict, dtype: torch.dtype = torch.bfloat16, mechanism=None,
                 follow: bool = True, press: PressPlan | None = None):
        self.config = text_config(config)
        self.family = check_family(self.config)  # "dense" or "mla": what attention hands the cache
        self.mech = parse_mechanism(mechanism)  # applies to the full-attention layers
        self.options = dict(options)  # build_layout's format options (kv_format, k_format, ..., per_layer)
        self.follow = follow  # take the states' dtype at the first update (else keep `dtype`)
        kinds = layer_kinds(self.config)  # each layer's class (kvlab.hf.cache.layers.LAYERS) and its kwargs
        self.full = [cls.full for cls, _ in kinds]  # layers a mechanism and a press apply to
        if not self.mech.dense and not any(self.full):
            raise ParameterError(f"mechanism {self.mech.label()} applies to full-attention layers; this "
                                 f"{self.config.model_type} model has none (every layer already slides)")
        self._last: KeyLayout | None = None  # the last update's key layout, to check kvlab_attention read it
        self._due: PressRun | None = None  # the press run of the last layer updated, to check its attention ran
        self.layout = self._build(dtype)
        super().__init__(layers=[cls.make(lc, kw, self.mech, dtype)
                                 for lc, (cls, kw) in zip(self.layout.layers, kinds)])
        self.press = press  # a press and its budget (kvlab.hf.presses), acting on the full-attention layers
        if press is not None:
            if not self.mech.dense:
                raise ParameterError(f"give a press or a mechanism, not both (press {press.label()}, mechanism "
                                     f"{self.mech.label()})")
            refusal = next((cls.press_refusal for cls, _ in kinds if cls.press_refusal), "")
            if refusal:
                raise ParameterError(f"press {press.press.name} scores dense K/V heads; this {self.config.model_type} "
                                     f"model {refusal}")
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
    press: a token-eviction method on full-attention layers (a name in kvlab.hf.presses.PRESSES, a Press, or a
        kvlab.hf.presses.Composed that brings its own budget, mode, format and residual), with keep (< 1: the
        fraction of the context's tokens kept; >= 1: tokens) or keep_bytes (bytes the cache holds after compressing
        the context); press_mode "prefill" (kvpress: the first forward is the context, compressed once) or "decode"
        (evicted back to the budget after every forward: kvlab.hf.presses.DECODING); press_options: the press's own
        fields (window_size, n_sink, seed, inner, ...). Given a model, switches it to kvlab's attention function.
    """
    model = config_or_model if hasattr(config_or_model, "config") and hasattr(config_or_model, "forward") else None
    config = model.config if model is not None else config_or_model
    if not hasattr(config, "to_json_string"):
        raise ParameterError(f"make_cache takes a transformers model or config, got {type(config_or_model).__name__}")
    kinds = layer_kinds(config)  # each layer's class and kwargs (a ConfigError for a model kvlab cannot hold)
    mech = parse_mechanism(mechanism)
    if key_axis is None:  # the family's full-attention default: KIVI's per-channel keys on dense models
        key_axis = LAYERS[check_family(config), "full_attention"].key_axis
        if key_axis == "channel":  # keys wait for G tokens to group, but a window evicts token by token
            per_layer = dict(per_layer or {})
            for i, (cls, _) in enumerate(kinds):
                if cls.windowed(mech) and isinstance(per_layer.get(i, {}), dict):
                    per_layer[i] = {"key_axis": "token", "value_axis": "token", **per_layer.get(i, {})}
    follow = dtype is None
    if dtype is None:
        dtype = model.dtype if model is not None else (getattr(text_config(config), "dtype", None) or torch.bfloat16)
        dtype = getattr(torch, str(dtype).replace("torch.", "")) if not isinstance(dtype, torch.dtype) else dtype
    plan = None
    if press is not None:  # the press composed with this cache's format (a Composed brings its own)
        composed = compose(press, keep, keep_bytes, press_mode, press_options, kv_format, residual)
        kv_format, residual = composed.kv_format, composed.residual
        plan = composed.plan()
        plan.rotary = _rotary(model)
    elif keep is not None or keep_bytes is not None:
        raise ParameterError("keep / keep_bytes are a press's budget: give press=... too")
    options = dict(kv_format=kv_format, k_format=k_format, v_format=v_format, residual=residual, block=block,
                   key_axis=key_axis, value_axis=value_axis, per_layer=per_layer)
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
