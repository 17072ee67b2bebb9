"""Sweeps: one notebook over a grid of parameters, every point a papermill run on a dask.distributed cluster.

A grid (YAML or JSON) maps parameters the notebook declares to lists of values; the sweep runs their product. Each
point runs through `kvlab.nb.runner` (the same code as `kvlab run`) into its own folder under runs/<stamp>/, named
from its parameters, so a resumed sweep (`resume=` that folder) finds the points whose notebook the runner recorded
as finished "ok" and skips them. A failing point stays failed in its folder and is listed; the others go on. At the
end one table holds every point: its parameters as columns, its status and its recorded results (results.csv and
results.parquet in the sweep folder).

The cluster is a LocalCluster of worker processes on 127.0.0.1 by default, or any running dask scheduler given by
address; workers there need kvlab installed and the same file system (the notebook and runs/ paths).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..checks import need_int, need_out_dir, need_path, short as _short
from ..errors import ParameterError

SWEEP_FILE = "sweep.json"  # the sweep folder's record: notebook, grid, points, status, failures
TABLE = "results"  # results.csv and results.parquet
MAX_POINTS = 10_000  # points one grid may hold (its product is counted before any point is made)
MAX_WORKERS = 256  # worker processes of a local cluster
MAX_GRID_BYTES = 1 << 20  # a grid file's size
MAX_VALUE_NODES = 100_000  # items in one parameter's values, nested ones counted


@dataclass(frozen=True)
class Point:
    """One point of a grid."""

    params: dict  # parameter name -> value, in the grid's order
    folder: str  # its folder's name in the sweep folder (stable: derived from the parameters alone)


@dataclass
class Sweep:
    """What a sweep did."""

    folder: Path  # runs/<stamp>/
    notebook: str  # the notebook's stem
    points: list[Point]  # every point of the grid, in grid order
    status: dict[str, str] = field(default_factory=dict)  # folder -> "ok" | "failed" | "not run"
    ran: int = 0  # points run this time
    skipped: int = 0  # points found done and skipped
    interrupted: bool = False  # stopped before every point ran
    table: object = None  # the combined table (pandas DataFrame), as written to results.csv / .parquet
    workers: int = 0  # workers of the cluster it ran on (0: nothing to run)

    @property
    def failed(self) -> list[Point]:
        return [p for p in self.points if self.status.get(p.folder) == "failed"]


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a sweep; the points that finished are kept and `resume` continues it."""

    def __init__(self, sweep: Sweep):
        super().__init__(f"sweep interrupted; resume it with its folder {sweep.folder}")
        self.sweep = sweep  # the partial sweep (its table holds the points done so far)


# --- grids ---------------------------------------------------------------------------------------------------------

def read_grid(path: str | Path) -> dict[str, list]:
    """A grid file (.yaml, .yml or .json, at most MAX_GRID_BYTES): parameter -> list of values (a single value counts
    as a list of one)."""
    p = need_path("grid", path)
    if p.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise ParameterError(f"grid {_short(str(p), 240)}: expected a .yaml, .yml or .json file")
    try:
        if p.is_file() and p.stat().st_size > MAX_GRID_BYTES:
            raise ParameterError(f"grid {str(p)!r}: {p.stat().st_size:,} B; a grid file holds at most "
                                 f"{MAX_GRID_BYTES:,} B")
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ParameterError(f"grid {str(p)!r}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    try:
        if p.suffix.lower() == ".json":
            raw = json.loads(text)
        else:
            import yaml
            raw = yaml.safe_load(text)
    except Exception as e:  # json.JSONDecodeError, yaml.YAMLError
        raise ParameterError(f"grid {str(p)!r}: not valid {p.suffix[1:].upper()} "
                             f"({str(e).splitlines()[0][:160]})") from None
    return check_grid(raw, str(p))


def check_grid(raw, where: str = "grid") -> dict[str, list]:
    """A grid as a mapping of parameter names to non-empty lists of values, whose product is at most MAX_POINTS."""
    if not isinstance(raw, dict) or not raw:
        raise ParameterError(f"{where}: expected a mapping of parameter names to lists of values")
    grid = {}
    n = 1
    for k, v in raw.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ParameterError(f"{where}: {_short(k)} is not a parameter name")
        values = list(v) if isinstance(v, (list, tuple)) else [v]
        if not values:
            raise ParameterError(f"{where}: parameter {k!r} has an empty list of values")
        if _nodes(values, MAX_VALUE_NODES) > MAX_VALUE_NODES:  # YAML aliases can nest a small file into billions
            raise ParameterError(f"{where}: parameter {k!r}: its values hold more than {MAX_VALUE_NODES:,} items "
                                 "in all (nested lists and mappings, aliases counted each time they appear)")
        grid[k] = values
        n *= len(values)
        if n > MAX_POINTS:
            raise ParameterError(f"{where}: the grid's product holds more than {MAX_POINTS:,} points "
                                 f"({' x '.join(str(len(x)) for x in grid.values())} so far); split the sweep")
    return grid


def _nodes(v, budget: int) -> int:
    """Items in a nested value (lists, tuples, mappings), counted until `budget` is passed."""
    n, stack = 0, [v]
    while stack and n <= budget:
        x = stack.pop()
        n += 1
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple, set)):
            stack.extend(x)
    return n


