"""pytest plugin for nbval runs over kvlab's notebooks (pyproject's addopts load it: -p kvlab.nb.nbval_plugin).

- Outputs are compared through kvlab.nb.tolerance before nbval's exact comparison: integers exact, floats
  within the tolerance their recorded result or their notebook declares; nbval still reports every real
  difference in its own words.
- A cell whose source starts with TRACE_MARK needs the real request traces (Mooncake), which live outside
  the repository: when they are absent, nbval skips the cell with that reason instead of failing it.
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


def pytest_collection_modifyitems(config, items):
    from ..sim.traces import have_trace

    if have_trace("conversation") and have_trace("mooncake_synthetic"):
        return
    skip = pytest.mark.skip(reason="the Mooncake traces are absent (kvlab traces fetch mooncake-conversation "
                                   "mooncake-synthetic): this cell needs them")
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and str(cell.get("source", "")).startswith(TRACE_MARK):
            item.add_marker(skip)
