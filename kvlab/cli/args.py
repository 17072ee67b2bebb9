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


_MEMORY = re.compile(r"(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([kmgt]i?b|b)?")
MEMORY_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
                "tib": 2**40}
MEMORY_MAX = 10**15  # 1e6 GB: kvlab.hardware's bound on any figure


def memory(name: str):
    """A memory size -> bytes (int): GB (1e9 B) when written bare (80, 141.5), else with a unit as devices and
    datasheets write it: 80GB, 139.8GiB, 143156MiB, 150109880320B."""
    def parse(s: str) -> int:
        m = _MEMORY.fullmatch(s.strip().lower())
        if not m:
            raise argparse.ArgumentTypeError(f"{name} must be a size: GB, or a number with a unit (80GB, 139.8GiB, "
                                             f"143156MiB, 150109880320B), got {s!r}")
        v = float(m[1]) * MEMORY_UNITS[m[2] or "gb"]
        if not (0 < v <= MEMORY_MAX) or round(v) < 1:
            raise argparse.ArgumentTypeError(f"{name} must lie in (0, {MEMORY_MAX / 1e9:,.0f} GB], got {s!r}")
        return round(v)
    return parse


def add_gpu(parser: argparse.ArgumentParser, required: bool = True, default: str | None = None,
            what: str = "GPU") -> None:
    """--gpu (a catalog name) and --gpu-memory (the memory to plan with instead of the catalog's figure)."""
    from ..hardware import gpu_names
    parser.add_argument("--gpu", required=required, default=default,
                        help=f"{what}: {', '.join(gpu_names())} (data/hardware.json)"
                             + (f"; default {default}" if default else ""))
    parser.add_argument("--gpu-memory", type=memory("--gpu-memory"), default=None, metavar="SIZE",
                        help="the GPU's memory to plan with, instead of the catalog's (the device's own report where "
                             "known, e.g. an H200's 150.1 GB, else the datasheet's): GB, or 80GB, 74.5GiB, 81559MiB")


def gpu_of(args):
    """The kvlab.hardware.Gpu that --gpu and --gpu-memory name."""
    from ..hardware import get_gpu
    return get_gpu(args.gpu) if args.gpu_memory is None else get_gpu(args.gpu, hbm_gb=args.gpu_memory / 1e9)


def add_scheme(parser: argparse.ArgumentParser, help: str | None = None, default: str | None = "storage") -> None:
    """--scheme (kvlab.layout.SCHEMES: which format each cached component takes); --layout is its older name.
    default None: the engine's own (vllm under --engine vllm, storage otherwise)."""
    from ..layout import SCHEMES
    parser.add_argument("--scheme", "--layout", dest="scheme", default=default, choices=SCHEMES,
                        help=help or "layout scheme: the model's storage formats, what vLLM allocates, or all BF16")


def add_formats(parser: argparse.ArgumentParser) -> None:
    """--kv-format (one format for every cached attention component), or --k-format / --v-format apart."""
    parser.add_argument("--kv-format", default=None, help="one uniform number format for every cached component")
    parser.add_argument("--k-format", default=None, help="number format of the keys (an MLA latent); with --v-format "
                                                         "instead of --kv-format")
    parser.add_argument("--v-format", default=None, help="number format of the values (an MLA RoPE key)")


def format_kwargs(args) -> dict:
    """kv_format / k_format / v_format as kvlab's API takes them."""
    return dict(kv_format=args.kv_format, k_format=args.k_format, v_format=args.v_format)


def add_parallel(parser: argparse.ArgumentParser, dp_attention: bool = False) -> None:
    """--tp / --dcp / --pp (and --dp-attention): the deployment whose per-GPU figures are wanted."""
    parser.add_argument("--tp", type=count("--tp", 1, 1 << 20), default=1, help="tensor-parallel size (default 1)")
    parser.add_argument("--dcp", type=count("--dcp", 1, 1 << 20), default=1,
                        help="decode-context-parallel size inside each TP group (default 1)")
    parser.add_argument("--pp", type=count("--pp", 1, 1 << 20), default=1, help="pipeline-parallel stages (default 1)")
    if dp_attention:
        parser.add_argument("--dp-attention", action="store_true",
                            help="data-parallel attention over the --tp ranks: each GPU keeps whole sessions")


def add_engine(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """--engine vllm | sglang | trtllm and its page size."""
    from ..engines import ENGINES
    parser.add_argument("--engine", default=None, choices=ENGINES,
                        help=help or "allocate as this engine does (default: the scheme's own: exact, or vLLM's "
                                     "paging for --scheme vllm)")
    parser.add_argument("--page-size", type=count("--page-size", 1, 1 << 20), default=None,
                        help="SGLang --page-size / TensorRT-LLM tokens_per_block (default: the engine's, 1 / 32)")
