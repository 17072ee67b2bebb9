"""Dense attention (MHA / GQA / MQA), optionally with sliding-window layers: Qwen3, Llama, Gemma, gpt-oss.

Per attention layer and token: K and V, `num_key_value_heads` heads of `head_dim` each, in the checkpoint's
dtype; a sliding-window layer keeps its last `sliding_window - 1` tokens between steps (bounded;
kvlab.layout.window_held, as transformers and vLLM hold it). Windows come from `layer_types` (transformers),
the model type's default pattern (Gemma's `sliding_window_pattern`), Qwen's `max_window_layers` or a global
`sliding_window`, as transformers reads them.
"""
from __future__ import annotations

from ..errors import ConfigError, ParameterError
from ..explain import explain_layout, kv_one_liner
from ..layout import Component, Entry, LayerCache, Part, split_residual, window_held
from ..engines import VLLM_DENSE
from ..models import ModelSpec, cfg_int
from ..registry import register
from .base import (VLLM_DCP_DOC, VLLM_KV_HEADS, Family, Split, check_heads, dense_engine, dtype_of, head_dim_of,
                   kv_heads_of, shared_heads)

WINDOW_NOTE = ("sliding-window layers keep their last `sliding_window - 1` tokens between steps (the next query "
               "brings the W-th), as transformers and vLLM hold them: bounded, not per-token")
LAYER_TYPES = {"full_attention": None, "sliding_attention": "window"}  # transformers' layer_types laid out here
WINDOW_DCP = ("assumption: a sliding window is bounded state, kept whole on every DCP rank (as DeepSeek V4's windows "
              "are, lightseekorg/tokenspeed PR #1498)")


# transformers' layer types for a config that lists none (models/<type>/configuration_<type>.py __post_init__):
# every pattern-th layer global, the rest sliding (Gemma 2 / 3, Cohere2, gpt-oss); the Qwen types slide only when
# use_sliding_window is true (default false), by their own rule on max_window_layers (default 28); any other model
# with a sliding_window slides everywhere (Mistral, Ministral: cache_utils.py get_layer_types_and_kwargs).
DEFAULT_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4, "gpt_oss": 2}
QWEN_SLIDING = {  # model_type -> is layer i sliding, given max_window_layers m
    "qwen2": lambda i, m: i >= m, "qwen3": lambda i, m: i >= m,
    "qwen2_moe": lambda i, m: (i + 1) % 2 == 1 and i < m, "qwen3_moe": lambda i, m: True}


def windows(cfg: dict, n: int, name: str) -> tuple[int | None, ...]:
    """Per-layer sliding windows (the tokens a query sees, itself included) as transformers reads them: from
    `layer_types`, else the model type's default pattern (Gemma's `sliding_window_pattern`), the Qwen types'
    `use_sliding_window` and `max_window_layers`, or a global `sliding_window`."""
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) < n:
            raise ConfigError(f"{name}: 'layer_types' must list one type per layer ({n})")
        bad = [(i, t) for i, t in enumerate(types[:n]) if not isinstance(t, str) or t not in LAYER_TYPES]
        if bad:
            raise ConfigError(f"{name}: 'layer_types' gives layer {bad[0][0]} the type {bad[0][1]!r}; kvlab lays out "
                              f"{' and '.join(LAYER_TYPES)} (and the hybrid families' linear_attention, conv, mamba "
                              f"under their model_type)")
        w = cfg_int(cfg, "sliding_window", name, minimum=2) if "sliding_attention" in types[:n] else None
        return tuple(w if t == "sliding_attention" else None for t in types[:n])
    mt = cfg.get("model_type")
    gated = mt in QWEN_SLIDING
    if cfg.get("sliding_window") is None or not cfg.get("use_sliding_window", not gated):
        return (None,) * n
    w = cfg_int(cfg, "sliding_window", name, minimum=2)
    if gated:
        m = cfg_int(cfg, "max_window_layers", name, default=28, minimum=0)
        return tuple(w if QWEN_SLIDING[mt](i, m) else None for i in range(n))
    pattern = cfg_int(cfg, "sliding_window_pattern", name, default=DEFAULT_PATTERNS.get(mt), required=False)
    if pattern:  # every pattern-th layer is global
        return tuple(None if (i + 1) % pattern == 0 else w for i in range(n))
    return (w,) * n


def attention_layer(family: Family, spec, scheme, fmts, shard, index: int, window: int | None,
                    kv_heads: int, head_dim: int) -> LayerCache:
    """One GQA layer's K and V on one GPU: its share of the KV heads; growing ones interleaved over DCP ranks."""
    k = family.entry(spec, scheme, "kv", {"all": head_dim}, fmts.k_format)
    v = family.entry(spec, scheme, "kv", {"all": head_dim}, fmts.v_format)
    heads = shared_heads(kv_heads, shard.tp)
    inter = shard.dcp if window is None else 1
    held = window_held(window)
    comps = tuple(Component(r, e, copies=heads, window=held, interleave=inter) for r, e in (("k", k), ("v", v)))
    return LayerCache(index, "sliding" if window else "full", comps)


