"""The `kvlab` command. Bad arguments print one line naming the problem and exit 2."""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys

from .errors import KvlabError

# Modules that add their own subcommands: each defines register(subparsers).
EXTRA_COMMANDS: list[str] = ["kvlab.measure_cmd", "kvlab.cli_serving"]


class ArgError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (raised, printed by main)
        raise ArgError(message)


def count_arg(name: str):
    """An argparse type for a non-negative integer option (1_000_000 and 1,000,000 accepted)."""
    def parse(s: str) -> int:
        try:
            v = int(s.replace("_", "").replace(",", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a non-negative integer, got {s!r}") from None
        if v < 0:
            raise argparse.ArgumentTypeError(f"{name} must be a non-negative integer, got {s!r}")
        return v
    return parse


_tokens = count_arg("--tokens")


def _num(x):
    from fractions import Fraction
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)


def cmd_models(args):
    from .models import catalog
    from .layout import build_layout
    rows = []
    for m in catalog():
        bpt = build_layout(m).bytes_per_token
        rows.append({"model": m.name, "family": m.family, "layers": m.num_layers, "bytes_per_token": _num(bpt),
                     "source": m.source})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    w = max(len(r["model"]) for r in rows)
    print(f"{'model':<{w}}  {'family':<8} {'layers':>6}  {'B/token (storage)':>18}")
    for r in rows:
        print(f"{r['model']:<{w}}  {r['family']:<8} {r['layers']:>6}  {r['bytes_per_token']:>18,}")
    return 0


def cmd_bytes(args):
    from .engines import allocate
    from .explain import fmt_bytes
    a = allocate(args.model, args.layout, args.kv_format)
    L = a.layout
    s = a.session(args.tokens)
    out = {
        "model": L.model.name,
        "family": L.model.family,
        "layout": L.scheme,
        "kv_format": L.kv_format,
        "engine": a.engine.name,
        "bytes_per_token": _num(a.bytes_per_token),
        "exact_bytes_per_token": _num(L.bytes_per_token),
        "bounded_bytes": L.bounded_bytes,
        "tokens": args.tokens,
        "growing_bytes": s.growing,
        "session_bounded_bytes": s.bounded,
        "session_bytes": s.total,
    }
    if args.explain:
        out["explanation"] = a.explain()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    if args.explain:
        print("\n".join(out["explanation"]))
    print(f"{out['model']}: {fmt_bytes(a.bytes_per_token)} B per token ({L.scheme}"
          + (f", {L.kv_format}" if L.kv_format else "") + f", {a.engine.name})")
    print(f"bounded state: {L.bounded_bytes:,} B; session of {args.tokens:,} tokens: {s.growing:,} B growing "
          f"+ {s.bounded:,} B bounded = {s.total:,} B")
    return 0


def _param_value(s: str):
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError):
        return s


def cmd_run(args):
    from .runner import run_notebooks, summary_table
    params = {k: _param_value(v) for k, v in (args.param or [])}
    run_dir, runs = run_notebooks(args.notebooks, params, args.out, log=lambda m: print(m, file=sys.stderr))
    print(summary_table(runs))
    print(f"results: {run_dir / 'results.json'}")
    failed = [r.name for r in runs if r.status != "ok"]
    if failed:
        print(f"failed: {', '.join(failed)} (outputs kept in {run_dir})", file=sys.stderr)
        return 1
    return 0


def cmd_claims(args):
    from dataclasses import asdict
    from .claims import audit
    checks = audit()
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
        return 0
    for c in checks:
        computed = "-" if c.computed is None else f"{c.computed:,.4g}" if isinstance(c.computed, float) else f"{c.computed:,}"
        print(f"{c.status:<23} {computed:>14}  {c.claim}")
    return 0


def build_parser() -> Parser:
    p = Parser(prog="kvlab", description="KV-cache memory: exact bytes, quantizers, measurement, capacity.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    m = sub.add_parser("models", help="list the model catalog")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_models)
    b = sub.add_parser("bytes", help="KV bytes per token and per session for a model")
    b.add_argument("model", help="catalog name (kvlab models) or path to a config.json")
    b.add_argument("--kv-format", default=None, help="one uniform number format for every cached component")
    b.add_argument("--layout", default="storage", choices=["storage", "vllm", "bf16"])
    b.add_argument("--tokens", type=_tokens, default=1_000_000, help="session length (default 1,000,000)")
    b.add_argument("--explain", action="store_true", help="show the derivation step by step")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bytes)
    c = sub.add_parser("claims", help="audit the source articles' numeric claims")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_claims)
    r = sub.add_parser("run", help="execute notebooks through papermill into runs/<timestamp>/")
    r.add_argument("notebooks", nargs="*", help="notebook names or prefixes (default: all)")
    r.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="set a parameter in every notebook that declares it")
    r.add_argument("--out", default="runs", help="folder for run outputs (default runs/)")
    r.set_defaults(func=cmd_run)
    for mod in EXTRA_COMMANDS:
        importlib.import_module(mod).register(sub)
    return p


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except ArgError as e:
        print(f"kvlab: error: {e}", file=sys.stderr)
        return 2
    except KvlabError as e:
        print(f"kvlab: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
