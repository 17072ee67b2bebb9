"""Step times (kvlab.serving.steptime): aiconfigurator's figures passed through unchanged, the roofline's KV term
moving by exactly a format's bytes, its scaling laws, the factory's choice, bad inputs and the CLI."""
from __future__ import annotations

import json

import pytest

from kvlab.cli import main
from kvlab.engines import allocate
from kvlab.errors import KvlabError, ParameterError
from kvlab.layout import Shard
from kvlab.hardware import get_gpu
from kvlab.serving.steptime import Chunk, Roofline, Step, parse_decode, parse_prefill, step_time
from kvlab.serving.steptime import aiconfigurator as aic

needs_aic = pytest.mark.skipif(not aic.available(), reason="aiconfigurator-core not installed (pip install 'kvlab[serving]')")


# --- aiconfigurator: the same numbers as its own calls ------------------------------------------------------------
@needs_aic
@pytest.mark.parametrize("kv", [None, "fp8_e4m3"])
def test_equals_aiconfigurator_calls(kv):
    from aiconfigurator_core.sdk.engine import EngineHandle
    kw = {} if kv is None else dict(kvcache_quant_mode="fp8")
    h = EngineHandle.compile("Qwen/Qwen3-8B", "h200_sxm", "vllm", tp_size=1, **kw)
    s = step_time("qwen3-8b", "h200", "vllm", kv_format=kv)
    assert s.name == "aiconfigurator"
    assert s.step_ms(Step.prefill_of(4096)) == h.predict_prefill_latency(1, 4096)
    assert s.step_ms(Step.prefill_of(1024, 8)) == h.predict_prefill_latency(8, 1024)
    assert s.step_ms(Step.prefill_of(2048, 1, cached=2048)) == h.predict_prefill_latency(1, 4096, 2048)
    assert s.step_ms(Step.decode_of(32, 4096)) == h.decode_step_latency(32, 4096, 1)
    assert s.step_ms(Step(prefill=(Chunk(2048),), decode=(4096,) * 32)) == h.mixed_step_latency(2048, 32, 2048, 4096, 0)
    t = s.time(Step.decode_of(32, 4096))
    assert t.source == "aiconfigurator" and not t.estimate and "decode_step_latency" in t.note


@needs_aic
def test_aiconfigurator_reference_figures():
    """shared/reference/serving.md: Qwen3-8B, H200, vLLM 0.24, TP 1: prefill 1 x 4,096 = 91.19 ms, decode step of
    32 at 4,096 = 9.757 ms (FP8 KV 8.585 ms)."""
    assert step_time("qwen3-8b", "H200", "vllm").step_ms(Step.prefill_of(4096)) == pytest.approx(91.19, abs=0.01)
    assert step_time("qwen3-8b", "H200", "vllm").step_ms(Step.decode_of(32, 4096)) == pytest.approx(9.757, abs=0.002)
    fp8 = step_time("qwen3-8b", "H200", "vllm", kv_format="fp8_e4m3")
    assert fp8.step_ms(Step.decode_of(32, 4096)) == pytest.approx(8.585, abs=0.002)


@needs_aic
def test_factory_falls_back_to_the_roofline():
    for args in [("deepseek-v4.1-flash", "H200", "vllm"), ("qwen3-8b", "MI300X", "vllm"),
                 ("qwen3-next-80b-a3b", "H200", "sglang"), ("deepseek-v4-flash", "H200", "vllm")]:
        assert step_time(*args).name == "roofline", args
    assert step_time("qwen3-8b", "H200", "vllm", kv_format="nvfp4").name == "roofline"  # no such KV mode there
    with pytest.raises(ParameterError, match="support matrix"):
        step_time("deepseek-v4-flash", "H200", "vllm", source="aiconfigurator")
    with pytest.raises(ParameterError, match="no model for 'qwen3-next-80b-a3b'"):
        step_time("qwen3-next-80b-a3b", "H200", "vllm", source="aiconfigurator")


