"""Token-eviction presses for kvlab.hf's cache, one module each, registered here (kvpress's scorer + pruner).

`make_plan("snapkv", keep=0.25)` gives the `PressPlan` `make_cache(model, press=..., keep=...)` builds;
`PRESSES` maps names to classes; "adakv:knorm" / "chunkkv:knorm" name a wrapper's inner scorer.
"""
from __future__ import annotations

from dataclasses import fields

from ...errors import ParameterError
from .adakv import AdaKV
from .base import Budget, Press, PressInput, PressPlan, layer_bytes
from .chunkkv import ChunkKV
from .cur import CUR
from .expected import ExpectedAttention
from .h2o import H2O
from .keydiff import KeyDiff
from .knorm import KNorm
from .lagkv import LagKV
from .pyramidkv import PyramidKV
from .random import Random
from .run import PressRun, check_attention
from .snapkv import SnapKV
from .streaming import StreamingLLM
from .tova import TOVA

PRESSES: dict[str, type[Press]] = {p.name: p for p in (
    StreamingLLM, KNorm, SnapKV, TOVA, H2O, ExpectedAttention, Random, PyramidKV, AdaKV, KeyDiff, LagKV, ChunkKV, CUR)}
ALIASES = {"streamingllm": "streaming_llm", "observed_attention": "h2o", "expected": "expected_attention",
           "expectedattention": "expected_attention", "observedattention": "h2o", "curdkv": "cur"}
WRAPPERS = ("adakv", "chunkkv")  # presses over an inner scorer
DECODING = tuple(n for n, p in PRESSES.items() if p.decodes)  # defined as decode-time eviction too


def _name(text: str) -> str:
    s = text.strip().lower().replace("-", "_")
    s = ALIASES.get(s, ALIASES.get(s.replace("_", ""), s))
    if s not in PRESSES:
        raise ParameterError(f"unknown press {text!r}; choose one of {', '.join(PRESSES)}")
    return s


def get_press(spec, **options) -> Press:
    """A press from a name ('snapkv'; 'adakv:knorm' wraps an inner scorer) and its fields as options."""
    if isinstance(spec, Press):
        if options:
            raise ParameterError("give press options with a press name, not with a Press instance")
        return spec
    if not isinstance(spec, str):
        raise ParameterError(f"press must be a name such as 'snapkv', got {spec!r}")
    outer, _, inner = spec.partition(":")
    name = _name(outer)
    cls = PRESSES[name]
    if inner and name not in WRAPPERS:
        raise ParameterError(f"press {spec!r}: only {', '.join(WRAPPERS)} take an inner scorer (name:inner)")
    known = {f.name for f in fields(cls)}
    bad = sorted(set(options) - known)
    if bad:
        raise ParameterError(f"press {name} has no option(s) {', '.join(bad)}; its options: "
                             f"{', '.join(sorted(known)) or 'none'}")
    if name in WRAPPERS:
        inner = options.pop("inner", None) or inner or "snapkv"
        inner = get_press(inner) if not isinstance(inner, Press) else inner
        if inner.name in WRAPPERS:
            raise ParameterError(f"press {spec!r}: the inner scorer must be a plain press, not {inner.name}")
        options["inner"] = inner
    return cls(**options)


def make_plan(press, keep=None, keep_bytes=None, mode: str = "prefill", options: dict | None = None) -> PressPlan:
    """A press with its budget and mode (validated before any model runs)."""
    if options is not None and not isinstance(options, dict):
        raise ParameterError(f"press_options must be a dict of the press's fields, got {options!r}")
    p = get_press(press, **dict(options or {}))
    if mode == "decode" and not p.decodes:
        raise ParameterError(f"press {p.name} compresses the context at prefill; decode-time eviction is defined for "
                             f"{', '.join(DECODING)}")
    return PressPlan(p, Budget(keep, keep_bytes), mode)


__all__ = ["DECODING", "PRESSES", "Budget", "Press", "PressInput", "PressPlan", "PressRun", "check_attention",
           "get_press",
           "layer_bytes", "make_plan"]
