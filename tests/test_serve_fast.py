"""The serving simulator's fast-forward: decode-only stretches applied at once give the step-by-step loop's run,
figure for figure (zero tolerance), and the step models' vectorized decode runs equal their per-step prices."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvlab.serving.simulator import ServeConfig, deployment_config, simulate_serving
from kvlab.serving.stepmodel import AffineStepModel
from kvlab.serving.steptime import aiconfigurator, step_time
from kvlab.serving.steptime.roofline import Roofline
from kvlab.sim.traces import load_trace

PER_REQUEST = ("arrival_s", "queue_s", "ttft_s", "tpot_s", "e2e_s", "rejected", "output_tokens", "hit_blocks",
               "hit_tokens", "busy_s")
ROOFLINES = [("qwen3-8b", 1), ("deepseek-v3", 8), ("gpt-oss-20b", 1), ("jamba-v0.1", 2), ("deepseek-v4.1-flash", 4)]


def assert_same_run(a, b):
    for f in PER_REQUEST:
        assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True), f
    sa, sb = a.summary(), b.summary()
    assert sa == sb, {k: (sa[k], sb[k]) for k in sa if sa[k] != sb[k]}


class PerStepOnly:
    """A step model with step_s alone (as a third-party source would be): the fast-forward prices step by step."""

    def __init__(self, inner):
        self.inner = inner

    def step_s(self, prefill, decode):
        return self.inner.step_s(prefill, decode)


@pytest.mark.parametrize("model,tp", ROOFLINES)
def test_roofline_decode_run_equals_each_step(model, tp):
    # gpt-oss-20b (sliding windows) has no weight estimate in kvlab's table: 21 B parameters at 1 B each, assumed
    src = Roofline(model, "h200", "vllm", tp, weights=21_000_000_000) if model == "gpt-oss-20b" else \
        step_time(model, "h200", "vllm", tp, source="roofline")
    rng = np.random.default_rng(7)
    for batch, most in ((1, 40_000), (3, 40_000), (17, 40_000), (256, 1_000_000)):  # the last: a full batch, long contexts
        ctx = rng.integers(0, most, batch)
        ctx[0] = 0  # a context of 0 is priced as 1, as step_s does
        run = src.decode_run_s(ctx, 50)
        assert run.shape == (50,)
        assert [float(x) for x in run] == [src.step_s([], (ctx + j).tolist()) for j in range(50)]


@pytest.mark.skipif(not aiconfigurator.available(), reason="aiconfigurator-core is not installed (kvlab[serving])")
def test_aiconfigurator_decode_run_equals_each_step():
    src = step_time("qwen3-8b", "h200", "vllm", source="aiconfigurator")
    for ctx in ([0, 3], [4096] * 8, [1, 900, 33_000]):
        run = src.decode_run_s(ctx, 30)
        assert [float(x) for x in run] == [src.step_s([], [c + j for c in ctx]) for j in range(30)]


def test_affine_decode_run_equals_each_step():
    m = AffineStepModel(1.1e-3, 2.3e-6, 3.7e-5, 4.9e-9)
    ctx = np.array([5, 1000, 77_777])
    assert [float(x) for x in m.decode_run_s(ctx, 40)] == [m.step_s([], (ctx + j).tolist()) for j in range(40)]


def _cases():
    tr = load_trace("synthetic", limit=300, seed=3)
    yield "affine-rr", tr, deployment_config("qwen3-8b", "h200", tr, replicas=1), AffineStepModel.fitted()
    yield "roofline-least-loaded", tr, deployment_config("qwen3-8b", "h200", tr, replicas=3, router="least_loaded"), \
        step_time("qwen3-8b", "h200", "vllm", source="roofline")
    yield "v41-prefix", tr, deployment_config("deepseek-v4.1-flash", "h200", tr, tp=4, replicas=2, router="prefix"), \
        step_time("deepseek-v4.1-flash", "h200", "vllm", 4, source="roofline")
    slow_prefill = replace(AffineStepModel.fitted(), prefill_token_s=200e-6)
    yield "preempting", tr, ServeConfig(replicas=2, pool_tokens=20_000, max_num_seqs=64, router="least_loaded"), \
        slow_prefill
    yield "preempting-tiers-ttl", tr, ServeConfig(replicas=2, pool_tokens=40_000, max_num_seqs=64,
                                                  cache_blocks=(200, 400, 0), ttl_s=30.0), slow_prefill
    if aiconfigurator.available():
        yield "aiconfigurator", tr, deployment_config("qwen3-8b", "h200", tr, replicas=2), \
            step_time("qwen3-8b", "h200", "vllm", source="aiconfigurator")
    yield "per-step-source", tr, ServeConfig(replicas=2, max_num_seqs=4), PerStepOnly(AffineStepModel.fitted())
    yield ("open-loop", tr, deployment_config("qwen3-8b", "h200", tr, replicas=2, closed_loop=False),
           AffineStepModel.fitted())
    # pools so small that waiting heads cannot join: closed replicas fast-forward past arrivals (round robin), or
    # stop at them (the prefix router reads their free pages)
    yield "blocked-heads", tr, ServeConfig(replicas=2, pool_tokens=12_000, max_num_seqs=256), slow_prefill
    yield "blocked-heads-prefix", tr, replace(deployment_config("qwen3-8b", "h200", tr, replicas=2, router="prefix"),
                                              pool_tokens=12_000), step_time("qwen3-8b", "h200", "vllm",
                                                                             source="roofline")


@pytest.mark.parametrize("case", list(_cases()), ids=lambda c: c[0])
def test_fast_forward_gives_the_step_by_step_run(case):
    _, tr, cfg, model = case
    fast = simulate_serving(tr, cfg, model, {"ttft_s": 2.0, "tpot_s": 0.05})
    slow = simulate_serving(tr, cfg, model, {"ttft_s": 2.0, "tpot_s": 0.05}, fast_forward=False, compiled=False)
    assert_same_run(fast, slow)
    assert fast.summary()["completed"] > 0


def test_fast_forward_reports_preemptions_the_same():
    tr = load_trace("synthetic", limit=300, seed=3)
    cfg = ServeConfig(replicas=2, pool_tokens=20_000, max_num_seqs=64, router="least_loaded")
    m = replace(AffineStepModel.fitted(), prefill_token_s=200e-6)
    fast, slow = simulate_serving(tr, cfg, m), simulate_serving(tr, cfg, m, fast_forward=False, compiled=False)
    assert fast.preemptions == slow.preemptions > 0 and fast.steps == slow.steps
