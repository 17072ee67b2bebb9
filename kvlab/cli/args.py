"""Argument types shared by every command: each bad value becomes one line naming the option (exit 2)."""
from __future__ import annotations

import argparse
import math
import re
from decimal import Decimal, InvalidOperation

COUNT_MAX = 2**63 - 1  # counts travel into numpy / torch int64 sizes and seeds
NUMBER_MAX = 1e12  # no option's unit (GB, seconds, tokens/s) comes near it; keeps GB -> bytes within int range

# Whole numbers as people write them: 1000000, 1,000,000, 1_000_000 (groups of three after the first), 1e6.
_PLAIN = re.compile(r"\d+")
_GROUPED = re.compile(r"\d{1,3}(?P<sep>[,_])\d{3}(?:(?P=sep)\d{3})*")
_SCIENTIFIC = re.compile(r"\d+(?:\.\d+)?[eE]\+?\d+")


class ArgError(Exception):
    """A command-line argument that does not parse (printed as one line, exit 2)."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (raised, printed by main)
        raise ArgError(message)


def parse_count(s: str) -> int | None:
    """The integer a count is written as, or None: '1,5', '1__0', ',1' and '1.5' are not counts."""
    s = s.strip()
    if _PLAIN.fullmatch(s):
        return int(s)
    if _GROUPED.fullmatch(s):
        return int(re.sub("[,_]", "", s))
    if _SCIENTIFIC.fullmatch(s) and len(s) <= 40:
        try:
            d = Decimal(s)
        except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
            return None
        if d == d.to_integral_value() and d.adjusted() < 40:
            return int(d)
    return None


def count(name: str, minimum: int = 0, maximum: int = COUNT_MAX):
    """An integer option in [minimum, maximum], written 1000000, 1,000,000, 1_000_000 or 1e6."""
    what = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum:,}"

    def parse(s: str) -> int:
        v = parse_count(s)
        if v is None:
            raise argparse.ArgumentTypeError(
                f"{name} must be {what} (1000000, 1,000,000 or 1_000_000), got {s!r}")
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {s!r}")
        if v > maximum:
            raise argparse.ArgumentTypeError(f"{name} must be at most {maximum:,}, got {s!r}")
        return v
    return parse


def number(name: str, lo: float = 0.0, hi: float = NUMBER_MAX, lo_open: bool = False):
    """A finite real option in [lo, hi] (or (lo, hi] with lo_open); NaN and infinities are refused."""
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {s!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number in [{lo:g}, {hi:g}], got {s!r}")
        if v < lo or v > hi or (lo_open and v == lo):
            left = "(" if lo_open else "["
            raise argparse.ArgumentTypeError(f"{name} must lie in {left}{lo:g}, {hi:g}], got {s!r}")
        return v
    return parse


def add_scheme(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """--scheme (kvlab.layout.SCHEMES: which format each cached component takes); --layout is its older name."""
    from ..layout import SCHEMES
    parser.add_argument("--scheme", "--layout", dest="scheme", default="storage", choices=SCHEMES,
                        help=help or "layout scheme: the model's storage formats, what vLLM allocates, or all BF16")
