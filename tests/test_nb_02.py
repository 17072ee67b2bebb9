"""Notebook 02 through papermill: defaults reproduce 890; other parameters give other, correct results."""
from fractions import Fraction

import papermill as pm
import pytest

from kvlab.nb.compare import DeepSeek890Params
from kvlab.errors import ParameterError
from kvlab.layout import build_layout
from nbutil import run_notebook


def test_defaults_reproduce_890(tmp_path):
    r = run_notebook("02", tmp_path)
    assert r["bytes_per_token"] == 890
    assert r["entries_per_token"] == 2.5
    assert r["entry_bytes"] == {"main": 288, "index": 68}
    assert r["session_growing_bytes"] == 890_000_000
    assert r["baseline_bytes_per_token"] == {"BF16": 6880, "storage format": 3514.25, "vLLM, unpadded": 3850.25,
                                             "vLLM, pages padded": 3915}
    assert r["ratio_to_first_generation"] == round(float(Fraction(389120, 890)), 3)  # exact: the same on every CPU


def test_other_parameters(tmp_path):
    r = run_notebook("02", tmp_path, kv_format="bf16", context_tokens=500_000)
    L = build_layout("deepseek-v4.1-flash", "storage", "bf16")
    assert r["bytes_per_token"] == L.bytes_per_token == 3200
    assert r["session_growing_bytes"] == L.session(500_000).growing == 1_600_000_000


def test_other_model(tmp_path):
    r = run_notebook("02", tmp_path, model="deepseek-v4-pro", context_tokens=4096)
    assert r["bytes_per_token"] == float(build_layout("deepseek-v4-pro").bytes_per_token)


def test_bad_parameter_stops_in_the_first_cells(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match="parameter context_tokens must be an integer >= 1, got 0"):
        run_notebook("02", tmp_path, context_tokens=0)


@pytest.mark.parametrize("kw,match", [({"baseline": "nope"}, "parameter baseline: unknown model 'nope'"),
                                      ({"kv_format": "fp5"}, "parameter kv_format: unknown number format 'fp5'"),
                                      ({"context_tokens": 1e6}, "parameter context_tokens must be an integer")])
def test_bad_parameters(kw, match):
    p = dict(model="deepseek-v4.1-flash", baseline="deepseek-v4-flash", first_generation="deepseek-llm-67b",
             kv_format="", context_tokens=1_000_000)
    with pytest.raises(ParameterError, match=match):
        DeepSeek890Params.of({**p, **kw})
