"""Batch runs: execute notebooks through papermill into runs/<timestamp>/, collect recorded results.

A failing notebook does not stop the batch: its partly executed output is kept for
inspection, the others still run, the summary names it, and the run exits non-zero.
Each run gets a new folder, so no earlier run's results are ever overwritten; runs/latest
points at the newest finished run, and kvlab only ever replaces a `latest` it made itself.

Every run folder holds run.json, written "running" before the first notebook starts and finalized
("ok", "failed" or "interrupted") at the end. Ctrl-C or SIGTERM stops the batch: the cut-short
notebook gets an "interrupted" banner cell and metadata, results.json and run.json say
"interrupted", and `latest` is left where it was. A run whose process died without a word (kill -9)
stays "running"; the next run marks it "interrupted" when it finds its process gone.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..checks import need_out_dir, short
from ..errors import KvlabError, ParameterError, WrongTypeError
from ..resources import package_dir
from .record import INTERRUPTED_TAG, read_results

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = package_dir("notebooks")  # notebooks/ at the repository top, package data in a wheel
QUIET_KERNEL = ["--IPKernelApp.log_level=ERROR"]  # no kernel warnings ("running over TCP without encryption")


@dataclass
class NotebookRun:
    """The outcome of one notebook in a batch."""

    name: str  # notebook stem
    status: str  # "ok", "failed", "interrupted" (cut short) or "not run" (after an interruption)
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
        try:
            given = p.suffix == ".ipynb" and p.is_file()
        except (OSError, ValueError):  # a name too long for a path, or holding a NUL: not a file, maybe a stem
            given = False
        if given:
            out.append(p.resolve())
            continue
        hits = [q for q in list_notebooks() if q.stem == n or q.stem.startswith(n.removesuffix(".ipynb"))]
        if len(hits) != 1:
            known = ", ".join(q.stem for q in list_notebooks())
            raise ParameterError(f"no single notebook matches {short(n)}; known: {known}")
        out.append(hits[0])
    twice = sorted({p.name for p in out if sum(q.name == p.name for q in out) > 1})
    if twice:  # one output file per notebook name in a run folder: the second would overwrite the first
        raise ParameterError(f"notebook {twice[0]} is selected twice; a run executes each notebook once")
    return out


def declared_parameters(path: Path) -> dict:
    """The parameters a notebook's `parameters` cell declares; a file that is not a notebook is refused."""
    import papermill as pm
    try:
        return pm.inspect_notebook(str(path))
    except Exception as e:  # nbformat / json / UnicodeDecode errors of a broken file
        raise ParameterError(f"{path}: not a readable notebook ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:160] if str(e) else ''})") from None


_GLUE = re.compile(r"from (kvlab\.nb\.\w+) import (\w+Params)\n\nparams = \2\.of\(globals\(\)\)")


