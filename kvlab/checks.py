"""Argument checks shared by every module: one place for "an integer >= k", "a finite number in [lo, hi]",
"one of these choices" and ceiling division.

Each check takes the name of the argument and the exception class to raise (a `KvlabError` subclass, so
the CLI turns it into one line and exit code 2), and its message names the argument, the value and what is
allowed. Integral numpy / torch scalars count as integers; floats (even 2.0) and bools never do; NaN is never a
number here.
"""
from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable

from .errors import KvlabError, ParameterError, WrongTypeError


def cdiv(a: int, b: int) -> int:
    """Ceiling of a / b for integers (b > 0): pages for a tokens, entries for a compressed run, ..."""
    return -(-a // b)


def need_int(name: str, value, minimum: int | None = 0, maximum: int | None = None,
             error: type[KvlabError] = ParameterError) -> int:
    """`value` as an int in [minimum, maximum] (None: unbounded). Floats are refused, integral ones too: a count
    given as 2.0 or 1e6 comes from arithmetic that should have stayed integral (or a typo), and accepting it would
    let a float flow on where Python code expects an int."""
    if isinstance(value, (bool, float)):  # numpy float64 is a float; other float scalars fail operator.index
        raise _type_error(error)(f"{name} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise _type_error(error)(f"{name} must be an integer, got {_short(value)}") from None
    if minimum is not None and value < minimum:
        raise error(f"{name} must be an integer >= {minimum:,}, got {value:,}")
    if maximum is not None and value > maximum:
        raise error(f"{name} must be an integer <= {maximum:,}, got {value:,}")
    return value


def need_number(name: str, value, lo: float = -math.inf, hi: float = math.inf, *, finite: bool = True,
                lo_open: bool = False, error: type[KvlabError] = ParameterError) -> float:
    """`value` as a float in [lo, hi] (or (lo, hi] with lo_open); NaN is refused, and so is +-inf when `finite`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _type_error(error)(f"{name} must be a number, got {_short(value)}")
    v = float(value)
    if math.isnan(v) or (finite and math.isinf(v)):
        raise error(f"{name} must be a finite number, got {value!r}")
    if v < lo or v > hi or (lo_open and v == lo):
        left = "(" if lo_open else "["
        raise error(f"{name} must lie in {left}{lo:g}, {hi:g}], got {value!r}")
    return v


def _type_error(error: type[KvlabError]) -> type[KvlabError]:
    """A wrong type is a WrongTypeError (a TypeError too) unless the caller chose a more specific class."""
    return WrongTypeError if error is ParameterError else error


def need_choice(name: str, value, choices: Iterable, error: type[KvlabError] = ParameterError):
    """`value` if it is one of `choices`, else an error listing them."""
    choices = list(choices)
    if value not in choices:
        raise error(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")
    return value


def need_list(name: str, value, what: str = "a list") -> list:
    """`value` as a list: any iterable but a string (a single name where a list belongs would be read letter by
    letter) or a mapping."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
        raise WrongTypeError(f"{name} must be {what} (e.g. [...]), got {type(value).__name__} {_short(value)}")
    return list(value)


def need_type(name: str, value, types: type | tuple[type, ...], what: str):
    """`value` if it is an instance of `types` (never a bool unless bool is listed), else a WrongTypeError
    saying `what` belongs there."""
    listed = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in listed):
        raise WrongTypeError(f"{name} must be {what}, got {type(value).__name__} {_short(value)}")
    return value


def _short(value, width: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= width else r[: width - 3] + "..."
