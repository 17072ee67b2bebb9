"""Which transformers configs kvlab's cache holds, and how it lays each decoder layer out.

A config's family says what its attention hands the cache ("dense": K and V; "mla": the latent and the RoPE key);
its `layer_types` (read as transformers reads them, `get_layer_types_and_kwargs`) pick each layer's class from
`kvlab.hf.cache.layers.LAYERS`, as transformers' DynamicCache picks its layers from DYNAMIC_LAYER_TYPE_MAPPING.
"""
from __future__ import annotations

import json
from dataclasses import replace

import torch
from transformers.cache_utils import get_layer_types_and_kwargs

from ...errors import ConfigError
from ...models import ModelSpec, spec_from_config
from .layers import LAYERS, KvlabLayer

# transformers model types whose attention hands the cache plain K/V (dense) or the MLA latent + RoPE key; each is
# checked on a tiny random model (tests/test_architectures.py: held bytes equal the config's prediction in a format,
# under a press and a window; BF16 logits equal DynamicCache's).
DENSE_TYPES = ("llama", "mistral", "ministral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gemma3", "gpt_oss",
               "cohere2", "gemma", "phi3", "phi", "qwen3_moe", "mixtral", "olmo", "olmo2", "granite", "starcoder2",
               "smollm3", "glm4", "exaone4")
MLA_TYPES = ("deepseek_v2", "deepseek_v3")
SUPPORTED = DENSE_TYPES + MLA_TYPES
LAYER_TYPES = tuple(dict.fromkeys(t for _, t in LAYERS))  # transformers layer types a kvlab layer can stand for


def text_config(config):
    """The decoder's config of a (possibly multimodal) transformers config."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def check_family(config) -> str:
    """'dense' or 'mla' for a supported transformers config; a ConfigError naming the type otherwise."""
    text = text_config(config)
    mt = getattr(text, "model_type", None)
    if mt not in SUPPORTED:
        raise ConfigError(f"kvlab.hf caches support model types {', '.join(SUPPORTED)}; this model is {mt!r} "
                          f"({type(text).__name__})")
    return "mla" if mt in MLA_TYPES else "dense"


def layer_kinds(config) -> list[tuple[type[KvlabLayer], dict]]:
    """Each decoder layer's class (from its layer type and the config's family, `LAYERS`) and transformers'
    kwargs for it (`sliding_window`, ...); a ConfigError naming the layer types kvlab cannot hold."""
    text = text_config(config)
    family = check_family(text)
    types, kwargs = get_layer_types_and_kwargs(text)
    bad = sorted(set(types) - {t for f, t in LAYERS if f == family})
    if bad:
        held = " and ".join(t.removesuffix("_attention") for f, t in LAYERS if f == family)
        raise ConfigError(f"kvlab.hf caches hold {held} attention layers; this "
                          f"{text.model_type} config has layer types {', '.join(bad)}")
    return [(LAYERS[family, t], kw) for t, kw in zip(types, kwargs)]


def hf_spec(config, dtype: torch.dtype, window: int | None = None) -> ModelSpec:
    """kvlab's spec of a transformers config as its cache holds it: each layer's window as transformers reads
    it (the layout keeps `window - 1` tokens of it between steps, kvlab.layout.window_held, as
    DynamicSlidingWindowLayer does), the cache dtype is the states' dtype; `window` (a mechanism's) gives
    every full-attention layer that window too."""
    text = text_config(config)
    kinds = layer_kinds(text)
    cfg = json.loads(text.to_json_string())
    spec = spec_from_config(cfg, cfg.get("_name_or_path") or text.model_type, source="transformers config")
    windows = tuple(cls.window_of(kw, window) for cls, kw in kinds)
    return replace(spec, layer_windows=windows if any(w is not None for w in windows) else (),
                   torch_dtype=str(dtype).replace("torch.", ""))