@needs_aic
def test_moe_under_tp_compiles():
    """MoE models get moe_tp_size = tp (aiconfigurator refuses a TP width the experts do not match)."""
    s = step_time("deepseek-v3", "H200", "vllm", tp=8)
    assert s.name == "aiconfigurator" and s.step_ms(Step.decode_of(32, 4096)) > 0


def test_without_aiconfigurator(monkeypatch):
    monkeypatch.setattr(aic, "available", lambda: False)
    assert step_time("qwen3-8b", "H200", "vllm").name == "roofline"
    with pytest.raises(ParameterError, match="not installed"):
        step_time("qwen3-8b", "H200", "vllm", source="aiconfigurator")


# --- the roofline ------------------------------------------------------------------------------------------------
def roof(model="qwen3-8b", gpu="H200", engine="vllm", tp=1, kv=None, **kw):
    return step_time(model, gpu, engine, tp, kv, source="roofline", **kw)


@pytest.mark.parametrize("kv", ["fp8_e4m3", "nvfp4", "int4_g32"])
def test_kv_format_moves_the_kv_term_by_its_bytes(kv):
    base, other = roof(), roof(kv=kv)
    step = Step(prefill=(Chunk(512, cached=3000),), decode=(1000, 4096, 4096, 70000))
    a, b = base.time(step).parts, other.time(step).parts
    lay = {f: allocate("qwen3-8b", None, f, "vllm", shard=Shard(1)).layout for f in (None, kv)}
    want = {f: sum(lay[f].session(n).total for n in (1000, 4096, 4096, 70000, 3000)) for f in lay}
    assert a["kv_bytes"] == want[None] and b["kv_bytes"] == want[kv]
    assert b["weight_bytes"] == a["weight_bytes"] and b["flops"] == a["flops"]
    bw = get_gpu("H200").hbm_bytes_per_s * a["memory_efficiency"]
    assert b["memory_ms"] - a["memory_ms"] == pytest.approx((want[kv] - want[None]) / bw * 1e3, rel=1e-12)


def test_roofline_scaling_laws():
    r = roof()
    one, many = r.time(Step.decode_of(1, 4096)).parts, r.time(Step.decode_of(64, 4096)).parts
    assert many["weight_bytes"] == one["weight_bytes"]  # a dense model reads its weights once per step
    assert many["kv_bytes"] == 64 * one["kv_bytes"]  # the KV read is linear in the batch ...
    assert r.time(Step.decode_of(1, 8192)).parts["kv_bytes"] == 2 * one["kv_bytes"]  # ... and in the context
    # memory-bound: halving the bandwidth doubles the time above the overhead
    slow = roof(gpu=get_gpu("H200", hbm_tb_s=2.4))
    s = Step.decode_of(8, 4096)
    assert slow.step_ms(s) - slow.overhead_ms == pytest.approx(2 * (r.step_ms(s) - r.overhead_ms), rel=1e-12)
    # compute-bound prefill: FLOPs = 2 x active params x tokens + causal attention, quadratic in the chunk
    f = [r.flops(Step.prefill_of(t)) for t in (4096, 8192, 16384)]
    assert f[2] - 2 * f[1] == pytest.approx(4 * (f[1] - 2 * f[0]), rel=1e-9)
    p = r.time(Step.prefill_of(16384)).parts
    assert p["bound"] == "compute"
    fast = roof(gpu=get_gpu("H200", bf16_tflops=2 * 989))
    assert fast.time(Step.prefill_of(16384)).parts["compute_ms"] == pytest.approx(p["compute_ms"] / 2, rel=1e-12)
    # TP 2 halves the weights each GPU reads and the FLOPs it computes; KV heads split too
    r2, s = roof(tp=2), Step.decode_of(16, 4096)
    assert r2.time(s).parts["weight_bytes"] == pytest.approx(r.time(s).parts["weight_bytes"] / 2)
    assert r2.flops(s) == pytest.approx(r.flops(s) / 2)
    assert r2.kv_read_bytes(s) == r.kv_read_bytes(s) // 2


@pytest.mark.parametrize("model, tp, kv", [("qwen3-8b", 1, None), ("qwen3-8b", 2, "nvfp4"), ("qwen3-next-80b-a3b", 1, None),
                                           ("deepseek-v4-flash", 4, None), ("deepseek-v4.1-flash", 4, "fp8_e4m3")])
