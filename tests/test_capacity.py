"""Capacity formulas: session cost, sessions per GPU, vLLM's block count and concurrency, weights, CLI."""
import json

import pytest

from kvlab.serving.capacity import cdiv, plan, replay_window, request_rate, session_cost, weight_bytes
from kvlab.serving.vllm_plan import vllm_plan
from kvlab.cli import main
from kvlab.errors import ParameterError
from kvlab.hardware import HARDWARE_FILE, get_gpu, gpu_names, load_catalog

QWEN = 147_456  # 2 x 36 x 8 x 128 x 2 B (hand-computed)


def test_catalog_has_required_gpus_with_sources():
    """Every figure of data/hardware.json names its source; the catalog holds the GPUs users plan on."""
    cat = load_catalog()
    raw = json.loads(HARDWARE_FILE.read_text())["gpus"]
    assert set(cat) >= {"H100", "H200", "B200", "MI300X", "L40S", "A100-40GB", "A100-80GB"}
    for name, entry in raw.items():
        figures = set(entry) - {"description", "sources"}
        assert figures <= set(entry["sources"]), (name, figures - set(entry["sources"]))
        assert {"datasheet_hbm_gb", "hbm_tb_s", "host_link_gb_s", "host_dram_gb", "ssd_gb_s"} <= figures
    assert cat["H100"].hbm_bytes == 80_000_000_000 and cat["H100"].memory_from == "datasheet"
    assert cat["A100-80GB"].fp8_tflops == 0 and "e4m3" not in cat["A100-80GB"].native_types  # Ampere: no FP8


def test_memory_is_what_the_device_reports():
    """An H200 reports 150,109,880,320 B (torch.cuda.get_device_properties(0).total_memory, measured on a real H200
    into data/measurements/nvidia-h200.json); kvlab plans with that figure and keeps the datasheet's 141 GB beside."""
    measured = json.loads((HARDWARE_FILE.parent / "measurements" / "nvidia-h200.json").read_text())["device"]
    h200 = get_gpu("H200")
    assert measured["name"] == "NVIDIA H200" and h200.hbm_bytes == measured["total_memory_bytes"] == 150_109_880_320
    assert h200.memory_from == "device" and h200.datasheet_hbm_gb == 141
    assert h200.memory_label() == "150.1 GB as the device reports it (datasheet: 141 GB)"
    assert get_gpu("A100-40GB").hbm_bytes == 42_298_834_944  # CUDA deviceQuery's totalGlobalMem (its source named)
    # vLLM's rule multiplies the device's figure
    cap = plan("qwen3-8b", "H200", 32_768)
    assert cap.usable_kv_bytes == int(150_109_880_320 * 0.9) - 16_400_000_000 - 4_000_000_000


def test_gpu_override_and_errors():
    g = get_gpu("b200", hbm_gb=180)
    assert g.hbm_bytes == 180_000_000_000 and g.sources["hbm_gb"] == "override"
    o = get_gpu("H200", hbm_gb=141)
    assert o.hbm_bytes == 141_000_000_000 and o.memory_from == "override" and o.smi_memory_mib is None
    with pytest.raises(ParameterError, match="unknown GPU"):
        get_gpu("A100x")
    with pytest.raises(ParameterError, match="did you mean A100-40GB or A100-80GB"):
        get_gpu("A100")
    with pytest.raises(ParameterError, match="did you mean H200"):
        get_gpu("H20")
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


# --- GPUs as users know them: --gpu-memory, the KV caveat, the deployment and units of `kvlab sessions` -----------
def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_gpu_memory_override(capsys):
    """--gpu-memory replaces the catalog's figure in vLLM's rule (GB, or a unit as nvidia-smi writes it)."""
    base = ["sessions", "qwen3-8b", "--gpu", "H200", "--context", "32768", "--weight-shards", "1", "--json"]
    for given, total in (("141", 141_000_000_000), ("143156MiB", 143_156 * 2**20), (None, 150_109_880_320)):
        rc, out, _ = _run(capsys, *base, *(["--gpu-memory", given] if given else []))
        d = json.loads(out)
        assert rc == 0 and d["hbm_bytes"] == total
        assert d["usable_kv_bytes"] == int(total * 0.9) - 16_400_000_000 - 4_000_000_000
        assert d["gpu_memory"].endswith("(datasheet: 141 GB)")


