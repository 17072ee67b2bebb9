"""`kvlab run`: execute notebooks through papermill into runs/<timestamp>/ and collect their results."""
from __future__ import annotations

import ast
import sys

from .args import parse_count


def _param_value(s: str):
    """A parameter's value: a count as people write it (1,000,000), else a Python literal, else the text."""
    if "," in s and parse_count(s) is not None:  # 1,000,000 is a count, not the tuple (1, 0, 0)
        return parse_count(s)
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):  # not a Python literal: the text
        return s


def cmd_run(args):
    from ..nb.runner import RunInterrupted, run_notebooks, summary_table
    params = {k: _param_value(v) for k, v in (args.param or [])}
    try:
        run_dir, runs = run_notebooks(args.notebooks, params, args.out, log=lambda m: print(m, file=sys.stderr),
                                      progress=True)
    except RunInterrupted as e:
        print(f"kvlab: interrupted ({e.signal_name}): {e.run_dir} holds a partial run, marked interrupted",
              file=sys.stderr)
        return 130
    print(summary_table(runs))
    print(f"results: {run_dir / 'results.json'}")
    failed = [r.name for r in runs if r.status != "ok"]
    if failed:
        print(f"failed: {', '.join(failed)} (outputs kept in {run_dir})", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    r = sub.add_parser("run", help="execute notebooks through papermill into runs/<timestamp>/")
    r.add_argument("notebooks", nargs="*", help="notebook names or prefixes (default: all)")
    r.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="set a parameter in every notebook that declares it")
    r.add_argument("--out", default="runs", help="folder for run outputs (default runs/)")
    r.set_defaults(func=cmd_run)
