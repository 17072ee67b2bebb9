"""kvlab's vLLM plan against vLLM 0.33.0's own planning code, case by case, to the block (issue 34).

tests/fixtures/vllm_capacity.json holds what vLLM's get_kv_cache_configs / get_kv_cache_capacity computed for every
case: the catalog models and generated configs (dense, GQA, MQA, MLA, sliding windows of several sizes and
patterns, Mamba-1, Mamba-2, short-conv and Gated DeltaNet hybrids) in BF16 and FP8, TP 1 / 2 / 4 and some DCP,
several KV memories and max_model_len values, prefix caching on and off, async scheduling on and off. It was
written by tests/oracles/vllm_capacity.py in vLLM's own venv (`make oracle-vllm` regenerates it and runs this
file); here kvlab.serving.vllm_plan computes the same cases and must agree exactly, with no tolerance: the block
count, the bytes of a pool block, the engine's block size, every group's kind, layers, block, page and blocks per
request, the maximum concurrency and the GPU KV cache size as vLLM logs them, and every refusal."""
import json
import re
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.errors import NoEngineLayout, ParameterError
from kvlab.models import load_model, spec_from_config
from kvlab.serving.vllm_plan import model_max_len, vllm_plan

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_capacity.json"
DATA = json.loads(FIXTURE.read_text())
CASES = DATA["cases"]
KIND = {"FullAttentionSpec": "full", "MLAAttentionSpec": "full", "SlidingWindowSpec": "sliding", "MambaSpec": "state"}


def model_of(name: str):
    generated = DATA["generated_configs"]
    return spec_from_config(generated[name], name) if name in generated else name


def kvlab_plan(case: dict):
    return vllm_plan(model_of(case["model"]), case["kv_cache_memory_bytes"], case["max_model_len"],
                     None if case["kv_cache_dtype"] == "auto" else case["kv_cache_dtype"], tp=case["tp"],
                     dcp=case["dcp"], max_num_batched_tokens=case["max_num_batched_tokens"],
                     batches_in_flight=2 if case["async_scheduling"] else 1, prefix_caching=case["prefix_caching"])


@pytest.mark.parametrize("case", [c for c in CASES if "vllm" in c], ids=lambda c: c["id"])
def test_plan_equals_vllms(case):
    v, p = case["vllm"], kvlab_plan(case)
    assert (p.num_blocks, p.bytes_per_block, p.block_tokens) == (v["num_blocks"], v["bytes_per_block"],
                                                                 v["block_tokens"])
    assert p.tokens_in_flight == v["max_in_flight_tokens"] and p.mamba_cache_mode == v["mamba_cache_mode"]
    assert [(g.kind, list(g.layers), g.block_tokens, g.page_bytes, g.window, g.blocks_per_request) for g in p.groups] \
        == [(KIND[g["kind"]], g["layers"], g["block_tokens"], g["page_bytes"], g["window"], g["blocks_per_request"])
            for g in v["groups"]]
    assert p.max_concurrency == v["max_concurrency"]  # the same float: num_blocks / blocks per request
    assert p.kv_cache_size_tokens == v["kv_cache_size_tokens"]
    assert p.logged() == v["logged"]


@pytest.mark.parametrize("case", [c for c in CASES if "refused" in c], ids=lambda c: c["id"])
def test_refused_where_vllm_refuses(case):
    with pytest.raises(ParameterError) as e:
        kvlab_plan(case)
    estimate = re.search(r"estimated maximum model length is (\d+)", case["refused"])
    if estimate:  # vLLM's binary search for the longest length that fits, kvlab's the same
        assert f"the longest max_model_len that fits is {int(estimate[1]):,}" in str(e.value)
    if "No available memory" in case["refused"]:
        assert "not even one block of every group fits" in str(e.value)
    if "greater than the derived max_model_len" in case["refused"]:
        assert "exceeds the model's" in str(e.value)


@pytest.mark.parametrize("name", sorted(DATA["derived_max_model_len"]))
def test_longest_max_model_len_is_vllms(name):
    assert model_max_len(load_model(model_of(name))) == DATA["derived_max_model_len"][name]


@pytest.mark.parametrize("name", sorted(DATA["not_expressed"]))
def test_caches_vllm_builds_its_own_way_are_refused_not_guessed(name):
    """DeepSeek V3.2 / V4 / V4.1: vLLM's specs are model-specific (not constructed by the oracle); kvlab says so."""
    with pytest.raises(NoEngineLayout):
        vllm_plan(name, 80 * 2**30, 4096)


def test_fixture_covers_every_rule():
    """The record exercises what the rules distinguish, so a rule left out fails some case above."""
    ok = [c for c in CASES if "vllm" in c]
    kinds = {KIND[g["kind"]] for c in ok for g in c["vllm"]["groups"]}
    assert kinds == {"full", "sliding", "state"}
    assert {c["vllm"]["mamba_cache_mode"] for c in ok} == {None, "align", "none"}
    assert {c["tp"] for c in ok} >= {1, 2, 4} and any(c["dcp"] > 1 for c in ok)
    assert {c["kv_cache_dtype"] for c in ok} == {"auto", "fp8"} and any(not c["async_scheduling"] for c in ok)
    assert any(len({len(g["layers"]) for g in c["vllm"]["groups"]}) > 1 for c in ok)  # a padded group
    assert {c["vllm"]["block_tokens"] for c in ok} >= {16, 64, 576}
    windows = {g["window"] for c in ok for g in c["vllm"]["groups"] if g["window"]}
    assert len(windows) >= 5
    catalog = {p.stem for p in (Path(__file__).parents[1] / "data" / "models").glob("*.json")}
    assert catalog == {c["model"] for c in ok if not c["model"].startswith("gen-")} | set(DATA["not_expressed"])


