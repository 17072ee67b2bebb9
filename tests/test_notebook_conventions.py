"""Every committed notebook: a parsed, documented parameters cell checked by a parameters dataclass; outputs of a
clean run; the kvlab kernel; floats shown as kvlab.nb.tolerance compares them."""
import importlib
import inspect
import json
import re
from dataclasses import fields

import papermill as pm
import pytest

from kvlab.nb.params import NotebookParams
from kvlab.nb.runner import list_notebooks

NOTEBOOKS = list_notebooks()


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cell(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "parameters" in code[0]["metadata"].get("tags", []), "the first code cell is tagged parameters"
    declared = pm.inspect_notebook(str(path))
    lines = [l for l in "".join(code[0]["source"]).splitlines() if l.strip() and not l.startswith("#")]
    assert len(declared) == len(lines), "every parameter line parses (papermill --help-notebook)"
    for name, p in declared.items():
        assert p["inferred_type_name"] != "None", f"{name} has a type annotation"
        assert p["help"].strip(), f"{name} has a comment"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_with_outputs_of_a_clean_run(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c["execution_count"] for c in code]
    assert None not in counts, "every code cell was run"
    assert counts == sorted(counts), "cells were run top to bottom"
    assert nb["metadata"]["kernelspec"]["name"] == "kvlab"
    assert not any(o.get("output_type") == "error" for c in code for o in c.get("outputs", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_dataclass_cell(path):
    """The cell after `parameters` builds the notebook's NotebookParams subclass (kept in kvlab/nb/, with the
    notebook's glue) from its namespace, in one line; the dataclass's fields are the declared parameters, in order, each with a comment (kvlab.nb.params)."""
    code = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    src = "".join(code[1]["source"]).strip()
    m = re.fullmatch(r"from (kvlab\.nb\.\w+) import (\w+Params)\n\nparams = \2\.of\(globals\(\)\)  # .+", src)
    assert m, f"the second code cell builds the parameters dataclass:\n{src}"
    cls = getattr(importlib.import_module(m[1]), m[2])
    assert issubclass(cls, NotebookParams) and cls is not NotebookParams
    assert [f.name for f in fields(cls) if f.init] == list(pm.inspect_notebook(str(path)))
    body = inspect.getsource(cls)
    for f in fields(cls):
        assert re.search(rf"^    {f.name}: .+  # \S", body, re.M), f"{cls.__name__}.{f.name} has a comment"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_declared_float_tolerance_is_sane(path):
    """A notebook that shows floats from torch / BLAS declares how far apart two CPUs may put them
    (metadata kvlab.float_rtol / float_atol, kvlab.nb.tolerance); the declaration stays well below 1%."""
    kv = json.loads(path.read_text())["metadata"].get("kvlab", {})
    assert "status" not in kv, "committed from a clean run, not an interrupted one"
    assert 0 <= kv.get("float_rtol", 0) <= 0.01 and 0 <= kv.get("float_atol", 0) <= 1e-5
