"""Model families: each family's knowledge in one module, behind one registry.

A family module defines one `Family` subclass (kvlab.families.base) and registers it with `@register`:
how to recognise its configs, check their fields, lay out each layer's cache under each scheme, split it
over GPUs, page it in each engine, replay it after a miss, and explain the arithmetic. `detect(config)`
asks the registered families in order (most specific markers first; dense attention last) and the first
that claims the config parses it.

  dense        MHA / GQA / MQA, sliding windows            (dense.py)
  mla, mla_dsa DeepSeek V2 / V3 latent; V3.2 adds DSA keys (mla.py)
  dsv4, dsv41  DeepSeek V4 CSA / HCA / SWA; V4.1 CSA2      (deepseek_v4.py)
  hybrids      attention + linear attention / SSM layers   (qwen3_next.py, mamba.py, lfm2.py, kimi_linear.py,
                                                            minimax.py; shared state math in hybrid.py)
"""
from __future__ import annotations

from ..errors import ConfigError, UnknownModelError

REGISTRY: dict = {}  # family name -> Family instance


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


from . import dense, mla, deepseek_v4, qwen3_next, mamba, lfm2, kimi_linear, minimax  # noqa: E402,F401  (register)

MODULES = (dense, mla, deepseek_v4, qwen3_next, mamba, lfm2, kimi_linear, minimax)  # importing them registers them

FAMILIES = families()
