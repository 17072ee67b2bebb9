"""Token-eviction presses for kvlab.hf's cache, one module each, registered here (kvpress's scorer + pruner).

`PRESSES` maps names to classes, the one list of presses (the CLI's choices, notebook grids, the kvpress oracle's
cases and the benchmarks read it); "adakv:knorm" / "chunkkv:knorm" name a wrapper's inner scorer. A press composes
with a format through one type, `Composed` (kvlab.hf.presses.composed): `compose("snapkv", keep=0.25,
kv_format="nvfp4")`, or `Composed.parse("snapkv keep 1/4 nvfp4")`; `make_cache(model, press=..., keep=...,
kv_format=...)` builds one from its keywords, and `make_plan` gives its `PressPlan`.
"""
from __future__ import annotations

from dataclasses import fields

from ...errors import ParameterError
from .adakv import AdaKV
from .base import Budget, Press, PressInput, PressPlan, layer_bytes
from .chunkkv import ChunkKV
from .composed import SEQUENCE, Composed, refuse_sequence
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
    if SEQUENCE in spec:
        refuse_sequence(spec.split(SEQUENCE))
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


def compose(press, keep=None, keep_bytes=None, mode: str = "prefill", options: dict | None = None,
            kv_format: str | None = None, residual: int = 0) -> Composed:
    """A press (a name, a Press, or a Composed as it is) with its budget and mode, composed with the format of the
    cache it prunes (validated before any model runs)."""
    if isinstance(press, Composed):
        extra = [k for k, v in dict(keep=keep, keep_bytes=keep_bytes, options=options, kv_format=kv_format).items()
                 if v is not None] + (["residual"] if residual else []) + (["mode"] if mode != "prefill" else [])
        if extra:
            raise ParameterError(f"press {press.label()!r} is composed with its own budget, format and mode; give "
                                 f"it without {', '.join(extra)}")
        return press
    if options is not None and not isinstance(options, dict):
        raise ParameterError(f"press_options must be a dict of the press's fields, got {options!r}")
    p = get_press(press, **dict(options or {}))
    if mode == "decode" and not p.decodes:
        raise ParameterError(f"press {p.name} compresses the context at prefill; decode-time eviction is defined for "
                             f"{', '.join(DECODING)}")
    return Composed(p, Budget(keep, keep_bytes), kv_format, residual, mode)


def make_plan(press, keep=None, keep_bytes=None, mode: str = "prefill", options: dict | None = None) -> PressPlan:
    """A press with its budget and mode, for one cache (validated before any model runs); `press` may be a
    `Composed`, which carries its own budget and mode."""
    return compose(press, keep, keep_bytes, mode, options).plan()


__all__ = ["DECODING", "PRESSES", "WRAPPERS", "Budget", "Composed", "Press", "PressInput", "PressPlan", "PressRun",
           "check_attention", "compose", "get_press", "layer_bytes", "make_plan"]
