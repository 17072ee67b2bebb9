"""Notebook 06 through papermill with small parameters; recorded results against kvlab's own numbers."""
import papermill as pm
import pytest

from kvlab.serving.capacity import plan
from kvlab.serving.vllm_plan import vllm_plan
from nbutil import run_notebook


def test_small_run_records_exact_capacity(tmp_path):
    r = run_notebook("06", tmp_path, models=["qwen3-8b", "deepseek-v4.1-flash"], gpus=["H100"], contexts=[32_768],
                     prefix_hit_rates=[0.0, 0.5], ttls_s=[60], synthetic_sessions=20, checklist_gpu="H100",
                     checklist_context=100_000, vllm_models=["qwen3-8b", "gpt-oss-20b"], vllm_tps=[1])
    assert r["sessions_per_gpu"]["qwen3-8b|H100|32768"] == plan("qwen3-8b", "H100", 32_768).sessions_per_gpu == 10
    assert r["sessions_per_gpu"]["deepseek-v4.1-flash|H100|32768"] == plan("deepseek-v4.1-flash", "H100",
                                                                           32_768).sessions_per_gpu
    assert r["prefix_sweep_sessions"]["qwen3-8b|0.5"] >= 2 * r["prefix_sweep_sessions"]["qwen3-8b|0.0"]
    usable = plan("qwen3-8b", "H100", 32_768).usable_kv_bytes  # vLLM's count in the same memory, floored
    assert r["vllm_sessions_per_gpu"]["qwen3-8b|H100|32768"] == int(vllm_plan("qwen3-8b", usable, 32_768)
                                                                     .max_concurrency) == 10
    assert r["vllm_sessions_per_gpu"]["deepseek-v4.1-flash|H100|32768"] is None  # no vLLM layout: no count
    gpt = vllm_plan("gpt-oss-20b", 40 * 2**30, 32_768)  # reserved at admission: the window + tokens in flight
    assert r["vllm_num_blocks"]["gpt-oss-20b|BF16|tp1"] == gpt.num_blocks == 109_226
    assert abs(r["held_over_reserved"]["gpt-oss-20b|BF16|tp1"] - gpt.held_concurrency / gpt.max_concurrency) < 1e-3
    assert abs(r["held_over_reserved"]["qwen3-8b|BF16|tp1"] - 1) < 1e-3
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