def point_folder(params: dict) -> str:
    """A readable, file-system-safe folder name for a point, unique by a hash of its parameters."""
    key = json.dumps(params, sort_keys=True, default=str)
    slug = ",".join(f"{k}={json.dumps(v, default=str).strip(chr(34))}" for k, v in params.items())
    slug = re.sub(r"[^A-Za-z0-9._=,+-]+", "_", slug)[:80] or "default"
    return f"{slug}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def grid_points(grid: dict[str, list]) -> list[Point]:
    names = list(grid)
    out = []
    for values in itertools.product(*(grid[n] for n in names)):
        params = dict(zip(names, values))
        out.append(Point(params, point_folder(params)))
    return out


def read_record(folder: Path, notebook: str) -> dict:
    """A sweep folder's sweep.json, checked field by field: each error names the file and the field."""
    f = Path(folder) / SWEEP_FILE
    if not Path(folder).is_dir():
        raise ParameterError(f"resume folder {str(folder)!r} is not a folder")
    if not f.is_file():
        raise ParameterError(f"{folder} is not a sweep folder (no {SWEEP_FILE} in it)")
    try:
        record = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ParameterError(f"{f}: not a readable sweep record ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(record, dict):
        raise ParameterError(f"{f}: not a sweep record (a JSON object), got a JSON {type(record).__name__}")

    def field(name: str, check, what: str):
        if name not in record:
            raise ParameterError(f"{f}: field {name!r} is missing")
        if not check(record[name]):
            raise ParameterError(f"{f}: field {name!r} must be {what}, got {_short(record[name])}")
        return record[name]

    nb = field("notebook", lambda v: isinstance(v, str) and v != "", "a notebook name")
    if nb != notebook:
        raise ParameterError(f"{f}: field 'notebook' is {nb!r}: a sweep of another notebook than {notebook!r}")
    check_grid(field("grid", lambda v: isinstance(v, dict) and v, "a mapping of parameters to values"),
               f"{f}: field 'grid'")
    field("points", lambda v: isinstance(v, list) and all(
        isinstance(x, dict) and isinstance(x.get("folder"), str) and isinstance(x.get("params"), dict) for x in v),
        "a list of {folder, params}")
    bad = [x["folder"] for x in record["points"] if Path(x["folder"]).name != x["folder"] or x["folder"] in ("", "..")]
    if bad:
        raise ParameterError(f"{f}: field 'points' names a folder outside the sweep: {_short(bad[0])}")
    return record


# --- one point (runs on a worker) ----------------------------------------------------------------------------------

def point_outcome(point_dir: str | Path, notebook: str) -> dict | None:
    """The runner's record of a point's latest finished run: {"status", "error", "results"}; None if it has none."""
    try:
        summary = json.loads((Path(point_dir) / "latest" / "results.json").read_text())
        nb = summary["notebooks"][notebook]
        return {"status": nb["status"], "error": nb.get("error", ""), "results": nb.get("results", {})}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_point(notebook: str, params: dict, point_dir: str) -> dict:
    """Execute one point through the runner into point_dir (a worker's task); never raises."""
    from .runner import run_notebooks

    t0 = time.perf_counter()
    try:
        _, runs = run_notebooks([notebook], params, point_dir, log=lambda _m: None)
        status, error = runs[0].status, runs[0].error
    except Exception as e:  # a point's failure stays that point's
        status, error = "failed", f"{type(e).__name__}: {e}".splitlines()[0][:300]
    return {"status": status, "error": error, "seconds": time.perf_counter() - t0}


# --- the sweep -----------------------------------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def check_scheduler(address) -> str:
    """A dask scheduler address (tcp://host:port or tls://host:port; host:port means tcp), checked before anything
    runs: the host named, the port in 1-65535."""
    from distributed.comm.addressing import parse_address, parse_host_port

    if not isinstance(address, str) or not address.strip() or len(address) > 1000 or not address.isprintable():
        raise ParameterError(f"scheduler must be an address like tcp://host:8786, got {_short(address)}")
    try:
        scheme, loc = parse_address(address.strip())
        if scheme not in ("tcp", "tls"):
            raise ValueError(f"kvlab reaches a scheduler over tcp:// or tls://, not {scheme}://")
        host, port = parse_host_port(loc)
        if not host or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError("the host must be named and the port lie in 1-65535")
    except (ValueError, TypeError) as e:
        raise ParameterError(f"scheduler {_short(address)} is not a dask address like tcp://host:8786 "
                             f"({str(e).splitlines()[0][:120]})") from None
    return address.strip()


def _client(workers: int, scheduler: str | None):
    """(client, cluster): a client of the scheduler at `scheduler`, or of a new LocalCluster (then also returned)."""
    from dask.distributed import Client, LocalCluster

    if scheduler:
        try:
            return Client(scheduler, timeout="10s"), None
        except (OSError, TimeoutError, ValueError, TypeError) as e:
            raise ParameterError(f"cannot reach the dask scheduler at {scheduler!r}: "
                                 f"{str(e).splitlines()[0][:200]}") from None
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None, silence_logs=logging.ERROR)
    return Client(cluster), cluster


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def run_sweep(notebook: str, grid: dict | str | Path | None = None, out_root: str | Path = "runs",
              workers: int | None = None, scheduler: str | None = None, resume: str | Path | None = None,
              progress: bool = True, log=print) -> Sweep:
    """Run every point of `grid` (a mapping, or a grid file) not yet done; returns the sweep, table written.

    `resume`: an earlier sweep folder of the same notebook; its finished points are skipped (without `grid`, its
    own grid is used; with one, the new grid's points are run or reused by their parameters).

    Everything is checked before anything is written: the notebook, the grid (at most MAX_POINTS points), the
    workers, the scheduler's address, the output folder (a folder kvlab can write in) or the resumed sweep's record
    (each field named when it is wrong); the cluster is reached or started next, and only then is the sweep folder
    made."""
    from .runner import check_out_root, check_parameters, declared_parameters, new_run_dir, resolve

    path = resolve([notebook])[0]
    stem = path.stem
    if workers is not None and scheduler is not None:
        raise ParameterError("workers sets the size of a local cluster; a scheduler brings its own workers: give "
                             "one of them")
    workers = need_int("workers", default_workers() if workers is None else workers, 1, MAX_WORKERS)
    if scheduler is not None:
        scheduler = check_scheduler(scheduler)
    where = "grid"  # where the grid comes from, for its errors
    if resume is not None:
        folder = need_out_dir("resume folder", resume)
        before = read_record(folder, stem)
        if grid is None:
            grid, where = before["grid"], f"{folder / SWEEP_FILE}: field 'grid':"
    elif grid is None:
        raise ParameterError("a sweep needs a grid (a .yaml or .json file of parameter -> values)")
    else:
        out_root = check_out_root(out_root)
    grid = read_grid(grid) if isinstance(grid, (str, Path)) else check_grid(grid)
    declared = declared_parameters(path)
    unknown = [k for k in grid if k not in declared]
    if unknown:
        raise ParameterError(f"{where} parameter {unknown[0]!r} is not declared by {stem} "
                             f"(its parameters: {', '.join(declared) or 'none'})")
    points = grid_points(grid)
    for p in points:  # every point's values through the notebook's own checks, before any cluster or folder
        try:
            check_parameters(path, p.params)
        except ParameterError as e:
            raise ParameterError(f"{where} point {_describe(p.params)[:200]}: {e}") from None
    done = {}
    if resume is not None:
        done = {p.folder: point_outcome(folder / p.folder, stem) for p in points}
    todo = [p for p in points if (done.get(p.folder) or {}).get("status") != "ok"]
    client = cluster = None
    if todo:
        client, cluster = _client(workers, scheduler)  # no cluster to run on: nothing has been written yet
    try:
        if resume is None:
            folder = new_run_dir(Path(out_root))
        sweep = Sweep(folder, stem, points)
        record = {"notebook": stem, "notebook_path": str(path), "grid": grid, "status": "running",
                  "started": _now(), "points": [{"folder": p.folder, "params": p.params} for p in points]}
        _write_json(folder / SWEEP_FILE, record)
        running = {p.folder for p in todo}
        for p in points:
            if p.folder not in running:
                sweep.status[p.folder] = "ok"
                sweep.skipped += 1
        log(f"sweep {stem}: {len(points)} points in {folder} ({sweep.skipped} done before, {len(todo)} to run)")
        seconds = {}
        if todo:
            try:
                _run_points(sweep, todo, str(path), client, progress, seconds, log)
            except KeyboardInterrupt:
                sweep.interrupted = True
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    for p in points:
        sweep.status.setdefault(p.folder, "not run")
    sweep.table = table(folder, points, stem)
    write_table(folder, sweep.table)
    record.update(status="interrupted" if sweep.interrupted else ("failed" if sweep.failed else "ok"),
                  finished=_now(), workers=sweep.workers, ran=sweep.ran, skipped=sweep.skipped,
                  failed=[p.folder for p in sweep.failed],
                  seconds={k: round(v, 2) for k, v in seconds.items()})  # volatile: kept out of the table
    _write_json(folder / SWEEP_FILE, record)
    if sweep.interrupted:
        raise SweepInterrupted(sweep)
    return sweep