def test_roofline_step_s_is_its_priced_step(model, tp, kv):
    """The simulator's fast path (no Step per call) gives exactly the figure `time` prices, step after step."""
    import random
    r = Roofline(model, "H200", "vllm", tp=tp, kv_format=kv)
    rng = random.Random(7)
    for _ in range(60):
        decode = [rng.randint(0, 200_000) for _ in range(rng.randint(0, 300))]
        prefill = [(rng.randint(1, 8192), rng.choice([0, rng.randint(1, 100_000)])) for _ in range(rng.randint(0, 3))]
        if not decode and not prefill:
            continue
        step = Step(tuple(Chunk(n, c) for n, c in prefill), tuple(max(1, c) for c in decode))
        assert r.step_s(prefill, decode) == r.time(step).ms / 1e3


def test_roofline_moe_reads_the_experts_it_touches():
    r = roof("deepseek-v3")
    w = [r.weight_read_bytes(n) for n in (1, 8, 64, 4096)]
    assert w == sorted(w) and w[-1] <= r.weight_bytes and w[-1] == pytest.approx(r.weight_bytes, rel=1e-6)
    assert w[0] < 0.1 * r.weight_bytes  # one token: shared parts + 8 of 256 routed experts


@pytest.mark.parametrize("model", ["gpt-oss-20b", "gpt-oss-120b", "deepseek-v3", "qwen3-next-80b-a3b", "jamba-v0.1",
                                   "qwen3-8b", "gemma-3-27b"])
@pytest.mark.parametrize("gb", [2.0, 13.8, 60.0, 2000.0])
def test_roofline_given_weights_are_split_not_overdrawn(model, gb):
    """Weights given (--weight-gb) for any model, the catalog's estimate or not: each step reads between the
    shared part and all of them, computes positive FLOPs, and costs at least the overhead; weights smaller than the
    config's routed experts at its bits are all taken as experts, and the note says so."""
    r = Roofline(model, "H200", "vllm", weights=int(gb * 1e9))
    w = [r.weight_read_bytes(n) for n in (1, 8, 64, 4096)]
    assert 0 < w[0] and w == sorted(w) and w[-1] <= r.weight_bytes * (1 + 1e-12)
    assert 0 < r.active_params() <= r.params
    t = r.time(Step(prefill=(Chunk(512, cached=1024),), decode=(4096,) * 4))
    assert t.ms >= r.overhead_ms and t.parts["flops"] > 0 and t.parts["weight_bytes"] > 0
    assert ("taken as routed experts" in t.note) == (r.experts > 0 and r.routed_bytes == r.weight_bytes)
    if not r.experts:  # a dense model's parameters at its dtype's bytes
        assert r.params == pytest.approx(int(gb * 1e9) / 2)


@pytest.mark.parametrize("model", ["deepseek-v4.1-flash", "deepseek-v4-flash", "qwen3-next-80b-a3b", "jamba-v0.1"])
def test_roofline_covers_what_aiconfigurator_lacks(model):
    t = roof(model).time(Step(prefill=(Chunk(1024, cached=8192),), decode=(65536,) * 8))
    assert t.source == "roofline" and t.estimate and t.ms > 0 and "calibration" in t.parts


def test_roofline_states_its_assumptions():
    from kvlab.serving.steptime import roofline
    assert 0 < roofline.MEMORY_EFFICIENCY <= 1 and 0 < roofline.COMPUTE_EFFICIENCY <= 1
    assert "mean |error|" in roofline.CALIBRATION


@needs_aic
def test_roofline_calibration_error():
    """The roofline stays within 20% of aiconfigurator on its single-GPU held-out points (CALIBRATION)."""
    from kvlab.serving.steptime import calibrate
    held = {k: v for k, v in calibrate.HELD_OUT.items() if k[3] == 1 and k[1] != "B200"}
    s = calibrate.summary(calibrate.errors(held))
    assert s["mean_abs_error"] < 0.08 and s["max_abs_error"] < 0.2


