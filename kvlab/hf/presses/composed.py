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

SEQUENCE = "+"  # joins presses meant to act in sequence ('snapkv+knorm'), refused with one line


def refuse_sequence(names) -> None:
    """One clear line for two or more presses in sequence."""
    raise ParameterError(f"presses {' + '.join(map(str, names))} in sequence: kvlab composes one press with a format "
                         "(a cache's budget is resolved into one press's per-layer kept counts, PressPlan.resolve); "
                         "give one press")


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
        from . import get_press
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