def _run_points(sweep: Sweep, todo: list[Point], notebook: str, client, progress: bool, seconds: dict,
                log) -> None:
    from dask.distributed import as_completed
    from tqdm.auto import tqdm

    sweep.workers = len(client.scheduler_info().get("workers", {}))
    futures = {}
    try:
        for p in todo:
            f = client.submit(run_point, notebook, p.params, str(sweep.folder / p.folder), pure=False)
            futures[f] = p
        bar = tqdm(total=len(todo), desc="sweep", unit="point", file=sys.stderr, disable=not progress,
                   dynamic_ncols=True)
        with bar:
            for f in as_completed(futures):
                p = futures[f]
                try:
                    out = f.result()
                except Exception as e:  # the worker itself died (a crash, memory): that point fails, others go on
                    out = {"status": "failed", "error": f"{type(e).__name__}: {e}".splitlines()[0][:300],
                           "seconds": 0.0}
                sweep.status[p.folder] = out["status"]
                seconds[p.folder] = out["seconds"]
                sweep.ran += 1
                line = f"{out['status']:<6} {out['seconds']:6.1f}s  {_describe(p.params)}" + \
                    (f"  ({out['error']})" if out["error"] else "")
                if progress:
                    bar.write(line, file=sys.stderr)
                else:
                    log(line)
                bar.update(1)
    except KeyboardInterrupt:
        for f in futures:
            f.cancel()
        raise


