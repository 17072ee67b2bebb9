"""Checks for notebook parameters: one clear ParameterError naming the bad parameter."""
from __future__ import annotations

from collections.abc import Iterable

from ..errors import ParameterError


def positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ParameterError(f"parameter {name} must be an integer >= {minimum}, got {value!r}")
    return value


def number(name: str, value, lo: float | None = None, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParameterError(f"parameter {name} must be a number, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ParameterError(f"parameter {name} must lie in [{lo}, {hi}], got {value!r}")
    return value


def one_of(name: str, value, options: Iterable) -> object:
    options = list(options)
    if value not in options:
        raise ParameterError(f"parameter {name} must be one of {', '.join(map(str, options))}; got {value!r}")
    return value


def int_list(name: str, value, minimum: int = 1) -> list[int]:
    if isinstance(value, (int, str)) or not isinstance(value, Iterable):
        raise ParameterError(f"parameter {name} must be a list of integers, got {value!r}")
    value = list(value)
    if not value:
        raise ParameterError(f"parameter {name} must not be empty")
    for v in value:
        positive_int(name, v, minimum)
    return value


def str_list(name: str, value) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ParameterError(f"parameter {name} must be a list of names, got {value!r}")
    value = list(value)
    if not value or not all(isinstance(v, str) for v in value):
        raise ParameterError(f"parameter {name} must be a non-empty list of names, got {value!r}")
    return value
