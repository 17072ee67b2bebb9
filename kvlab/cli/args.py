"""Argument types shared by every command: each bad value becomes one line naming the option (exit 2)."""
from __future__ import annotations

import argparse
import math


class ArgError(Exception):
    """A command-line argument that does not parse (printed as one line, exit 2)."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (raised, printed by main)
        raise ArgError(message)


def count(name: str):
    """A non-negative integer option (1_000_000 and 1,000,000 accepted)."""
    def parse(s: str) -> int:
        try:
            v = int(s.replace("_", "").replace(",", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a non-negative integer, got {s!r}") from None
        if v < 0:
            raise argparse.ArgumentTypeError(f"{name} must be a non-negative integer, got {s!r}")
        return v
    return parse


def number(name: str, lo: float = 0.0, hi: float = math.inf):
    """A finite-or-bounded real option in [lo, hi]; NaN is refused."""
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {s!r}") from None
        if math.isnan(v) or not (lo <= v <= hi):
            raise argparse.ArgumentTypeError(f"{name} must lie in [{lo}, {hi}], got {s!r}")
        return v
    return parse


def add_scheme(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """--scheme (kvlab.layout.SCHEMES: which format each cached component takes); --layout is its older name."""
    from ..layout import SCHEMES
    parser.add_argument("--scheme", "--layout", dest="scheme", default="storage", choices=SCHEMES,
                        help=help or "layout scheme: the model's storage formats, what vLLM allocates, or all BF16")
