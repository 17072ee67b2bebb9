"""`kvlab sweep`: one notebook over a grid of parameters on a dask cluster, into runs/<stamp>/ with one table."""
from __future__ import annotations

import sys

from .args import count


def cmd_sweep(args):
    from ..nb.sweep import TABLE, SweepInterrupted, run_sweep

    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        sweep = run_sweep(args.notebook, args.grid, args.out, args.workers, args.scheduler, args.resume,
                          progress=not args.no_progress, log=log)
    except SweepInterrupted as e:
        s = e.sweep
        done = sum(1 for v in s.status.values() if v == "ok")
        print(f"kvlab: sweep interrupted with {done} of {len(s.points)} points done; continue it with "
              f"--resume {s.folder}", file=sys.stderr)
        return 130
    df = sweep.table.drop(columns=["error", "folder"])
    wide = [c for c in df.columns if df[c].map(lambda v: isinstance(v, str) and len(v) > 40).any()]
    print(df.drop(columns=wide).to_string(index=False))
    if wide:
        print(f"(in the table files only: {', '.join(wide)})")
    print(f"table: {sweep.folder / (TABLE + '.csv')} and {TABLE}.parquet")
    if sweep.failed:
        print(f"failed: {len(sweep.failed)} of {len(sweep.points)} points (outputs kept in their folders):",
              file=sys.stderr)
        for p in sweep.failed:
            print(f"  {sweep.folder / p.folder}", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    s = sub.add_parser("sweep", help="run one notebook over a grid of parameters on a dask cluster")
    s.add_argument("notebook", help="notebook name, prefix (01) or path")
    s.add_argument("--grid", help="YAML or JSON file: parameter -> list of values (the sweep runs their product)")
    s.add_argument("--workers", type=count("--workers"), default=None,
                   help="worker processes of the local cluster (default: CPU cores, at most 4)")
    s.add_argument("--scheduler", metavar="ADDRESS", help="a running dask scheduler (tcp://host:8786) instead")
    s.add_argument("--out", default="runs", help="folder for sweep folders (default runs/)")
    s.add_argument("--resume", metavar="DIR", help="continue the sweep in DIR: points already done are skipped")
    s.add_argument("--no-progress", action="store_true", help="no progress bar (one line per point)")
    s.set_defaults(func=cmd_sweep)
