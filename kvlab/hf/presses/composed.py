"""Composition: a press with the K/V format its kept tokens are held in, one type for every place that composes.

kvpress composes presses with its ComposedPress (NVIDIA/kvpress 0.5.5, presses/composed_press.py: presses applied
one after the other in the same forward hook). kvlab composes a press with a format: `Composed` is a press, its
budget and mode, and the format (with a KIVI residual) of the cache it prunes. `make_cache(model, press=Composed)`
and `make_plan(Composed)` take it; `Composed.parse('snapkv keep 1/4 nvfp4')` reads a setting as notebooks and sweeps
write it.

Two presses in sequence are refused: kvlab's cache resolves one budget into per-layer kept counts and predicts the
bytes held from them (`PressPlan.resolve`, `PressPlan.held`), and a layer's kept count is one press's choice; a
second press would prune an already pruned layer under a budget nothing here resolves or predicts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from ...checks import need_choice
from ...errors import KvlabError, ParameterError
from .base import MODES, Budget, Press, PressPlan
from .registry import DECODING, SEQUENCE, get_press, refuse_sequence


@dataclass(frozen=True)
class Composed:
    """A press, its budget and mode, composed with the format of the cache it prunes."""

    press: Press  # the scorer and pruner (kvlab.hf.presses.get_press)
    budget: Budget  # how much of the context it keeps (a fraction, tokens or bytes)
    kv_format: str | None = None  # the format K and V are held in (None: the model's dtype, as DynamicCache)
    residual: int = 0  # newest tokens held unquantized (KIVI's R; integer formats)
    mode: str = "prefill"  # "prefill" (compress the context once) or "decode" (evict back every forward)
    name: str = ""  # how it was written ('snapkv keep 1/4 nvfp4'): its label ("" : built from the fields)

    def __post_init__(self):
        if isinstance(self.press, (tuple, list)):
            if len(self.press) != 1:
                refuse_sequence([getattr(p, "name", p) for p in self.press])
            object.__setattr__(self, "press", self.press[0])
        if not isinstance(self.press, Press):
            raise ParameterError(f"Composed takes a Press (kvlab.hf.presses.get_press), got {self.press!r}")
        if not isinstance(self.budget, Budget):
            raise ParameterError(f"Composed takes a Budget, got {self.budget!r}")
        need_choice("press mode", self.mode, MODES)

    @classmethod
    def parse(cls, text: str, kv_format: str = "bf16") -> "Composed":
        """A setting written 'snapkv keep 1/4', 'snapkv 1/4' or 'snapkv=1/4', with a format as a third word
        ('snapkv keep 1/4 nvfp4'; default `kv_format`): the budget a fraction of the context (1/4, 0.25) or a
        token count. 'snapkv+knorm keep 1/4' (two presses in sequence) is refused."""
        from ...formats import get_format
        parts = re.split(r"\s*=\s*|\s+keep\s+|\s+", text.strip()) if isinstance(text, str) else []
        if len(parts) not in (2, 3):
            raise ParameterError(f"press setting {text!r}: write it as 'name keep budget [format]', e.g. "
                                 "'snapkv keep 1/4' or 'snapkv keep 1/4 nvfp4'")
        name, budget, fmt = (*parts, kv_format) if len(parts) == 2 else parts
        if SEQUENCE in name:
            refuse_sequence(name.split(SEQUENCE))
        try:
            keep = Fraction(budget)
        except (ValueError, ZeroDivisionError):
            raise ParameterError(f"press setting {text!r}: the budget {budget!r} is not a number or fraction") from None
        try:
            get_format(fmt)
        except KvlabError as e:
            raise ParameterError(f"press setting {text!r}: {e}") from None
        keep = float(keep) if keep < 1 else int(keep)
        label = f"{name} keep {budget}" + ("" if fmt == "bf16" else f" {fmt}")
        return cls(get_press(name), Budget(keep), fmt, name=label)

    def plan(self) -> PressPlan:
        """The press with its budget and mode, for one cache (checked now, before any model runs)."""
        return PressPlan(self.press, self.budget, self.mode)

    def cache_options(self) -> dict:
        """make_cache's keywords for this composition."""
        return dict(kv_format=self.kv_format, residual=self.residual, press=self.press,
                    keep=self.budget.keep, keep_bytes=self.budget.nbytes, press_mode=self.mode)

    def label(self) -> str:
        if self.name:
            return self.name
        fmt = "" if self.kv_format in (None, "bf16") else f" {self.kv_format}"
        return f"{self.plan().label()}{fmt}"


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