def _describe(params: dict) -> str:
    return " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in params.items())


# --- the table -----------------------------------------------------------------------------------------------------

def _cell(v):
    """A table cell: scalars as they are, anything else as JSON text."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return json.dumps(v, default=str)


def table(folder: str | Path, points: list[Point], notebook: str):
    """One row per point: its parameters, status, error, every recorded result and its folder (pandas)."""
    import pandas as pd

    rows = []
    for p in points:
        out = point_outcome(Path(folder) / p.folder, notebook) or {"status": "not run", "error": "", "results": {}}
        row = {k: _cell(v) for k, v in p.params.items()}
        row.update(status=out["status"], error=out["error"])
        for k, v in out["results"].items():
            row[k if k not in p.params and k not in ("status", "error", "folder") else f"{k}_recorded"] = _cell(v)
        row["folder"] = p.folder
        rows.append(row)
    df = pd.DataFrame(rows, dtype=object)
    front = [c for c in df.columns if c != "folder"] + ["folder"]
    return df[front]


def _typed(df):
    """Column types for Parquet: integers stay integers, mixed numbers become floats, everything else text."""
    import pandas as pd

    out = pd.DataFrame(index=df.index)
    for c in df.columns:
        vals = [v for v in df[c] if v is not None and not (isinstance(v, float) and v != v)]
        if vals and all(isinstance(v, bool) for v in vals):
            out[c] = df[c].astype("boolean")
        elif vals and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            out[c] = df[c].astype("Int64")
        elif vals and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            out[c] = df[c].astype("Float64")
        else:
            out[c] = df[c].map(lambda v: None if v is None else str(v)).astype("string")
    return out


def write_table(folder: str | Path, df) -> tuple[Path, Path]:
    """results.csv (values exactly as recorded) and results.parquet (typed columns)."""
    folder = Path(folder)
    csv, parquet = folder / f"{TABLE}.csv", folder / f"{TABLE}.parquet"
    df.to_csv(csv, index=False)
    _typed(df).to_parquet(parquet, index=False)
    return csv, parquet
