"""Model families: each family's knowledge in one module, behind one registry.

A family module defines one `Family` subclass (kvlab.families.base) and registers it with `@register`: how to
recognise its configs, check their fields, lay out each layer's cache under each scheme, split it over GPUs, page
it in each engine, replay it after a miss, and explain the arithmetic. The registry itself (`register`,
`get_family`, `detect`) lives below, in kvlab.registry, so that models, layouts and engines look a family up
without importing this package; importing this package (kvlab/__init__.py does) registers every family.

  dense        MHA / GQA / MQA, sliding windows            (dense.py)
  mla, mla_dsa DeepSeek V2 / V3 latent; V3.2 adds DSA keys (mla.py)
  dsv4, dsv41  DeepSeek V4 CSA / HCA / SWA; V4.1 CSA2      (deepseek_v4.py)
  hybrids      attention + linear attention / SSM layers   (qwen3_next.py, mamba.py, lfm2.py, kimi_linear.py,
                                                            minimax.py; shared state math in hybrid.py)
"""
from __future__ import annotations

from ..registry import REGISTRY, detect, families, get_family, register  # noqa: F401
from . import dense, mla, deepseek_v4, qwen3_next, mamba, lfm2, kimi_linear, minimax  # noqa: F401  (register)

MODULES = (dense, mla, deepseek_v4, qwen3_next, mamba, lfm2, kimi_linear, minimax)  # importing them registers them

FAMILIES = families()