def check_parameters(path: Path, parameters: dict) -> None:
    """Before any kernel starts: a kvlab notebook's parameters dataclass (the cell after `parameters` names it,
    kvlab.nb.params) built from the declared defaults and `parameters`, in the notebook's folder as its kernel would,
    so that a bad value is refused in one line naming the notebook and the parameter, and no run folder is made. A
    notebook without that cell is checked by its own first cells, in its run."""
    import contextlib
    import importlib
    import io
    import warnings

    import nbformat

    if not parameters:
        return
    try:
        code = [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]
        i = next(k for k, c in enumerate(code) if "parameters" in c.metadata.get("tags", []))
        m = _GLUE.match(code[i + 1].source)
        if m is None:
            return
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):  # third-party import chatter is not the user's output
            warnings.simplefilter("ignore")
            cls = getattr(importlib.import_module(m[1]), m[2])
            ns: dict = {}
            exec(compile(code[i].source, f"{path.name}: parameters", "exec"), ns)  # the declared defaults
    except Exception:  # not a kvlab notebook's layout: its own first cells check it when it runs
        return
    ns.update(parameters)
    here = os.getcwd()
    try:
        os.chdir(path.parent)  # relative paths among the parameters mean what they mean to the kernel
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls.of(ns)
    except KvlabError as e:
        raise ParameterError(f"{path.stem}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    finally:
        os.chdir(here)


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


RUN_FILE = "run.json"  # a run folder's status: running / ok / failed / interrupted
POINTER_FILE = "RUN"  # where symlinks are unavailable, latest/ is a folder holding only this file
_STAMP = re.compile(r"\d{8}-\d{6}(?:-\d+)?")  # run folder names


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a batch; the run folder is marked "interrupted"."""

    def __init__(self, run_dir: Path, notebook: str | None, signal_name: str):
        super().__init__(f"{signal_name} during {notebook or 'the batch'}; {run_dir} is marked interrupted")
        self.run_dir = run_dir  # the partial run's folder
        self.notebook = notebook  # the notebook that was cut short (None: between notebooks)
        self.signal_name = signal_name  # "SIGINT" or "SIGTERM"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_dir(root: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    d, k = root / stamp, 1
    while True:
        try:
            d.mkdir(parents=True)
            return d
        except FileExistsError:
            k += 1
            d = root / f"{stamp}-{k}"


def check_out_root(root) -> Path:
    """The output folder (--out) as a folder kvlab can write in, checked before any work; nothing is made here."""
    try:
        return need_out_dir("output folder", root)
    except ParameterError as e:
        raise ParameterError(f"{e}; choose another --out") from None


def _check_root(root) -> Path:
    """The output folder can be written in (made later, with the run folder), and its `latest` (if any) is a pointer
    kvlab made."""
    root = check_out_root(root)
    why = _foreign_latest(root / "latest")
    if why:
        raise ParameterError(f"{root / 'latest'} is {why}, not a pointer kvlab made; kvlab only replaces its own "
                             "`latest`: move it away or choose another --out")
    return root


def _foreign_latest(latest: Path) -> str:
    """'' when `latest` is absent or kvlab's own pointer; else what it is (for the message)."""
    if latest.is_symlink():
        target = os.readlink(latest)
        return "" if _STAMP.fullmatch(target) else f"a link to {target!r}"
    if not latest.exists():
        return ""
    if latest.is_dir():
        entries = [p.name for p in latest.iterdir()]
        if entries == [POINTER_FILE] and (latest / POINTER_FILE).is_file():
            try:
                if _STAMP.fullmatch((latest / POINTER_FILE).read_text(encoding="utf-8").strip()):
                    return ""
            except (OSError, UnicodeDecodeError):
                pass
        return "a folder with other contents"
    return "a file"


def _point_latest(root: Path, run_dir: Path, log=print) -> None:
    """Point root/latest at run_dir, replacing only a pointer kvlab made (checked again: it may have changed)."""
    latest = root / "latest"
    why = _foreign_latest(latest)
    if why:
        log(f"left {latest} alone: it is {why}, not a pointer kvlab made")
        return
    tmp = root / f".latest-{os.getpid()}"
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(run_dir.name, target_is_directory=True)
        if latest.is_dir() and not latest.is_symlink():  # kvlab's pointer folder, replaced by a link
            (latest / POINTER_FILE).unlink()
            latest.rmdir()
        os.replace(tmp, latest)
    except OSError:  # no symlinks here: leave a pointer file
        if tmp.is_symlink():
            tmp.unlink()
        if latest.is_symlink():
            latest.unlink()
        latest.mkdir(exist_ok=True)
        (latest / POINTER_FILE).write_text(run_dir.name + "\n")


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def read_run(run_dir: str | Path) -> dict:
    """A finished run's results.json; refuses a run that is still going, was interrupted or has no status."""
    d = Path(run_dir)
    try:
        status = json.loads((d / RUN_FILE).read_text())["status"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ParameterError(f"{d} holds no readable {RUN_FILE}: not a kvlab run folder, or one cut off before "
                             "it started") from None
    if status not in ("ok", "failed"):
        raise ParameterError(f"{d} is a run that is {status}: its results are incomplete")
    return json.loads((d / "results.json").read_text())


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, TypeError, ValueError):
        return True  # someone else's process, or no pid to judge by: leave the run alone
    return True


def _mark_abandoned(root: Path, log=print) -> None:
    """Runs left "running" by a process that is gone (kill -9, a crash) become "interrupted"."""
    for f in root.glob(f"*/{RUN_FILE}"):
        try:
            run = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if (isinstance(run, dict) and run.get("status") == "running" and run.get("host") == socket.gethostname()
                and not _pid_alive(run.get("pid"))):
            run.update(status="interrupted", reason="its process ended without finishing the run", finished=None)
            _write_json(f, run)
            log(f"marked {f.parent} interrupted: its process is gone")


def mark_interrupted(notebook: str | Path, reason: str) -> None:
    """Mark a cut-short executed notebook: a banner cell first, cells that never ran "pending", no end time."""
    import nbformat

    path = Path(notebook)
    nb = nbformat.read(str(path), as_version=4)
    started = [i for i, c in enumerate(nb.cells) if c.metadata.get("papermill", {}).get("start_time")]
    cut = started[-1] if started else None  # papermill marks even the cut cell "completed"
    for i, c in enumerate(nb.cells):
        pm = c.metadata.get("papermill")
        if pm is None:
            continue
        if i == cut:
            pm["status"], pm["end_time"], pm["duration"] = "failed", None, None
            if c.cell_type == "code" and not any(o.get("output_type") == "error" for o in c.outputs):
                c.outputs.append(nbformat.v4.new_output("error", ename="Interrupted", evalue=reason, traceback=[
                    f"Interrupted: {reason} while this cell ran; it and the cells after it did not finish"]))
        elif not pm.get("start_time"):
            pm["status"] = "pending"
    code = sum(1 for c in nb.cells if c.cell_type == "code")
    done = sum(1 for i in started if i != cut and nb.cells[i].cell_type == "code")
    banner = nbformat.v4.new_markdown_cell(
        f"**INTERRUPTED: this notebook did not finish.** {reason}; {done} of {code} code cells completed"
        + (f", cell {cut + 1} was cut short" if cut is not None else "")
        + ". Its outputs and recorded results are partial, not a result.")
    banner.metadata["tags"] = [INTERRUPTED_TAG]
    nb.cells.insert(0, banner)
    pm = nb.metadata.setdefault("papermill", {})
    pm["end_time"], pm["duration"], pm["exception"] = None, None, True
    nb.metadata["kvlab"] = {"status": "interrupted", "reason": reason}
    nbformat.write(nb, str(path))


def _raise_on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


_KERNELS = None  # a weakref.WeakSet of kernel managers the runner started (nbclient leaves one behind when
#                                     Ctrl-C lands while the kernel starts)


def _kernel_manager_class():
    """nbclient's AsyncKernelManager, remembering each instance so an interrupted run can stop its kernel."""
    global _KERNELS
    import weakref

    from jupyter_client.manager import AsyncKernelManager

    if _KERNELS is None:
        _KERNELS = weakref.WeakSet()

    class TrackedKernelManager(AsyncKernelManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            _KERNELS.add(self)

    return TrackedKernelManager


def _stop_kernels() -> None:
    """Kill any kernel the runner started that is still running (after an interruption)."""
    from jupyter_core.utils import run_sync

    for km in list(_KERNELS or ()):
        try:
            if km.has_kernel:
                run_sync(km.shutdown_kernel)(now=True)
        except Exception:  # pragma: no cover - already gone; nothing more to do
            pass


def run_notebooks(names: list[str] | None = None, parameters: dict | None = None, out_root: str | Path = "runs",
                  kernel: str | None = None, log=print, progress: bool = False) -> tuple[Path, list[NotebookRun]]:
    """Execute notebooks into a new run folder; returns (folder, outcomes). Never raises for a failing notebook.
    `progress`: a progress bar over the batch on stderr (when it is a terminal), the log lines printed above it."""
    import papermill as pm

    if parameters is not None and not isinstance(parameters, dict):
        raise WrongTypeError(f"parameters must be a dict of name -> value, got {type(parameters).__name__}")
    if names is not None and (isinstance(names, (str, Path)) or not isinstance(names, (list, tuple))):
        raise WrongTypeError(f"names must be a list of notebook names or paths, got {type(names).__name__} {names!r}")
    parameters = dict(parameters or {})
    paths = resolve(names)
    declared = {p: declared_parameters(p) for p in paths}
    unknown = [k for k in parameters if not any(k in d for d in declared.values())]
    if unknown:
        raise ParameterError(f"parameter {unknown[0]!r} is not declared by any selected notebook "
                             f"({', '.join(p.stem for p in paths)})")
    for p in paths:
        check_parameters(p, {k: v for k, v in parameters.items() if k in declared[p]})
    root = _check_root(out_root)
    _mark_abandoned(root, log)
    run_dir = new_run_dir(root)
    kernel = kernel or kernel_name()
    status_file = run_dir / RUN_FILE
    run_info = {"status": "running", "run": run_dir.name, "notebooks": [p.stem for p in paths],
                "parameters": parameters, "kernel": kernel, "started": _now(), "finished": None,
                "pid": os.getpid(), "host": socket.gethostname()}
    _write_json(status_file, run_info)
    main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_on_sigterm) if main else None
    runs: list[NotebookRun] = []
    current = None
    bar, log = _progress(len(paths), progress, log)
    try:
        for p in paths:
            current = p
            bar.set_description(p.stem)
            runs.append(_run_one(pm, p, run_dir, {k: v for k, v in parameters.items() if k in declared[p]},
                                 kernel, log))
            bar.update(1)
            current = None
    except KeyboardInterrupt as e:
        _stop_kernels()
        sig = "SIGTERM" if str(e) == "SIGTERM" else "SIGINT"
        reason = f"{sig} ({'kill' if sig == 'SIGTERM' else 'Ctrl-C'}) stopped the batch"
        done = {r.name for r in runs}
        if current is not None:
            out = run_dir / current.name
            if out.exists():
                mark_interrupted(out, reason)
            runs.append(NotebookRun(current.stem, "interrupted", str(out), {}, reason))
        runs += [NotebookRun(p.stem, "not run", str(run_dir / p.name), {}, reason) for p in paths
                 if p.stem not in done and p is not current]
        _finish(run_dir, run_info, runs, parameters, kernel, "interrupted", reason)
        log(f"interrupted: {run_dir} is marked so; {root / 'latest'} still points at the last finished run")
        raise RunInterrupted(run_dir, current.stem if current else None, sig) from None
    finally:
        bar.close()
        if main:
            signal.signal(signal.SIGTERM, old_term)
    _finish(run_dir, run_info, runs, parameters, kernel, "failed" if any(r.status != "ok" for r in runs) else "ok")
    _point_latest(root, run_dir, log)
    return run_dir, runs


def _progress(total: int, on: bool, log):
    """(bar, log): a tqdm bar over `total` notebooks (none unless `on` and stderr is a terminal), and a log that
    prints above it."""
    import sys

    from tqdm import tqdm

    bar = tqdm(total=total, unit="notebook", file=sys.stderr, disable=None if on else True, dynamic_ncols=True)

    def above(message):
        with tqdm.external_write_mode(file=sys.stderr):
            log(message)
    return bar, above


def _run_one(pm, p: Path, run_dir: Path, params: dict, kernel: str, log) -> NotebookRun:
    out = run_dir / p.name
    t0 = time.perf_counter()
    status, error = "ok", ""
    try:
        pm.execute_notebook(str(p), str(out), parameters=params, kernel_name=kernel, cwd=str(p.parent),
                            progress_bar=False, log_output=False, kernel_manager_class=_kernel_manager_class(),
                            shutdown_kernel="immediate",  # outputs are in; on Ctrl-C, no kernel outlives us
                            extra_arguments=QUIET_KERNEL)
    except Exception as e:  # papermill raises PapermillExecutionError with the cell's error
        status = "failed"
        error = (getattr(e, "ename", "") + ": " + str(getattr(e, "evalue", "")) if hasattr(e, "ename")
                 else f"{type(e).__name__}: {e}").strip().splitlines()[0][:300]
    results = read_results(out) if out.exists() else {}
    seconds = time.perf_counter() - t0
    log(f"{status:<6} {seconds:6.1f} s  {p.stem}" + (f" {params}" if params else "") + (f": {error}" if error else ""))
    return NotebookRun(p.stem, status, str(out), results, error, seconds)


def _finish(run_dir: Path, run_info: dict, runs: list[NotebookRun], parameters: dict, kernel: str, status: str,
            reason: str = "") -> None:
    """results.json, timings.json, then run.json's final status (last: a run is finished once it says so)."""
    summary = {
        "run": run_dir.name,
        "status": status,
        "kernel": kernel,
        "parameters": parameters,
        "notebooks": {r.name: {"status": r.status, "output": Path(r.output).name, "error": r.error,
                               "results": r.results} for r in runs},
        "failed": [r.name for r in runs if r.status != "ok"],
    }
    if reason:
        summary["reason"] = reason
    _write_json(run_dir / "results.json", summary)
    _write_json(run_dir / "timings.json", {r.name: round(r.seconds, 2) for r in runs})
    run_info.update(status=status, finished=_now(), **({"reason": reason} if reason else {}))
    _write_json(run_dir / RUN_FILE, run_info)


def summary_table(runs: list[NotebookRun], width: int = 60) -> str:
    """A plain-text table of every recorded scalar result."""
    rows = [("notebook", "result", "value")]
    for r in runs:
        if r.status != "ok":
            rows.append((r.name, r.status.upper(), r.error[:width]))
        for k, v in r.results.items():
            if isinstance(v, (int, float, str)) and not isinstance(v, bool):
                s = f"{v:,}" if isinstance(v, int) else str(v)
                rows.append((r.name, k, s[:width]))
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    return "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows)
