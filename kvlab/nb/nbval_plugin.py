"""pytest plugin for nbval runs over kvlab's notebooks (pyproject's addopts load it: -p kvlab.nb.nbval_plugin).

- Outputs are compared through kvlab.nb.tolerance before nbval's exact comparison: integers exact, floats
  within the tolerance their recorded result or their notebook declares; nbval still reports every real
  difference in its own words.
- A cell whose source starts with TRACE_MARK needs the real request traces (Mooncake), which live outside
  the repository: when they are absent, nbval skips the cell with that reason instead of failing it.
- The catalog's pretrained models that a collected notebook names are converted before any notebook runs: a first
  conversion prints its progress, which would otherwise land in that notebook's first cell and fail nbval's
  comparison on a machine that has not converted them yet.
- Under pytest-xdist the notebook kernels (started with the worker's environment) share the cores with the other
  workers, so they get one torch thread each unless OMP_NUM_THREADS says otherwise (a notebook whose `threads`
  parameter is 0 takes torch's default, which would otherwise be one thread per core in every worker).
"""
from __future__ import annotations

import pytest

from .tolerance import notebook_tolerance, tolerate

TRACE_MARK = "# needs: Mooncake traces"


def _patch_nbval() -> None:
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:  # nbval is a dev dependency
        return
    if getattr(IPyNbCell.compare_outputs, "kvlab_tolerance", False):
        return
    exact_compare = IPyNbCell.compare_outputs

    def compare_outputs(self, test, ref, skip_compare=None):
        default = notebook_tolerance(getattr(self.parent, "nb", {}).get("metadata"))
        own = (getattr(self, "cell", None) or {}).get("metadata", {})
        if (own.get("kvlab") or {}).keys() & {"float_rtol", "float_atol"}:
            default = notebook_tolerance(own)  # a cell may declare its own (e.g. BF16 compute)
        return exact_compare(self, tolerate(test, ref, default, self.sanitize), ref, skip_compare)

    compare_outputs.kvlab_tolerance = True
    IPyNbCell.compare_outputs = compare_outputs


def pytest_configure(config):
    import os
    _patch_nbval()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def _convert_models(items) -> None:
    """Convert the catalog models (kvlab.hf.pretrained) that the collected notebooks name, once, here."""
    from pathlib import Path
    notebooks = {str(item.fspath) for item in items if getattr(item, "cell", None) is not None}
    if not notebooks:
        return
    try:
        from ..hf.pretrained import REGISTRY, ensure
    except ImportError:  # the hf extra is absent: the notebook says so in its first cell
        return
    from ..errors import KvlabError
    from ..hf.pretrained import models_dir
    text = "".join(Path(p).read_text() for p in sorted(notebooks))
    names = [n for n in REGISTRY if f'\\"{n}\\"' in text or f"'{n}'" in text]  # quoted in a cell's source
    if not names:
        return
    here = models_dir()
    here.mkdir(parents=True, exist_ok=True)
    with open(here / ".convert.lock", "w") as lock:
        try:  # pytest-xdist workers: one converts, the others wait for it and find the model ready
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: each converts (into its own hidden folder, renamed into place)
            pass
        for name in names:
            try:
                ensure(REGISTRY[name])
            except KvlabError:  # not installed here: the notebook's first cell says so in its own words
                pass


def pytest_collection_modifyitems(config, items):
    from ..sim.traces import have_trace

    _convert_models(items)

    if have_trace("conversation") and have_trace("mooncake_synthetic"):
        return
    skip = pytest.mark.skip(reason="the Mooncake traces are absent (kvlab traces fetch mooncake-conversation "
                                   "mooncake-synthetic): this cell needs them")
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and str(cell.get("source", "")).startswith(TRACE_MARK):
            item.add_marker(skip)
