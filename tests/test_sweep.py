"""Sweeps on a dask LocalCluster: every grid point its own runner folder, failures isolated, one table, resumable."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from kvlab.errors import ParameterError
from kvlab.layout import bytes_per_token
from kvlab.nb.sweep import SWEEP_FILE, grid_points, point_outcome, read_grid, run_sweep

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def probe(tmp_path) -> Path:
    """A small parametrized notebook: kvlab's bytes per token for one model and format (no plotting, fast)."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('model: str = "qwen3-8b"  # catalog name\n'
                                       'kv_format: str = ""  # number format (empty: the model\'s own)\n'
                                       'gate: str = ""  # a file: every point but the first to start waits while it exists')
    params.metadata["tags"] = ["parameters"]
    body = nbformat.v4.new_code_cell("import os, time\nfrom kvlab.layout import bytes_per_token\n"
                                     "from kvlab.nb.record import record\n"
                                     "if gate:  # the first point to start claims the pass; the others hold\n"
                                     "    try:\n"
                                     "        os.close(os.open(gate + '.first', os.O_CREAT | os.O_EXCL))\n"
                                     "    except FileExistsError:\n"
                                     "        t0 = time.monotonic()\n"
                                     "        while os.path.exists(gate) and time.monotonic() - t0 < 600:\n"
                                     "            time.sleep(0.2)\n"
                                     'record("bytes_per_token", bytes_per_token(model, "storage", kv_format or None))')
    nb.cells = [params, body]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_grid_files_and_bad_grids(tmp_path, probe):
    (tmp_path / "g.yaml").write_text("model: [qwen3-8b, llama-3.1-8b]\nkv_format: nvfp4\n")
    grid = read_grid(tmp_path / "g.yaml")
    assert grid == {"model": ["qwen3-8b", "llama-3.1-8b"], "kv_format": ["nvfp4"]}
    (tmp_path / "g.json").write_text(json.dumps(grid))
    assert read_grid(tmp_path / "g.json") == grid
    points = grid_points(grid)
    assert [p.params for p in points] == [{"model": "qwen3-8b", "kv_format": "nvfp4"},
                                          {"model": "llama-3.1-8b", "kv_format": "nvfp4"}]
    assert len({p.folder for p in points}) == 2 and points[0].folder == grid_points(grid)[0].folder  # stable names
    for text, match in [("[1, 2]", "mapping"), ("model: []", "empty list"), ("model: [a\n", "not valid YAML")]:
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(ParameterError, match=match):
            read_grid(tmp_path / "bad.yaml")
    with pytest.raises(ParameterError, match="'nope' is not declared by probe"):
        run_sweep(str(probe), {"nope": [1]}, tmp_path / "runs", workers=1, progress=False, log=lambda m: None)


