"""`kvlab sweep`: one notebook over a grid of parameters on a dask cluster, into runs/<stamp>/ with one table."""
from __future__ import annotations

import sys

from .args import ArgError, count


def cmd_sweep(args):
    from ..nb.sweep import TABLE, SweepInterrupted, run_sweep

    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if args.resume is not None and args.out is not None:
        raise ArgError("--out and --resume: a resumed sweep continues in its own folder; give one of them")
    if args.workers is not None and args.scheduler is not None:
        raise ArgError("--workers sizes a local cluster; --scheduler brings its own workers: give one of them")
    try:
        sweep = run_sweep(args.notebook, args.grid, "runs" if args.out is None else args.out, args.workers,
                          args.scheduler, args.resume, progress=not args.no_progress, log=log)
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
    from ..nb.sweep import MAX_WORKERS
    s = sub.add_parser("sweep", help="run one notebook over a grid of parameters on a dask cluster")
    s.add_argument("notebook", help="notebook name, prefix (01) or path")
    s.add_argument("--grid", help="YAML or JSON file: parameter -> list of values (the sweep runs their product)")
    s.add_argument("--workers", type=count("--workers", 1, MAX_WORKERS), default=None,
                   help="worker processes of the local cluster (default: CPU cores, at most 4)")
    s.add_argument("--scheduler", metavar="ADDRESS", help="a running dask scheduler (tcp://host:8786) instead")
    s.add_argument("--out", default=None, help="folder for sweep folders (default runs/)")
    s.add_argument("--resume", metavar="DIR", help="continue the sweep in DIR: points already done are skipped")
    s.add_argument("--no-progress", action="store_true", help="no progress bar (one line per point)")
    s.set_defaults(func=cmd_sweep)
