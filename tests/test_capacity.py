"""Capacity formulas: session cost, sessions per GPU, vLLM's block count and concurrency, weights, CLI."""
import json

import pytest

from kvlab.serving.capacity import cdiv, plan, replay_window, request_rate, session_cost, weight_bytes
from kvlab.serving.vllm_plan import vllm_plan
from kvlab.cli import main
from kvlab.errors import ParameterError
from kvlab.hardware import get_gpu, gpu_names, load_catalog

QWEN = 147_456  # 2 x 36 x 8 x 128 x 2 B (hand-computed)


def test_catalog_has_required_gpus_with_sources():
    cat = load_catalog()
    for name in ("H100", "H200", "B200", "MI300X", "L40S"):
        g = cat[name]
        assert set(g.sources) >= {"hbm_gb", "hbm_tb_s", "host_link_gb_s", "host_dram_gb", "ssd_gb_s"}
    assert cat["H100"].hbm_bytes == 80_000_000_000 and cat["H200"].hbm_gb == 141


def test_gpu_override_and_errors():
    g = get_gpu("b200", hbm_gb=180)
    assert g.hbm_bytes == 180_000_000_000 and g.sources["hbm_gb"] == "override"
    with pytest.raises(ParameterError, match="unknown GPU"):
        get_gpu("A100x")
    with pytest.raises(ParameterError, match="unknown GPU field"):
        get_gpu("H100", hbm=1)
    with pytest.raises(ParameterError, match="hbm_gb"):
        get_gpu("H100", hbm_gb=-1)
    assert "H200" in gpu_names()


def test_session_cost_dense_by_hand():
    s = session_cost("qwen3-8b", 10_000, prefix_hit_rate=0.25)
    assert s.growing_bytes == QWEN * 10_000
    assert s.prefix_hit_tokens == 2_500 and s.prefix_hit_bytes == QWEN * 2_500
    assert s.replay_bytes == 0 and s.bounded_bytes == 0
    assert s.total == QWEN * 7_500


def test_paged_prefix_hits_are_whole_blocks():
    s = session_cost("qwen3-8b", 1_000, prefix_hit_rate=0.5, scheme="vllm")  # 500 tokens -> 496 (16-token blocks)
    assert s.prefix_hit_tokens == 496 and s.prefix_hit_bytes == QWEN * 496
    assert s.growing_bytes == QWEN * 1_008  # 63 pages of 16 tokens


def test_v41_replay_window_from_spec():
    assert replay_window("deepseek-v4.1-flash") == 128
    assert replay_window("deepseek-v4-flash") == 0 and replay_window("qwen3-8b") == 0
    s = session_cost("deepseek-v4.1-flash", 1_000_000, replay_probability=0.5)
    assert s.growing_bytes == 890_000_000
    assert s.replay_tokens == 128 and s.replay_bytes == 0.5 * 128 * 890
    assert s.total == 890_000_000 + 0.5 * 128 * 890 + s.bounded_bytes
    assert s.replay_prefill_tokens == 64


def test_sessions_per_gpu_by_hand():
    c = plan("qwen3-8b", "H100", 32_768, utilization=0.9, weight_shards=1, activation_gb=4)
    usable = 72_000_000_000 - 16_400_000_000 - 4_000_000_000
    assert c.usable_kv_bytes == usable
    assert c.sessions_per_gpu == usable // (QWEN * 32_768) == 10
    c8 = plan("qwen3-8b", "H100", 32_768, weight_shards=8)
    assert c8.weight_share == 16_400_000_000 // 8


def test_replay_penalty_lowers_sessions():
    c = plan("deepseek-v4.1-flash", "H200", 4_096, weight_shards=8, replay_probability=1.0)
    assert c.sessions_per_gpu < c.sessions_without_replay


def test_weights_too_big_is_a_clear_error():
    with pytest.raises(ParameterError, match="no memory left for KV"):
        plan("deepseek-v4.1-flash", "H100", 1_000, weight_shards=1)
    with pytest.raises(ParameterError, match="prefix_hit_rate"):
        plan("qwen3-8b", "H100", 1_000, prefix_hit_rate=1.5)