def test_small_grid_on_two_workers(tmp_path, probe):
    grid = {"model": ["qwen3-8b", "deepseek-v4.1-flash", "no-such-model"], "kv_format": ["", "nvfp4"]}
    sweep = run_sweep(str(probe), grid, tmp_path / "runs", workers=2, progress=False, log=lambda m: None)
    assert sweep.workers == 2 and sweep.ran == 6 and sweep.skipped == 0
    assert sorted(p.params["model"] for p in sweep.failed) == ["no-such-model", "no-such-model"]  # isolated
    record = json.loads((sweep.folder / SWEEP_FILE).read_text())
    assert record["status"] == "failed" and len(record["failed"]) == 2 and record["workers"] == 2

    csv = pd.read_csv(sweep.folder / "results.csv", keep_default_na=False)
    parquet = pd.read_parquet(sweep.folder / "results.parquet")
    assert list(csv.columns) == ["model", "kv_format", "status", "error", "bytes_per_token", "folder"]
    assert list(parquet.columns) == list(csv.columns) and len(csv) == len(parquet) == 6
    for row in parquet.itertuples():
        point_dir = sweep.folder / row.folder
        assert (point_dir / "latest" / "probe.ipynb").is_file()  # the runner's own output, per point
        if row.model == "no-such-model":
            assert row.status == "failed" and "no-such-model" in row.error and pd.isna(row.bytes_per_token)
        else:
            assert row.status == "ok"
            assert row.bytes_per_token == bytes_per_token(row.model, "storage", row.kv_format or None)
    by = {(r.model, r.kv_format): r.bytes_per_token for r in csv.itertuples()}
    assert by[("qwen3-8b", "")] == "147456" and by[("deepseek-v4.1-flash", "")] == "890"  # exact in the CSV


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_stopped_sweep_resumes(tmp_path, probe):
    # Three fresh-clone CI runs (2026-12-02) timed out waiting after Ctrl-C while the test read the sweep's pipes,
    # which a left-behind kernel could hold open; since the wait is on the process and the output goes to files it
    # has passed in every fresh-clone run since (2026-12-02 to 12-03), so it is an ordinary test again.
    models = ["qwen3-8b", "llama-3.1-8b", "deepseek-v4.1-flash", "gpt-oss-20b"]
    gate = tmp_path / "gate"
    gate.write_text("")  # held: once one point has finished, the others wait until the test stops the sweep
    (tmp_path / "grid.json").write_text(json.dumps({"model": models, "gate": [str(gate)]}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    # output to files, not pipes: a process the sweep leaves behind (a notebook kernel in a session of its own)
    # cannot then hold the test's read open after the sweep itself has exited; SIGINT at its default, unblocked,
    # whatever this test process inherited
    out_f, err_f = open(tmp_path / "sweep.out", "w+"), open(tmp_path / "sweep.err", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "kvlab", "sweep", str(probe), "--grid", str(tmp_path / "grid.json"),
                             "--workers", "1", "--no-progress", "--out", str(tmp_path / "runs")],
                            cwd=tmp_path, env=env, stdout=out_f, stderr=err_f, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 240
        folder, done = None, []
        while time.monotonic() < deadline and not done:  # stop it once one point has finished
            time.sleep(0.5)
            folders = sorted((tmp_path / "runs").glob(f"*/{SWEEP_FILE}"))
            if folders:
                folder = folders[0].parent
                done = [d for d in folder.iterdir() if d.is_dir() and point_outcome(d, "probe")]
            assert proc.poll() is None, (tmp_path / "sweep.err").read_text()
        assert done, "no point finished in time"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it: to the whole process group
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out_f.close()
        err_f.close()
    err = (tmp_path / "sweep.err").read_text()
    assert proc.returncode == 130, err
    assert f"--resume {folder}" in err
    record = json.loads((folder / SWEEP_FILE).read_text())
    assert record["status"] == "interrupted"
    finished = {d.name: os.readlink(d / "latest") for d in folder.iterdir()
                if d.is_dir() and (point_outcome(d, "probe") or {}).get("status") == "ok"}
    assert len(finished) == 1

    gate.unlink()  # released: the resumed points run straight through
    sweep = run_sweep(str(probe), None, resume=folder, workers=2, progress=False, log=lambda m: None)
    assert sweep.skipped == len(finished) and sweep.ran == len(models) - len(finished)
    assert not sweep.failed and set(sweep.status.values()) == {"ok"}
    for name, run in finished.items():  # skipped points were not run again
        assert os.readlink(folder / name / "latest") == run
    table = pd.read_parquet(folder / "results.parquet")
    assert list(table.model) == models and list(table.status) == ["ok"] * len(models)
    assert [int(v) for v in table.bytes_per_token] == [bytes_per_token(m) for m in models]


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, probe):
    (tmp_path / "g.yaml").write_text("model: [qwen3-8b]\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    for args, says in [(["--grid", "missing.yaml", "--out", "runs"], "grid 'missing.yaml': cannot read it"),
                       (["--grid", "g.yaml", "--workers", "0", "--out", "runs"], "--workers must be an integer >= 1"),
                       (["--out", "runs"], "a sweep needs a grid"),
                       (["--resume", str(tmp_path)], "is not a sweep folder")]:
        r = subprocess.run([sys.executable, "-m", "kvlab", "sweep", str(probe), *args], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("kvlab: error: ") and says in lines[0], \
            r.stderr
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ParameterError, match="cannot reach the dask scheduler"):
        run_sweep(str(probe), tmp_path / "g.yaml", tmp_path / "runs", scheduler=f"tcp://127.0.0.1:{port}",
                  progress=False, log=lambda m: None)
    assert not (tmp_path / "runs").exists()  # the scheduler is reached before any folder is made: nothing written
