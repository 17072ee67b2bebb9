"""The one registry of presses: `PRESSES` (name -> class, each press one module over kvlab.hf.presses.base's
scorer and pruner), their aliases, and `get_press`, which builds one from its name ('adakv:knorm' wraps an inner
scorer). The CLI's help, the notebooks' grids, the kvpress oracle's cases and the benchmarks read `PRESSES`.
"""
from __future__ import annotations

from dataclasses import fields

from ...errors import ParameterError
from .adakv import AdaKV
from .base import Press
from .chunkkv import ChunkKV
from .cur import CUR
from .expected import ExpectedAttention
from .h2o import H2O
from .keydiff import KeyDiff
from .knorm import KNorm
from .lagkv import LagKV
from .pyramidkv import PyramidKV
from .random import Random
from .snapkv import SnapKV
from .streaming import StreamingLLM
from .tova import TOVA


PRESSES: dict[str, type[Press]] = {p.name: p for p in (
    StreamingLLM, KNorm, SnapKV, TOVA, H2O, ExpectedAttention, Random, PyramidKV, AdaKV, KeyDiff, LagKV, ChunkKV, CUR)}
ALIASES = {"streamingllm": "streaming_llm", "observed_attention": "h2o", "expected": "expected_attention",
           "expectedattention": "expected_attention", "observedattention": "h2o", "curdkv": "cur"}
WRAPPERS = ("adakv", "chunkkv")  # presses over an inner scorer
DECODING = tuple(n for n, p in PRESSES.items() if p.decodes)  # defined as decode-time eviction too
SEQUENCE = "+"  # joins presses meant to act in sequence ('snapkv+knorm'), refused with one line


def refuse_sequence(names) -> None:
    """One clear line for two or more presses in sequence (kvlab.hf.presses.composed says why)."""
    raise ParameterError(f"presses {' + '.join(map(str, names))} in sequence: kvlab composes one press with a format "
                         "(a cache's budget is resolved into one press's per-layer kept counts, PressPlan.resolve); "
                         "give one press")


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
