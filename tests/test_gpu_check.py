"""`make gpu-check` on a machine without a CUDA GPU: one clear line, exit 2, nothing written."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_check import gpu_slug, no_gpu_reason

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_names_become_file_names():
    assert gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert gpu_slug("NVIDIA GeForce RTX 4090 (24 GB)") == "nvidia-geforce-rtx-4090-24-gb"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here: `make gpu-check` runs for real")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    assert no_gpu_reason()
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA GPU here (torch ")
    assert "TORCH=" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_decode_benchmark_takes_a_device():
    from benchmarks.bench_decode import run
    r = run(20_000, reps=1, device="cpu")
    assert r["device"] == "cpu" and r["sparse_bytes"] < r["dense_bytes"]
