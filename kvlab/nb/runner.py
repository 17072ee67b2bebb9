"""Batch runs: execute notebooks through papermill into runs/<timestamp>/, collect recorded results.

A failing notebook does not stop the batch: its partly executed output is kept for
inspection, the others still run, the summary names it, and the run exits non-zero.
Each run gets a new folder, so no earlier run's results are ever overwritten; runs/latest
points at the newest.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..errors import ParameterError
from ..resources import package_dir
from .record import read_results

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = package_dir("notebooks")  # notebooks/ at the repository top, package data in a wheel


@dataclass
class NotebookRun:
    """The outcome of one notebook in a batch."""

    name: str  # notebook stem
    status: str  # "ok" or "failed"
    output: str  # path of the executed notebook
    results: dict = field(default_factory=dict)  # recorded results by name
    error: str = ""  # the error, when it failed
    seconds: float = 0.0  # wall time (volatile: kept out of the results)


def list_notebooks() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))


def resolve(names: list[str] | None) -> list[Path]:
    """Notebook paths from names ('01', '01_kv_bytes_per_token', a path); all when none given."""
    if not names:
        return list_notebooks()
    out = []
    for n in names:
        p = Path(n)
        if p.suffix == ".ipynb" and p.is_file():
            out.append(p.resolve())
            continue
        hits = [q for q in list_notebooks() if q.stem == n or q.stem.startswith(n.removesuffix(".ipynb"))]
        if len(hits) != 1:
            known = ", ".join(q.stem for q in list_notebooks())
            raise ParameterError(f"no single notebook matches {n!r}; known: {known}")
        out.append(hits[0])
    return out


def declared_parameters(path: Path) -> dict:
    import papermill as pm
    return pm.inspect_notebook(str(path))


def kernel_name() -> str:
    """The kernel to run notebooks with: $KVLAB_KERNEL, the registered `kvlab` kernel, or python3."""
    if os.environ.get("KVLAB_KERNEL"):
        return os.environ["KVLAB_KERNEL"]
    try:
        from jupyter_client.kernelspec import KernelSpecManager
        specs = KernelSpecManager().find_kernel_specs()
        if "kvlab" in specs:
            return "kvlab"
    except Exception:  # pragma: no cover - no jupyter_client
        pass
    return "python3"


def new_run_dir(root: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    d, k = root / stamp, 1
    while d.exists():
        k += 1
        d = root / f"{stamp}-{k}"
    d.mkdir(parents=True)
    return d


def _point_latest(root: Path, run_dir: Path) -> None:
    latest = root / "latest"
    tmp = root / f".latest-{os.getpid()}"
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(run_dir.name, target_is_directory=True)
        os.replace(tmp, latest)
    except OSError:  # no symlinks here: leave a pointer file
        if latest.is_symlink() or latest.is_file():
            latest.unlink()
        latest.mkdir(exist_ok=True)
        (latest / "RUN").write_text(run_dir.name + "\n")


def run_notebooks(names: list[str] | None = None, parameters: dict | None = None, out_root: str | Path = "runs",
                  kernel: str | None = None, log=print) -> tuple[Path, list[NotebookRun]]:
    """Execute notebooks into a new run folder; returns (folder, outcomes). Never raises for a failing notebook."""
    import papermill as pm

    parameters = dict(parameters or {})
    paths = resolve(names)
    declared = {p: declared_parameters(p) for p in paths}
    unknown = [k for k in parameters if not any(k in d for d in declared.values())]
    if unknown:
        raise ParameterError(f"parameter {unknown[0]!r} is not declared by any selected notebook "
                             f"({', '.join(p.stem for p in paths)})")
    root = Path(out_root)
    run_dir = new_run_dir(root)
    kernel = kernel or kernel_name()
    runs = []
    for p in paths:
        params = {k: v for k, v in parameters.items() if k in declared[p]}
        out = run_dir / p.name
        log(f"running {p.stem} {params or ''}".rstrip())
        t0 = time.perf_counter()
        status, error = "ok", ""
        try:
            pm.execute_notebook(str(p), str(out), parameters=params, kernel_name=kernel, cwd=str(p.parent),
                                progress_bar=False, log_output=False)
        except Exception as e:  # papermill raises PapermillExecutionError with the cell's error
            status = "failed"
            error = (getattr(e, "ename", "") + ": " + str(getattr(e, "evalue", "")) if hasattr(e, "ename")
                     else f"{type(e).__name__}: {e}").strip().splitlines()[0][:300]
        results = read_results(out) if out.exists() else {}
        runs.append(NotebookRun(p.stem, status, str(out), results, error, time.perf_counter() - t0))
        log(f"  {status}" + (f": {error}" if error else ""))
    summary = {
        "run": run_dir.name,
        "kernel": kernel,
        "parameters": parameters,
        "notebooks": {r.name: {"status": r.status, "output": Path(r.output).name, "error": r.error,
                               "results": r.results} for r in runs},
        "failed": [r.name for r in runs if r.status != "ok"],
    }
    (run_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    (run_dir / "timings.json").write_text(json.dumps({r.name: round(r.seconds, 2) for r in runs}, indent=2) + "\n")
    _point_latest(root, run_dir)
    return run_dir, runs


def summary_table(runs: list[NotebookRun], width: int = 60) -> str:
    """A plain-text table of every recorded scalar result."""
    rows = [("notebook", "result", "value")]
    for r in runs:
        if r.status != "ok":
            rows.append((r.name, "FAILED", r.error[:width]))
        for k, v in r.results.items():
            if isinstance(v, (int, float, str)) and not isinstance(v, bool):
                s = f"{v:,}" if isinstance(v, int) else str(v)
                rows.append((r.name, k, s[:width]))
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    return "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows)
