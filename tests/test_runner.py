"""Batch runs: a failing notebook keeps its output, the others run, earlier runs are never overwritten."""
import json

import pytest

from kvlab.errors import ParameterError
from kvlab.nb.runner import run_notebooks
from nbutil import tiny_notebook


@pytest.fixture
def books(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    good = tiny_notebook(src / "01_good.ipynb", "from kvlab.nb.record import record\nrecord('doubled', 2 * x)")
    bad = tiny_notebook(src / "02_bad.ipynb", "from kvlab.nb.record import record\nrecord('before', 7)\nraise RuntimeError('boom')")
    last = tiny_notebook(src / "03_after.ipynb", "from kvlab.nb.record import record\nrecord('after', x + 1)")
    return tmp_path, [good, bad, last]


def test_failure_keeps_outputs_and_runs_the_rest(books):
    root, paths = books
    run_dir, runs = run_notebooks(paths, {"x": 5}, root / "runs", log=lambda m: None)
    status = {r.name: r.status for r in runs}
    assert status == {"01_good": "ok", "02_bad": "failed", "03_after": "ok"}
    summary = json.loads((run_dir / "results.json").read_text())
    assert summary["failed"] == ["02_bad"]
    assert summary["notebooks"]["01_good"]["results"] == {"doubled": 10}
    assert summary["notebooks"]["03_after"]["results"] == {"after": 6}
    assert "boom" in summary["notebooks"]["02_bad"]["error"]
    # the failed notebook's partial output is kept, with what it recorded before failing
    assert (run_dir / "02_bad.ipynb").exists()
    assert summary["notebooks"]["02_bad"]["results"] == {"before": 7}
    assert (root / "runs" / "latest" / "results.json").exists()


def test_new_run_never_overwrites(books):
    root, paths = books
    first, _ = run_notebooks(paths[:1], {"x": 1}, root / "runs", log=lambda m: None)
    second, _ = run_notebooks(paths[:1], {"x": 2}, root / "runs", log=lambda m: None)
    assert first != second
    assert json.loads((first / "results.json").read_text())["notebooks"]["01_good"]["results"] == {"doubled": 2}
    assert json.loads((second / "results.json").read_text())["notebooks"]["01_good"]["results"] == {"doubled": 4}
    assert (root / "runs" / "latest").resolve() == second.resolve()


def test_undeclared_parameter_is_refused(books):
    root, paths = books
    with pytest.raises(ParameterError, match="not declared"):
        run_notebooks(paths, {"nope": 1}, root / "runs", log=lambda m: None)
    assert not (root / "runs").exists()