# --- the same figures through the CLI ----------------------------------------------------------------------------
QWEN_NEXT = ["sessions", "qwen3-next-80b-a3b", "--gpu", "H200", "--context", "32768", "--engine", "vllm",
             "--kv-cache-memory-bytes", str(40 * 2**30), "--json"]


def case(model, **kw):
    want = {**dict(kv_cache_dtype="auto", tp=1, dcp=1, kv_cache_memory_bytes=40 * 2**30, max_model_len=32768,
                   max_num_batched_tokens=8192, prefix_caching=True, async_scheduling=True), **kw}
    return next(c for c in CASES if c["model"] == model and all(c[k] == v for k, v in want.items()))


def test_cli_reports_vllms_figures(capsys):
    assert main(QWEN_NEXT) == 0
    out = json.loads(capsys.readouterr().out)
    v, want = out["vllm"], case("qwen3-next-80b-a3b")["vllm"]
    assert v["counted_as"] == "reserved at admission" and out["sessions_counted_as"] == "held while decoding"
    assert (v["num_blocks"], v["block_tokens"], v["max_concurrency"], v["kv_cache_size_tokens"], v["logged"]) == \
        (want["num_blocks"], want["block_tokens"], want["max_concurrency"], want["kv_cache_size_tokens"],
         want["logged"])  # 3,034 blocks of 576 tokens, 45.97
    assert [g["blocks_per_request"] for g in v["groups"]] == [3, 3, 3, 57]
    assert out["usable_kv_bytes"] == 40 * 2**30 and v["held_while_decoding"]["concurrency"] > v["max_concurrency"]


def test_cli_switches_reach_the_plan(capsys):
    assert main(QWEN_NEXT + ["--no-prefix-caching"]) == 0
    v = json.loads(capsys.readouterr().out)["vllm"]
    assert (v["mamba_cache_mode"], v["block_tokens"], v["max_concurrency"]) == (
        "none", 544, case("qwen3-next-80b-a3b", prefix_caching=False)["vllm"]["max_concurrency"])
    argv = ["sessions", "gpt-oss-20b", "--gpu", "H200", "--context", "32768", "--kv-cache-memory-bytes",
            str(40 * 2**30), "--max-num-batched-tokens", "16384", "--no-async-scheduling", "--json"]
    assert main(argv) == 0
    v = json.loads(capsys.readouterr().out)["vllm"]
    want = case("gpt-oss-20b", max_num_batched_tokens=16384, async_scheduling=False)["vllm"]
    assert (v["tokens_in_flight"], v["num_blocks"], v["max_concurrency"]) == (16384, want["num_blocks"],
                                                                              want["max_concurrency"])


def test_cli_explain_shows_each_groups_rule(capsys):
    argv = ["sessions", "gemma-3-27b", "--gpu", "H200", "--context", "32768", "--engine", "vllm",
            "--kv-cache-memory-bytes", str(40 * 2**30), "--explain"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text.count("sliding window layers") == 6 and text.count("full attention layers") == 1
    assert "cdiv(min(W - 1 + in flight = 1,023 + 16,384, 32,768), 16) + 1 = 1,089 blocks" in text
    assert "Maximum concurrency for 32,768 tokens per request: 3.82x" in text and "held while decoding" in text


@pytest.mark.parametrize("argv,words", [
    (["gpt-oss-20b", "--kv-cache-memory-bytes", "1000000"], ["vLLM refuses 1,000,000 B", "null block"]),
    (["qwen3-8b", "--max-model-len", "65536"], ["max_model_len 65,536 exceeds the model's 40,960"]),
    (["gpt-oss-20b", "--max-model-len", "100", "--kv-cache-memory-bytes", "1e10"],
     ["sliding window (128 tokens) is larger than max_model_len 100"]),
    (["deepseek-v4-flash", "--engine", "vllm"], ["not checked against it"]),
    (["qwen3-8b", "--kv-cache-memory-bytes", "0"], ["--kv-cache-memory-bytes must be an integer >= 1"]),
    (["qwen3-8b", "--max-num-batched-tokens", "1.5"], ["--max-num-batched-tokens"]),
])
def test_cli_bad_vllm_input_is_one_line(argv, words, capsys):
    assert main(["sessions", *argv[:1], "--gpu", "H200", "--context", "4096", *argv[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlab: error:") and "\n" not in err
    for w in words:
        assert w in err


def test_cli_without_vllm_options_notes_what_vllm_refuses(capsys):
    """No --engine vllm and no vLLM option: kvlab's own count stands, vLLM's refusal is noted, not an error."""
    assert main(["sessions", "qwen3-8b", "--gpu", "H200", "--context", "1000000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "exceeds the model's 40,960" in out["vllm"]["unavailable"] and out["sessions_per_gpu"] >= 0
