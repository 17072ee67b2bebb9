"""Notebook parameters as dataclasses: the base class every notebook's parameters derive from.

A notebook's first code cell (tagged `parameters`) declares typed, commented defaults for papermill; the cell
after it builds that notebook's parameters dataclass from them in one line,

    params = SessionsParams.of(globals())  # checks every parameter: a bad one stops here, named

and `__post_init__` checks each field with the checks below (built on kvlab.checks: need_int, need_number,
need_choice), so a bad parameter fails in the notebook's first cells with one ParameterError that names the
parameter, its value and what is allowed. Checks validate and never convert: later cells keep reading the
parameters by their own names, exactly as declared (an integer parameter given 1e6 is refused, not turned
into a float that flows on). Values derived from the parameters (resolved formats, a seed list) are fields
with init=False, set in `__post_init__`. The dataclass lives beside the notebook's helpers (the module its
later cells call); its fields carry the parameters' names, in order, without defaults (the parameters cell
holds them, for papermill --help-notebook). Checks are named need_* like kvlab.checks', so they do not
collide with parameter names.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

from .. import checks
from ..errors import KvlabError, ParameterError


def _name(field: str) -> str:
    return f"parameter {field}"


@dataclass
class NotebookParams:
    """Base of each notebook's parameters: `of(namespace)` builds it, subclasses check in `__post_init__`."""

    @classmethod
    def of(cls, namespace: Mapping):
        """The parameters named by this dataclass's fields, taken from a notebook's namespace (`globals()`)."""
        names = [f.name for f in fields(cls) if f.init]
        missing = [n for n in names if n not in namespace]
        if missing:
            raise ParameterError(f"the parameters cell defines no {', '.join(missing)}")
        return cls(**{n: namespace[n] for n in names})

    # Checks for subclasses: each returns the value (normalized) or raises ParameterError naming the field.
    def need_int(self, field: str, minimum: int | None = 1, maximum: int | None = None, value=None) -> int:
        """An int in [minimum, maximum] (None: unbounded); floats, even integral ones, are refused."""
        v = getattr(self, field) if value is None else value
        return checks.need_int(_name(field), v, minimum, maximum)

    def need_number(self, field: str, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
               finite: bool = True, value=None) -> float:
        """A number in [lo, hi] ((lo, hi] with lo_open); NaN always refused, +-inf unless finite=False."""
        v = getattr(self, field) if value is None else value
        return checks.need_number(_name(field), v, lo, hi, lo_open=lo_open, finite=finite)

    def need_choice(self, field: str, choices: Iterable, value=None):
        return checks.need_choice(_name(field), getattr(self, field) if value is None else value, choices)

    def need_flag(self, field: str) -> bool:
        v = getattr(self, field)
        if not isinstance(v, bool):
            raise ParameterError(f"{_name(field)} must be True or False, got {v!r}")
        return v

    def need_text(self, field: str, value=None) -> str:
        v = getattr(self, field) if value is None else value
        if not isinstance(v, str):
            raise ParameterError(f"{_name(field)} must be a string, got {v!r}")
        return v

    def need_lookup(self, field: str, lookup, value=None):
        """lookup(value) (get_format, load_model, get_gpu, ...), its kvlab error re-raised naming the parameter."""
        v = getattr(self, field) if value is None else value
        try:
            return lookup(v)
        except KvlabError as e:
            raise ParameterError(f"{_name(field)}: {e}") from None

    def need_list(self, field: str, empty: bool = False) -> list:
        """A list, non-empty unless `empty` (a string or a scalar is refused, not iterated)."""
        v = getattr(self, field)
        if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Iterable):
            raise ParameterError(f"{_name(field)} must be a list, got {v!r}")
        v = list(v)
        if not v and not empty:
            raise ParameterError(f"{_name(field)} must not be empty")
        return v

    def need_ints(self, field: str, minimum: int | None = 1, maximum: int | None = None) -> list[int]:
        return [self.need_int(field, minimum, maximum, value=x) for x in self.need_list(field)]

    def need_numbers(self, field: str, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
                finite: bool = True) -> list[float]:
        return [self.need_number(field, lo, hi, lo_open=lo_open, finite=finite, value=x) for x in self.need_list(field)]

    def need_names(self, field: str, choices: Iterable | None = None, empty: bool = False) -> list[str]:
        """A list of strings (non-empty unless `empty`), each one of `choices` when given."""
        v = self.need_list(field, empty)
        for x in v:
            if not isinstance(x, str):
                raise ParameterError(f"{_name(field)} must be a list of names, got {x!r} in {v!r}")
        if choices is not None:
            choices = list(choices)
            for x in v:
                checks.need_choice(_name(field), x, choices)
        return v
