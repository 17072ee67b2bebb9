"""Token-eviction presses for kvlab.hf's cache, one module each, registered once in registry.py (kvpress's scorer +
pruner).

`PRESSES` maps names to classes, the one list of presses (the CLI's choices, notebook grids, the kvpress oracle's
cases and the benchmarks read it); "adakv:knorm" / "chunkkv:knorm" name a wrapper's inner scorer. A press composes
with a format through one type, `Composed` (kvlab.hf.presses.composed): `compose("snapkv", keep=0.25,
kv_format="nvfp4")`, or `Composed.parse("snapkv keep 1/4 nvfp4")`; `make_cache(model, press=..., keep=...,
kv_format=...)` builds one from its keywords, and `make_plan` gives its `PressPlan`.
"""
from __future__ import annotations

from .base import Budget, Press, PressInput, PressPlan, layer_bytes
from .composed import Composed, compose, make_plan
from .registry import ALIASES, DECODING, PRESSES, SEQUENCE, WRAPPERS, get_press
from .run import PressRun, check_attention

__all__ = ["ALIASES", "DECODING", "PRESSES", "SEQUENCE", "WRAPPERS", "Budget", "Composed", "Press", "PressInput",
           "PressPlan", "PressRun", "check_attention", "compose", "get_press", "layer_bytes", "make_plan"]
