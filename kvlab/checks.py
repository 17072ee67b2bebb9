"""Argument checks shared by every module: one place for "an integer >= k", "a finite number in [lo, hi]",
"one of these choices", "a folder kvlab may write into", "an existing file" and ceiling division.

Each check takes the name of the argument and the exception class to raise (a `KvlabError` subclass, so
the CLI turns it into one line and exit code 2), and its message names the argument, the value and what is
allowed. Integral numpy / torch scalars count as integers; floats (even 2.0) and bools never do; NaN is never a
number here.
"""
from __future__ import annotations

import errno
import math
import numbers
import operator
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

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


def short(value, width: int = 60) -> str:
    """repr(value), cut to `width` characters: a value quoted in an error message stays readable."""
    r = repr(value)
    return r if len(r) <= width else r[: width - 3] + "..."


_short = short


# --- paths: checked before any work starts, so bad input loses nothing and leaves nothing behind -------------------

def need_path(name: str, value, error: type[KvlabError] = ParameterError):
    """`value` as a pathlib.Path a file system can take: never empty, no NUL byte, no component too long."""
    if not isinstance(value, (str, os.PathLike)):
        raise _type_error(error)(f"{name} must be a path, got {type(value).__name__} {_short(value)}")
    text = os.fspath(value)
    if isinstance(text, bytes) or not text.strip():
        raise error(f"{name} must be a path, got {_short(text)}")
    if "\0" in text:
        raise error(f"{name} {_short(text)} holds a NUL byte: not a usable path")
    p = Path(text).expanduser()
    try:
        os.lstat(p)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise error(f"{name} {_short(text)}: not a usable path ({e.strerror})") from None
    return p


def need_out_dir(name: str, value, error: type[KvlabError] = ParameterError):
    """`value` as a folder kvlab may write into: an existing writable folder, or one that can be made (its nearest
    existing parent a folder that takes a new entry - tried by making and removing a probe). Nothing is left made."""
    p = need_path(name, value, error)
    q = p
    while not os.path.lexists(q) and q != q.parent:
        q = q.parent
    if os.path.lexists(q) and not q.is_dir():
        what = "is" if q == p else f"lies under {str(q)!r}, which is"
        raise error(f"{name} {str(p)!r} {what} {'a file, ' if q.is_file() else ''}not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".kvlab-probe-", dir=q))
    except OSError as e:
        raise error(f"{name} {str(p)!r}: cannot write in {str(q)!r} ({e.strerror or e})") from None
    return p


def need_in_file(name: str, value, error: type[KvlabError] = ParameterError):
    """`value` as an existing regular file (not a folder, a device or a pipe)."""
    p = need_path(name, value, error)
    if p.is_dir():
        raise error(f"{name} {str(p)!r} is a folder, not a file")
    if not p.exists():
        raise error(f"{name} {str(p)!r}: no such file")
    if not p.is_file():
        raise error(f"{name} {str(p)!r} is not a regular file")
    return p
