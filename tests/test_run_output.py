"""`kvlab run` prints one line per notebook (status, seconds, name) and none of the kernels' transport warnings."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from nbutil import tiny_notebook

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_one_line_per_notebook_and_no_kernel_warnings(tmp_path):
    good = tiny_notebook(tmp_path / "01_good.ipynb", "from kvlab.nb.record import record\nrecord('doubled', 2 * x)")
    bad = tiny_notebook(tmp_path / "02_bad.ipynb", "raise RuntimeError('boom')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "kvlab", "run", good, bad, "-p", "x", "3", "--out", "runs"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "without encryption" not in r.stderr and "IPKernelApp" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert re.fullmatch(r"ok +\d+\.\d s  01_good \{'x': 3\}", lines[0]), lines
    assert re.fullmatch(r"failed +\d+\.\d s  02_bad \{'x': 3\}: RuntimeError: boom", lines[1]), lines
    assert lines[2].startswith("failed: 02_bad") and len(lines) == 3  # no progress bar text off a terminal
    assert "doubled  6" in r.stdout