@pytest.mark.parametrize("argv, words", [
    (["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--weight-shards", "1", "--gpu-memory", "10"],
     ["no memory left for KV", "10 GB as given", "--gpu-memory"]),
    (["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--gpu-memory", "-80"], ["--gpu-memory"]),
    (["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--gpu-memory", "0"], ["--gpu-memory", "(0,"]),
    (["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--gpu-memory", "nan"], ["--gpu-memory"]),
    (["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--gpu-memory", "1e30"], ["--gpu-memory"]),
    (["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--gpu-memory", "80 parsecs"], ["--gpu-memory"]),
    (["sessions", "qwen3-8b", "--gpu", "A100", "--context", "1000"], ["'A100'", "did you mean A100-40GB or A100-80GB"]),
    (["step-time", "llama-3.1-70b", "--gpu", "H100", "--engine", "vllm", "--decode", "8x1000", "--source", "roofline"],
     ["141.2 GB per GPU", "H100's 80 GB from the datasheet", "--tp", "--gpu-memory"]),
    (["step-time", "qwen3-8b", "--gpu", "H100", "--engine", "vllm", "--decode", "8x1000", "--gpu-memory", "8"],
     ["16.4 GB per GPU", "8 GB as given"]),
    (["simulate", "--model", "qwen3-8b", "--hbm-gb", "90", "--no-progress"], ["--hbm-gb 90", "H100's memory"]),
    (["serve-sim", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--gpu-memory", "12", "--limit", "10"],
     ["no memory left for KV", "12 GB as given"]),
])
def test_cli_gpu_memory_refusals(capsys, argv, words):
    """A --gpu-memory below the weights, a nonsense size or a GPU the catalog lacks: one line, exit 2."""
    rc, _, err = _run(capsys, *argv)
    assert rc == 2 and err.startswith("kvlab: error:") and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)


def test_every_gpu_command_takes_gpu_memory():
    """Every command with --gpu has --gpu-memory (kvlab/cli's parsers, walked)."""
    from kvlab.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    with_gpu = {name for name, p in sub.choices.items() if any("--gpu" in a.option_strings for a in p._actions)}
    assert with_gpu >= {"sessions", "step-time", "serve-sim", "plan", "simulate"}
    for name in with_gpu:
        assert any("--gpu-memory" in a.option_strings for a in sub.choices[name]._actions), name


@pytest.mark.parametrize("gpu, fmt, engine, words", [
    ("H200", "nvfp4", None, ["H200 (Hopper) has no FP4 (E2M1) arithmetic"]),
    ("A100-80GB", "fp8_e4m3", None, ["A100-80GB (Ampere) has no FP8 E4M3 arithmetic"]),
    ("H200", "int4_g32", None, ["no INT4 arithmetic"]),
    ("B200", "nvfp4", None, None),
    ("H200", "fp8_e4m3", "vllm", None),
    ("A100-40GB", None, None, None),
])
def test_kv_caveat_in_text_and_json(capsys, gpu, fmt, engine, words):
    """A KV format the GPU cannot compute natively carries one caveat line, in text and in JSON."""
    argv = ["sessions", "qwen3-8b", "--gpu", gpu, "--context", "4096"] + (["--kv-format", fmt] if fmt else []) + (
        ["--engine", engine] if engine else [])
    rc, text, _ = _run(capsys, *argv)
    rc2, js, _ = _run(capsys, *argv, "--json")
    caveat = json.loads(js)["kv_caveat"]
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("caveat:")]
    assert rc == rc2 == 0
    if words is None:
        assert caveat is None and not lines
    else:
        assert len(lines) == 1 and all(w in caveat and w in lines[0] for w in words)


def test_engine_caveat_names_what_vllm_offers(capsys):
    rc, out, _ = _run(capsys, "serve-sim", "synthetic", "--model", "qwen3-8b", "--gpu", "B200", "--kv-format", "nvfp4",
                      "--limit", "20", "--step-time", "roofline", "--json")
    d = json.loads(out)
    assert rc == 0 and d["kv_caveat"].startswith("vllm offers no nvfp4 KV cache (its KV dtypes: auto, fp8")


def test_sessions_names_its_deployment_with_units(capsys):
    """`kvlab sessions` says which deployment it picked (GPUs and why, engine rule, weights) and prints bytes in
    GB / MB; exact integers stay in --json."""
    argv = ["sessions", "deepseek-v4.1-flash", "--gpu", "H200", "--context", "1000000", "--prefix-hit-rate", "0.5"]
    rc, out, _ = _run(capsys, *argv)
    assert rc == 0
    assert "deployment: DP attention 8 = 8 GPUs (the fewest of 1, 2, 4, 8 GPUs" in out
    assert "weights: 280 GB, 35.01 GB per GPU over 8 GPU(s) (estimate:" in out
    assert "session: 890 MB growing - 445 MB prefix hits" in out
    assert "usable KV per GPU (vllm's rule): 150.1 GB x 0.9 - 35.01 GB weights - 4 GB activations = 96.09 GB" in out
    import re
    assert not re.search(r"\d{1,3}(,\d{3}){2,} B\b", out)  # no raw byte counts in the text
    d = json.loads(_run(capsys, *argv, "--json")[1])
    assert d["growing_bytes"] == 890_000_000 and d["usable_kv_bytes"] == int(150_109_880_320 * 0.9) - d[
        "weight_share_bytes"] - 4_000_000_000
    assert d["deployment"] == "DP attention 8" and d["weight_shards"] == 8
    rc, out, _ = _run(capsys, "sessions", "llama-3.1-70b", "--gpu", "H100", "--context", "100000", "--tp", "4",
                      "--engine", "vllm")
    assert "deployment: TP 4 = 4 GPUs (as given); KV counted as vllm's paging, vllm's memory rule" in out