# --- bad inputs ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "x", "4096x", "0", "10x0", "1e3", "-5", "4096@", "12x34x5"])
def test_bad_prefill(text):
    with pytest.raises(ParameterError, match="--prefill"):
        parse_prefill(text)


@pytest.mark.parametrize("text", ["", "32", "0x4096", "32x0", "32x4096x1", "ax4"])
def test_bad_decode(text):
    with pytest.raises(ParameterError, match="--decode"):
        parse_decode(text)


def test_parse_forms():
    assert parse_prefill("1024x8") == (Chunk(1024),) * 8
    assert parse_prefill("2048@4096") == (Chunk(2048, 4096),)
    assert parse_decode("32x4096") == (4096,) * 32


def test_bad_factory_inputs():
    with pytest.raises(ParameterError, match="unknown GPU"):
        step_time("qwen3-8b", "H900", "vllm")
    with pytest.raises(ParameterError, match="engine"):
        step_time("qwen3-8b", "H200", "tgi")
    with pytest.raises(ParameterError, match="source"):
        step_time("qwen3-8b", "H200", "vllm", source="guess")
    with pytest.raises(KvlabError, match="unknown model"):
        step_time("no-such-model", "H200", "vllm")
    with pytest.raises(ParameterError, match="empty step"):
        Step()
    with pytest.raises(ParameterError, match="no weight estimate"):
        roof("gemma-3-27b")
    with pytest.raises(ParameterError, match="bf16_tflops"):
        get_gpu("H200", bf16_tflops=0).flops_per_s("bf16")


