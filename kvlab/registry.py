"""The registry of model families: families register here, and models, layouts and serving look them up by name.

It lives below everything that uses it, so a lookup never imports upward: each module of kvlab.families registers
its `Family` subclass with `@register` when it is imported, and importing kvlab (its __init__.py imports
kvlab.families) imports them all before any lookup. `detect(config)` asks the registered families in order (most
specific markers first; dense attention last) and the first that claims the config parses it.
"""
from __future__ import annotations

from .errors import ConfigError, UnknownModelError

REGISTRY: dict = {}  # family name -> Family instance (kvlab.families.base.Family)


def register(cls):
    """Class decorator: add a Family subclass to the registry (one instance per family)."""
    inst = cls()
    if not inst.name or inst.name in REGISTRY:
        raise ValueError(f"family {inst.name!r} is unnamed or registered twice")
    REGISTRY[inst.name] = inst
    return cls


def get_family(name: str):
    """The registered family called `name`."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownModelError(f"unknown model family {name!r}; known: {', '.join(REGISTRY)}") from None


def detect(cfg: dict, name: str):
    """The family that claims a (text) config, asked in detection order."""
    for fam in sorted(REGISTRY.values(), key=lambda f: f.order):
        if fam.detect(cfg):
            return fam
    raise ConfigError(
        f"{name}: unknown architecture (model_type {cfg.get('model_type')!r}): found none of "
        "num_attention_heads (MHA/GQA/MQA), kv_lora_rank (MLA) or compress_ratios (DeepSeek V4), nor the "
        "layer pattern of a hybrid family kvlab knows")


def families() -> dict[str, str]:
    """Registered family names and their one-line descriptions, in detection order."""
    return {f.name: f.description for f in sorted(REGISTRY.values(), key=lambda f: f.order)}