def check_dcp(spec, kv_heads: int, shard, what: str = "KV heads") -> None:
    """vLLM bounds DCP by the duplication it removes: dcp <= tp / kv_heads (docs/serving/
    context_parallel_deployment.md); with as many KV heads as ranks nothing is duplicated."""
    most = max(1, shard.tp // kv_heads)
    if shard.dcp > most:
        raise ParameterError(f"{spec.name}: DCP {shard.dcp} exceeds TP / {what} = {shard.tp} / {kv_heads} = {most}: "
                             f"decode context parallelism only splits KV that TP duplicates (vLLM "
                             f"docs/serving/context_parallel_deployment.md: dcp in [1, tp_size / H])")


@register
class Dense(Family):
    name = "dense"
    description = "MHA / GQA / MQA, optionally with sliding-window layers"
    order = 900  # the fallback: any config with attention heads
    recipes = {"storage": {"kv": (("all", None),)}, "vllm": {"kv": (("all", None),)}}
    splits = {"k": Split("heads", True, f"{VLLM_KV_HEADS}; {VLLM_DCP_DOC}"),
              "v": Split("heads", True, f"{VLLM_KV_HEADS}; {VLLM_DCP_DOC}"),
              "window": Split("heads", False, f"{VLLM_KV_HEADS}; {WINDOW_DCP}")}
    vllm = VLLM_DENSE
    sources = "the model's config.json; vllm/v1/kv_cache_interface.py AttentionSpec"

    def detect(self, cfg: dict) -> bool:
        return cfg.get("num_attention_heads") is not None

    def parse(self, c: dict, name: str, common: dict):
        heads = cfg_int(c, "num_attention_heads", name)
        head_dim = head_dim_of(c, name, heads, common["hidden_size"])
        kv_heads = kv_heads_of(c, name, heads)
        return ModelSpec(family=self.name, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                         layer_windows=windows(c, common["num_layers"], name), **common)

    def check_shard(self, spec, shard) -> None:
        super().check_shard(spec, shard)
        check_heads(spec.name, "KV heads", spec.num_kv_heads, shard.tp)
        check_dcp(spec, spec.num_kv_heads, shard)

    def build(self, spec, scheme, fmts, shard):
        self.check_shard(spec, shard)
        layers = [attention_layer(self, spec, scheme, fmts, shard, i, w, spec.num_kv_heads, spec.head_dim)
                  for i, w in enumerate(spec.layer_windows or (None,) * spec.num_layers)]
        notes = []
        if any(spec.layer_windows):
            notes.append(WINDOW_NOTE)
        return layers, notes

    def build_planned(self, spec, scheme, plans):
        """K and V per layer under its KVPlan: its formats, KIVI groups per channel, a residual."""
        d = spec.head_dim
        layers = []
        for i, w in enumerate(spec.layer_windows or (None,) * spec.num_layers):
            p = plans[i]
            comps = []
            for role, fmt in (("k", p.k_format), ("v", p.v_format)):
                e = self.entry(spec, scheme, role if fmt else "kv", {"all": d}, fmt)
                group = 1
                if p.key_groups if role == "k" else p.value_groups:
                    if w is not None:
                        raise ParameterError(
                            f"{spec.name} layer {i}: per-channel groups of {role.upper()} (KIVI keys) need a growing "
                            f"cache; a sliding-window layer ({w} tokens) evicts tokens one at a time (use "
                            f"{'key' if role == 'k' else 'value'}_axis='token' for it)")
                    group = fmt.block
                    e = Entry((Part(role, group * d, fmt),))  # G tokens x D channels, channel-major
                comps += split_residual(spec, role, e, d, spec.num_kv_heads, window_held(w), p, dtype_of(spec), group)
            layers.append(LayerCache(i, "sliding" if w else "full", tuple(comps)))
        notes = []
        if any(spec.layer_windows):
            notes.append(WINDOW_NOTE)
        if any(p.key_groups or p.value_groups for p in plans):
            notes.append("integer keys (values) grouped per channel (KIVI): one entry holds G tokens x head_dim, the "
                         "G tokens of a channel sharing one scale and zero point; an incomplete group waits "
                         "unquantized")
        if any(p.residual or p.block > 1 for p in plans):
            notes.append("a residual holds the most recent tokens unquantized in the model dtype; older tokens are "
                         "quantized a block at a time")
        return layers, notes

    def engine(self, layout, name, page_size=None, prefix_caching=True):
        return dense_engine(self, layout, name, page_size)

    def attention_params(self, spec):
        """q, k, v and o projections: layers x hidden x (2 x heads + 2 x KV heads) x head_dim."""
        if spec.hidden_size is None:
            return None
        return spec.num_layers * spec.hidden_size * (2 * spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim

    def explain(self, layout) -> list[str]:
        return kv_one_liner(layout) or explain_layout(layout)
