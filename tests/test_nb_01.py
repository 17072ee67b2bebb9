"""Notebook 01 through papermill with new parameters, bad parameters, and nbval's guard on stored key numbers."""
from pathlib import Path

import papermill as pm
import pytest

from kvlab.engines import allocate
from nbutil import run_notebook

NB = Path(__file__).resolve().parent.parent / "notebooks" / "01_kv_bytes_per_token.ipynb"


def test_new_parameters_give_new_correct_results(tmp_path):
    r = run_notebook("01", tmp_path, model="deepseek-v4-flash", layout="vllm", context_tokens=4096,
                     compare_formats=["nvfp4"])
    a = allocate("deepseek-v4-flash", "vllm")
    assert r["bytes_per_token"] == 3915
    assert r["session_growing_bytes"] == a.session(4096).growing
    assert r["catalog_bytes_per_token"]["qwen3-8b"] == 147456


def test_hybrid_rows_and_split_formats(tmp_path):
    r = run_notebook("01", tmp_path, model="qwen3-8b", k_format="fp8_e4m3", v_format="nvfp4", context_tokens=4096,
                     compare_formats=["bf16"], hybrid_models=["qwen3-next-80b-a3b", "jamba-v0.1"])
    assert r["bytes_per_token"] == 36 * 8 * (128 + 72)  # K in FP8, V in NVFP4
    assert r["hybrid_bytes_per_token"] == {"qwen3-next-80b-a3b": 24_576, "jamba-v0.1": 16_384}
    assert r["hybrid_state_bytes"]["qwen3-next-80b-a3b"] == 36 * (8192 * 4 * 2 + 32 * 128 * 128 * 4)
    assert r["catalog_bytes_per_token"]["jamba-v0.1"] == 16_384


def test_bad_parameter_stops_in_the_first_cells(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match="parameter layout must be one of"):
        run_notebook("01", tmp_path, layout="sglang")


# Tampering with a stored key number (147,456 -> 147,457) fails nbval: tests/test_nb_tolerance.py, with the 890.