# --- the CLI -------------------------------------------------------------------------------------------------------
def test_cli_json(capsys):
    assert main(["step-time", "deepseek-v4.1-flash", "--gpu", "h200", "--engine", "vllm", "--decode", "32x4096",
                 "--tp", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "roofline" and out["ms"] > 0 and out["estimate"] is True
    assert main(["step-time", "qwen3-8b", "--gpu", "h200", "--engine", "vllm", "--prefill", "2048",
                 "--decode", "32x4096", "--json", "--source", "roofline"]) == 0
    assert json.loads(capsys.readouterr().out)["parts"]["flops"] > 0


@needs_aic
def test_cli_aiconfigurator(capsys):
    assert main(["step-time", "qwen3-8b", "--gpu", "h200", "--engine", "vllm", "--decode", "32x4096", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "aiconfigurator" and out["ms"] == pytest.approx(9.757, abs=0.002)


@pytest.mark.parametrize("argv, words", [
    (["--gpu", "h900", "--engine", "vllm", "--decode", "1x1"], "unknown GPU"),
    (["--gpu", "h200", "--engine", "tgi", "--decode", "1x1"], "--engine"),
    (["--gpu", "h200", "--engine", "vllm", "--decode", "32"], "--decode"),
    (["--gpu", "h200", "--engine", "vllm", "--prefill", "4k"], "--prefill"),
    (["--gpu", "h200", "--engine", "vllm"], "--prefill"),
])
def test_cli_bad_inputs(capsys, argv, words):
    assert main(["step-time", "qwen3-8b", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_cli_forced_aiconfigurator_lacking_model(capsys, monkeypatch):
    assert main(["step-time", "qwen3-next-80b-a3b", "--gpu", "h200", "--engine", "vllm", "--decode", "1x10",
                 "--source", "aiconfigurator"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "aiconfigurator" in err


# --- where step times come from, said in every output ------------------------------------------------------------
def test_every_source_describes_itself():
    r = step_time("qwen3-8b", "MI300X", "vllm")  # auto: aiconfigurator has no MI300X data
    d = r.describe()
    assert d["source"] == "roofline" and d["estimate"] is True and "MI300X" in d["basis"]
    assert "fitted to aiconfigurator 0.12.0's Qwen3-8B / H200" in d["basis"]
    assert "MI300X" in d["why_not_aiconfigurator"] or "not installed" in d["why_not_aiconfigurator"]
    assert "TP communication not modelled" in roof(tp=4).describe()["basis"]
    assert "MoE: a lower bound" in roof("deepseek-v3").describe()["basis"]
    from kvlab.serving.stepmodel import AffineStepModel, describe, describe_line
    a = describe(AffineStepModel.fitted())
    assert a["source"] == "affine" and a["estimate"] and "Qwen3-8B / H200" in a["basis"]
    assert describe_line(d).startswith("roofline (an estimate: kvlab's weight, KV and FLOP counts for qwen3-8b on "
                                       "MI300X")


@needs_aic
def test_aiconfigurator_describes_its_data():
    d = step_time("llama-3.1-70b", "H100", "vllm", tp=4).describe()
    assert d["source"] == "aiconfigurator" and d["estimate"] is False and "why_not_aiconfigurator" not in d
    assert d["basis"].startswith("NVIDIA aiconfigurator-core 0.12.0's engine model over measured kernel data for "
                                 "meta-llama/Meta-Llama-3.1-70B on h100_sxm, vllm")


def test_without_aiconfigurator_says_so_once(monkeypatch, capsys):
    """A plain `pip install kvlab` (no serving extra): auto falls back to the roofline and says so once, in one
    line, however many sources and runs follow."""
    from kvlab.serving import steptime
    monkeypatch.setattr(aic, "available", lambda: False)
    monkeypatch.setattr(steptime.auto, "_told", set())
    for _ in range(2):
        assert step_time("qwen3-8b", "H200", "vllm").name == "roofline"
    for _ in range(2):
        assert main(["serve-sim", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--limit", "20"]) == 0
    err = capsys.readouterr().err
    assert err == steptime.NOT_INSTALLED + "\n"
    assert "step times fall back to kvlab's roofline" in err and "pip install 'kvlab[serving]'" in err
    assert main(["serve-sim", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--limit", "20", "--step-time",
                 "roofline"]) == 0  # asking for the roofline: nothing to say
    assert capsys.readouterr().err == ""


# --- sizes a user can type are bounded -----------------------------------------------------------------------------
def test_huge_contexts_allocate_nothing_huge():
    """A context of 2**40 tokens is priced without per-context tables (they stop at TABLE_MAX), so `kvlab step-time`
    allocates no terabytes; past 2**40 (kvlab.sim.traces.MAX_TOKENS) and past 2**20 requests a step is refused."""
    from kvlab.serving.steptime import base, roofline
    r = roof()
    huge = Step.decode_of(32, 2**40)
    t = r.time(huge)
    assert t.ms > 0 and len(r._kv_at) < roofline.TABLE_MAX
    assert t.parts["kv_bytes"] == 32 * allocate("qwen3-8b", None, None, "vllm", shard=Shard(1)).layout.session(
        2**40).total
    assert r.step_s([], [2**40] * 32) == t.ms / 1e3 and r.step_s([(1000, 2**39)], [5]) > 0
    with pytest.raises(ParameterError, match="decode context"):
        Step.decode_of(1, base.MAX_CONTEXT + 1)
    with pytest.raises(ParameterError, match="decode batch"):
        Step.decode_of(base.MAX_BATCH + 1, 10)
    with pytest.raises(ParameterError, match="cached"):
        Chunk(10, base.MAX_CONTEXT)


@pytest.mark.parametrize("arg", [["--decode", "32x1099511627777"], ["--decode", "2000000x10"],
                                 ["--prefill", "1" + "0" * 5000], ["--decode", "9" * 30 + "x4"],
                                 ["--prefill", "4096x2000000"], ["--prefill", "1099511627776@1"]])
def test_cli_refuses_sizes_past_the_bounds(capsys, arg):
    assert main(["step-time", "qwen3-8b", "--gpu", "h200", "--engine", "vllm", "--source", "roofline", *arg]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("kvlab: error: --") and len(err) < 400


def test_cli_prices_the_largest_context_it_accepts(capsys):
    assert main(["step-time", "qwen3-8b", "--gpu", "h200", "--engine", "vllm", "--source", "roofline", "--decode",
                 "32x1099511627776", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ms"] > 0 and out["step_time"]["source"] == "roofline"
