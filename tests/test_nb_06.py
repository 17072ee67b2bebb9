"""Notebook 06 through papermill with small parameters; recorded results against kvlab's own numbers."""
import papermill as pm
import pytest

from kvlab.serving.capacity import plan
from nbutil import run_notebook


def test_small_run_records_exact_capacity(tmp_path):
    r = run_notebook("06", tmp_path, models=["qwen3-8b", "deepseek-v4.1-flash"], gpus=["H100"], contexts=[32_768],
                     prefix_hit_rates=[0.0, 0.5], ttls_s=[60], synthetic_sessions=20, checklist_gpu="H100",
                     checklist_context=100_000)
    assert r["sessions_per_gpu"]["qwen3-8b|H100|32768"] == plan("qwen3-8b", "H100", 32_768).sessions_per_gpu == 10
    assert r["sessions_per_gpu"]["deepseek-v4.1-flash|H100|32768"] == plan("deepseek-v4.1-flash", "H100",
                                                                           32_768).sessions_per_gpu
    assert r["prefix_sweep_sessions"]["qwen3-8b|0.5"] >= 2 * r["prefix_sweep_sessions"]["qwen3-8b|0.0"]
    assert abs(r["vllm_over_exact"]["qwen3-8b|32768"] - 1) < 1e-3
    assert 0 <= r["ttl_replay_probability"]["60"] <= 1
    assert r["checklist_sessions_per_gpu"] > 0


def test_deployment_table_counts_per_gpu(tmp_path):
    r = run_notebook("06", tmp_path, models=["qwen3-8b"], gpus=["H200"], contexts=[32_768], prefix_hit_rates=[0.0],
                     ttls_s=[60], synthetic_sessions=20, checklist_gpu="H200", checklist_context=131_072,
                     deployment_models=["qwen3-8b", "deepseek-v3"], deployment_size=8)
    per_gpu = r["deployment_per_gpu_bytes_per_token"]
    assert per_gpu["qwen3-8b|TP 8"] == 18_432 and per_gpu["qwen3-8b|TP 8 + DCP 8"] is None  # DCP > TP / KV heads
    assert per_gpu["deepseek-v3|TP 8"] == 70_272 and per_gpu["deepseek-v3|TP 8 + DCP 8"] == 8_784
    assert per_gpu["deepseek-v3|DP attention 8"] == 70_272
    from kvlab.serving.parallel import Parallelism
    cap = plan("deepseek-v3", "H200", 131_072, 0.5, parallel=Parallelism(tp=8, dcp=8),
               replay_probability=0.0)  # V3 replays nothing: the replay probability does not matter
    assert r["deployment_sessions"]["deepseek-v3|TP 8 + DCP 8"] == cap.sessions_per_deployment


def test_bad_parameter_stops_early(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match="parameter gpus must be one of"):
        run_notebook("06", tmp_path, gpus=["A100"])
