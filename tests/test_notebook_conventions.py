"""Every committed notebook: a parsed, documented parameters cell; outputs of a clean run; the kvlab kernel."""
import json

import papermill as pm
import pytest

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