def test_weight_estimates():
    assert weight_bytes("qwen3-8b").nbytes == 16_400_000_000  # 8.2B x 2 B
    w = weight_bytes("deepseek-v4.1-flash")  # FP4 experts (config expert_dtype) -> well under 552 GB
    assert 250e9 < w.nbytes < 300e9 and "expert" in w.note
    with pytest.raises(ParameterError, match="no weight estimate"):
        weight_bytes("gemma-3-27b")


def test_vllm_dense_formula_by_hand():
    """vLLM floors the block count first: num_blocks = memory // (36 layers x 16-token pages), then / cdiv(L, 16)."""
    avail = 10 * 2**30
    v = vllm_plan("qwen3-8b", avail, 40_000)
    page = 2 * 16 * 8 * 128 * 2  # per layer, K and V
    assert v.bytes_per_block == 36 * page and v.num_blocks == avail // page // 36
    assert v.blocks_per_request == cdiv(40_000, 16) == 2_500
    assert v.max_concurrency == v.num_blocks / 2_500
    assert v.held_bytes == QWEN * 40_000  # 40,000 is a multiple of 16: held while decoding = reserved
    assert v.held_concurrency == avail / (QWEN * 40_000) >= v.max_concurrency  # unfloored


def test_vllm_rounds_requests_up_to_blocks():
    v = vllm_plan("qwen3-8b", 10 * 2**30, 40_001)
    assert v.blocks_per_request == 2_501 and v.max_concurrency < v.held_concurrency


def test_vllm_reserves_windows_with_tokens_in_flight():
    """gpt-oss-20b: a 128-token window reserves cdiv(127 + 16,384, 16) + 1 = 1,033 blocks at admission, held while
    decoding only the window's 9 pages: the two answers differ by 1.5x (issue 34)."""
    v = vllm_plan("gpt-oss-20b", 40 * 2**30, 32_768)
    assert [g.blocks_per_request for g in v.groups] == [1_033, 2_048]
    assert round(v.max_concurrency, 2) == 35.45 and round(v.held_concurrency, 1) == 53.1


def test_request_rate_capped_by_sessions():
    r = request_rate(10_000, 500, sessions=4, tokens_per_s_per_session=50)
    assert r["uncapped"] == 20 and r["session_cap"] == 0.4 and r["requests_per_s"] == 0.4 and r["capped"]
    with pytest.raises(ParameterError):
        request_rate(0, 500, 4, 50)


def test_cli_sessions_json(capsys):
    assert main(["sessions", "qwen3-8b", "--gpu", "H100", "--context", "32768", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sessions_per_gpu"] == 10 and out["session_bytes"] == QWEN * 32_768
    assert out["usable_kv_bytes"] == 51_600_000_000 and out["vllm"]["num_blocks"] > 0


@pytest.mark.parametrize("argv", [
    ["sessions", "qwen3-8b", "--gpu", "Z100", "--context", "10"],
    ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "-5"],
    ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "10", "--prefix-hit-rate", "1.2"],
    ["sessions", "nomodel", "--gpu", "H100", "--context", "10"],
    ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "10", "--kv-format", "fp7"],
])
def test_cli_sessions_bad_input(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlab: error:") and "\n" not in err


def test_hardware_catalog_from_another_file(tmp_path):
    p = tmp_path / "hw.json"
    p.write_text(json.dumps({"gpus": {"X1": {"hbm_gb": 10, "hbm_tb_s": 1, "host_link_gb_s": 32, "host_dram_gb": 64,
                                             "ssd_gb_s": 5}}}))
    assert get_gpu("x1", path=p).hbm_bytes == 10**10
    p.write_text(json.dumps({"gpus": {"X1": {"hbm_gb": 10}}}))
    with pytest.raises(ParameterError, match="lacks"):
        load_catalog(p)


def test_cli_weight_override(capsys):
    assert main(["sessions", "qwen3-8b", "--gpu", "H100", "--context", "32768", "--weight-gb", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["usable_kv_bytes"] == 68_000_000_000 and out["sessions_per_gpu"] == 68_000_000_000 // (QWEN * 32_768)
