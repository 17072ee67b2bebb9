"""The serving run's compiled loop (kvlab.serving.compiledrun) against the Python loop it follows
(kvlab.serving.eventloop.EventLoop over kvlab.serving.scheduler.VllmScheduler, the reference): every per-request
array, the step count, busy seconds, preemptions and the time-averaged requests in system equal to the last bit on
pressured and shared-prefix streams under every scheduler knob, with and without the fast-forward, priced by the
affine model, the unit model and the roofline (dense, windowed and DeepSeek V4 layouts); and vLLM 0.33's own
decisions on the fixture streams, request for request."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from schedcheck import _config, assert_requests_match, load, trace_of, unit_steps

from kvlab.errors import ParameterError
from kvlab.serving import blockpool as bp, compiledrun
from kvlab.serving.replica import prompt_keys
from kvlab.serving.simulator import ServeConfig, deployment_config, scheduler_knobs, simulate_serving
from kvlab.serving.stepmodel import AffineStepModel
from kvlab.serving.steptime import step_time
from kvlab.serving.steptime.roofline import Roofline
from kvlab.sim.kernels import ENABLED
from kvlab.sim.traces import Trace, load_trace

pytestmark = pytest.mark.skipif(not ENABLED, reason="numba is off: the Python loop runs every case")

FIELDS = ("arrival_s", "queue_s", "ttft_s", "tpot_s", "e2e_s", "rejected", "output_tokens", "input_tokens",
          "hit_blocks", "hit_tokens", "busy_s", "request_preemptions", "prefix_hit_tokens")


def assert_same(a, b):
    for f in FIELDS:
        assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True), f
    assert a.moved_bytes == b.moved_bytes
    assert int(a.request_preemptions.sum()) == a.preemptions  # every preemption counted on its request
    assert (a.steps, a.preemptions, a.makespan_s, a.mean_in_system) == (b.steps, b.preemptions, b.makespan_s,
                                                                         b.mean_in_system)
    assert a.summary() == b.summary()


def pressured(**knobs):
    """A pool that 300 synthetic agent requests fill: requests wait, some are preempted, prefixes are shared."""
    return ServeConfig(**{**dict(replicas=1, pool_tokens=24_000, max_num_seqs=32, cache_blocks=(1_500, 0, 0)), **knobs})


SLOW_PREFILL = replace(AffineStepModel.fitted(), prefill_token_s=50e-6)
CASES = {
    "default": (pressured(), SLOW_PREFILL),
    "sync": (pressured(async_scheduling=False), SLOW_PREFILL),
    # here a step's first try preempts and schedules nothing, then waits for the step in flight and tries again:
    # its preemptions count on their requests all the same (assert_same)
    "first-chunk-admission": (pressured(reserve_full_isl=False), SLOW_PREFILL),
    "no-prefix-caching": (pressured(prefix_caching=False), SLOW_PREFILL),
    "long-prefill-threshold": (pressured(long_prefill_token_threshold=256), SLOW_PREFILL),
    "no-chunked-prefill": (pressured(chunked_prefill=False, max_num_batched_tokens=32_768), SLOW_PREFILL),
    "max-model-len": (pressured(max_model_len=6_000), SLOW_PREFILL),  # long prompts refused, outputs capped
    "tiny-pool": (ServeConfig(replicas=1, pool_tokens=16_000, max_num_seqs=64, cache_blocks=(1_000, 0, 0)),
                  AffineStepModel.fitted()),
    "open-loop": (pressured(closed_loop=False), SLOW_PREFILL),
    "unit-steps": (pressured(page_tokens=32, max_num_seqs=8), unit_steps()),
    # host tiers behind the pool (no per-block history): the pool's evictions sink to DRAM, then SSD, then out
    "dram": (pressured(cache_blocks=(1_500, 400, 0)), SLOW_PREFILL),
    "dram-ssd": (pressured(cache_blocks=(1_500, 100, 200)), SLOW_PREFILL),
    "ssd-only": (pressured(cache_blocks=(1_500, 0, 300)), SLOW_PREFILL),
    "dram-ssd-fifo-sync": (pressured(cache_blocks=(1_500, 50, 80), policy="fifo", async_scheduling=False),
                           SLOW_PREFILL),
}


@pytest.mark.parametrize("fast_forward", [True, False], ids=["fast-forward", "step-by-step"])
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_loop_gives_the_python_loops_run(name, fast_forward):
    tr = load_trace("synthetic", limit=300, seed=3)
    cfg, model = CASES[name]
    got = simulate_serving(tr, cfg, model, fast_forward=fast_forward, compiled=True)
    want = simulate_serving(tr, cfg, model, fast_forward=fast_forward, compiled=False)
    assert_same(got, want)
    assert got.summary()["completed"] > 0
    if name in ("default", "tiny-pool"):
        assert got.preemptions > 0
    if name == "max-model-len":
        assert got.rejected.any()
    if name.startswith(("dram", "ssd")):
        assert got.hit_blocks[1:].sum() > 0 and sum(got.moved_bytes.values()) > 0
        assert got.moved_bytes == want.moved_bytes


@pytest.mark.parametrize("name", ["default", "no-prefix-caching", "dram-ssd"])
def test_decode_stretches_past_the_loops_buffers_allocate_their_own(name, monkeypatch):
    """A decode stretch whose segments outgrow the loop's buffers (here every one: buffers of no room) takes its
    own, sized ones: the run is the same."""
    tr = load_trace("synthetic", limit=300, seed=3)
    cfg, model = CASES[name]
    want = simulate_serving(tr, cfg, model, compiled=True)
    monkeypatch.setattr(compiledrun, "STRETCH_ROOM", -compiledrun.FAST_FORWARD_STEPS)
    assert compiledrun.stretch_buffers(scheduler_knobs(cfg), False)[1].shape == (1,)
    assert_same(simulate_serving(tr, cfg, model, compiled=True), want)


def roofline_cases():
    tr = load_trace("synthetic", limit=200, seed=4)
    yield "qwen3-8b", tr, replace(deployment_config("qwen3-8b", "h200", tr), pool_tokens=40_000), \
        step_time("qwen3-8b", "h200", "vllm", source="roofline")
    # DeepSeek V4.1's layout: chunk FLOPs from the per-context table (compressed entries, indexer)
    yield "v41-flash", tr, replace(deployment_config("deepseek-v4.1-flash", "h200", tr, tp=4), pool_tokens=60_000), \
        step_time("deepseek-v4.1-flash", "h200", "vllm", 4, source="roofline")
    # sliding-window layers: chunk FLOPs grouped by window; weights given (no estimate for this model)
    yield "gemma-3-27b-windows", tr, pressured(), Roofline("gemma-3-27b", "h200", "vllm", weights=54_000_000_000)


@pytest.mark.parametrize("case", list(roofline_cases()), ids=lambda c: c[0])
def test_compiled_roofline_prices_every_step_as_the_python_one(case):
    _, tr, cfg, model = case
    got = simulate_serving(tr, cfg, model, compiled=True)
    want = simulate_serving(tr, cfg, model, compiled=False)
    assert_same(got, want)
    assert got.steps > 0


def test_sparse_block_ids_give_the_dense_run():
    """A Trace built by hand may carry any non-negative block ids (kvlab's loaders give dense ones): the compiled
    host tiers find a trace block's page through a key table of ids, so the run is the same, and the Python
    loop's."""
    tr = load_trace("synthetic", limit=300, seed=3)
    sparse = replace(tr, block_ids=tr.block_ids * 1_000_003 + 7)
    cfg = pressured(cache_blocks=(1_500, 100, 200))
    dense = simulate_serving(tr, cfg, SLOW_PREFILL, compiled=True)
    got = simulate_serving(sparse, cfg, SLOW_PREFILL, compiled=True)
    assert_same(got, dense)
    assert_same(got, simulate_serving(sparse, cfg, SLOW_PREFILL, compiled=False))
    assert got.hit_blocks[1:].sum() > 0


def test_uneven_blocks_compiled_unless_a_trace_block_sits_at_two_places():
    """Trace blocks of 500 tokens, KV blocks of 16: a trace block's keys fall on distinct page entries as long as
    the trace block sits at one place in every request naming it (then the compiled run is the Python loop's);
    a hand-built trace naming one at two places goes to the Python loop."""
    tr = load_trace("synthetic", limit=200, seed=3)
    tr = replace(tr, block_tokens=500)
    cfg = pressured(cache_blocks=(1_500, 100, 200))
    got = simulate_serving(tr, cfg, SLOW_PREFILL, compiled=True)
    assert_same(got, simulate_serving(tr, cfg, SLOW_PREFILL, compiled=False))
    assert got.hit_blocks[1:].sum() > 0
    off, ids = tr.block_offsets, tr.block_ids.copy()
    r = next(r for r in range(1, len(tr)) if off[r + 1] - off[r] >= 2)
    ids[off[r] + 1] = ids[off[0]]  # request 0's first trace block, one place later
    with pytest.raises(ParameterError, match="trace blocks whose KV block offsets differ"):
        simulate_serving(replace(tr, block_ids=ids), cfg, SLOW_PREFILL, compiled=True)
    assert simulate_serving(replace(tr, block_ids=ids), cfg, SLOW_PREFILL).loop.startswith("python")


@pytest.mark.parametrize("page_bytes", [None, 0], ids=["pages", "a-key-a-page"])
@pytest.mark.parametrize("layout", [(512, 16), (500, 16), (4096, 24), (8, 16)], ids=lambda x: f"tb{x[0]}-bs{x[1]}")
def test_key_table_pages_give_the_python_loops_run(layout, page_bytes, monkeypatch):
    """The compiled loop's key table files a trace block's keys on pages (blockpool.new_key_table): trace blocks
    that the block size divides or not, powers of two or not (shifts or divisions), smaller than a KV block, and
    pages of one key (KEY_PAGES_BYTES of nothing): the run is the Python loop's, whose pool files each key alone."""
    tb, bs = layout
    tr = replace(load_trace("synthetic", limit=300, seed=3), block_tokens=tb)
    if page_bytes is not None:
        monkeypatch.setattr(compiledrun, "KEY_PAGES_BYTES", page_bytes)
    cfg = pressured(page_tokens=bs)
    tab = compiledrun.key_table(tr, scheduler_knobs(cfg))
    assert tab[bp.T_P] == (1 if page_bytes == 0 else min(bp.PAGE_MAX, 1 << (-(-tb // bs) - 1).bit_length()))
    got = simulate_serving(tr, cfg, SLOW_PREFILL, compiled=True)
    assert got.loop.startswith("compiled")
    assert_same(got, simulate_serving(tr, cfg, SLOW_PREFILL, compiled=False))
    assert got.hit_tokens.sum() > 0 and np.nanmax(got.queue_s) > 0  # prefixes hit, requests waited for blocks


def test_trace_block_at_two_places_files_keys_by_token():
    """A hand-built trace naming one trace block at two places in its requests (its keys' offsets then differ
    modulo the block size) gets a key table whose pages step by one token, so no two keys share an entry: without
    host tiers the compiled loop runs it, and its run is the Python loop's."""
    tr = replace(load_trace("synthetic", limit=200, seed=3), block_tokens=500)
    off, ids = tr.block_offsets, tr.block_ids.copy()
    r = next(r for r in range(1, len(tr)) if off[r + 1] - off[r] >= 2)
    ids[off[r] + 1] = ids[off[0]]  # request 0's first trace block, one place later
    odd = replace(tr, block_ids=ids)
    cfg = pressured()
    assert compiledrun.key_table(odd, scheduler_knobs(cfg))[bp.T_STEP] == 1
    assert compiledrun.key_table(tr, scheduler_knobs(cfg))[bp.T_STEP] == 16
    got = simulate_serving(odd, cfg, SLOW_PREFILL, compiled=True)
    assert got.loop.startswith("compiled")
    assert_same(got, simulate_serving(odd, cfg, SLOW_PREFILL, compiled=False))


def test_trace_without_prefixes_hashes_output_blocks_only():
    """No prefix information: the pool still hashes output blocks (a resumed request re-hits its own)."""
    tr = load_trace("synthetic", limit=200, seed=6)
    bare = Trace("bare", tr.timestamps, tr.input_tokens, tr.output_tokens, None, None, session_ids=tr.session_ids)
    cfg = ServeConfig(replicas=1, pool_tokens=16_000, max_num_seqs=64)
    got = simulate_serving(bare, cfg, SLOW_PREFILL, compiled=True)
    want = simulate_serving(bare, cfg, SLOW_PREFILL, compiled=False)
    assert_same(got, want)
    assert got.preemptions > 0


@pytest.mark.parametrize("s", load(), ids=lambda s: s["name"])
def test_compiled_loop_agrees_with_vllm(s):
    """vLLM 0.33's own decisions on the fixture streams (tests/fixtures/vllm_scheduler.json), request for request."""
    assert_requests_match(simulate_serving(trace_of(s), _config(s["config"]), unit_steps(), compiled=True), s)


def test_what_the_compiled_loop_does_not_run_goes_to_the_python_loop():
    tr = load_trace("synthetic", limit=60, seed=3)
    for cfg, kw, why in ((replace(pressured(), replicas=2), {}, "several replicas"),
                         (replace(pressured(), cache_blocks=(1_500, 300, 0), ttl_s=5.0), {}, "host tiers"),
                         (replace(pressured(), cache_blocks=(1_500, 300, 0), admission="second"), {}, "host tiers"),
                         (replace(pressured(), cache_blocks=(1_500, 300, 0), policy="s3fifo"), {}, "host tiers"),
                         (pressured(), dict(record_steps=True), "a per-step log")):
        with pytest.raises(ParameterError, match=why):
            simulate_serving(tr, cfg, SLOW_PREFILL, compiled=True, **kw)
        simulate_serving(tr, cfg, SLOW_PREFILL, **kw)  # the default falls back


def test_exact_sum_is_math_fsum():
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 7, 100, 1000):
        for scale in (1.0, 1e20):
            xs = rng.standard_normal(n) * scale * 10.0 ** rng.integers(-20, 20, n)
            xs = np.concatenate([xs, -xs[: n // 3], [0.1] * (n % 5)])  # cancellation, repeated inexact terms
            assert compiledrun._fsum(xs, len(xs), np.empty(len(xs) + 1)) == math.fsum(xs.tolist())


@pytest.mark.parametrize("trace_block", [16, 48, 512, 4096])
@pytest.mark.parametrize("block_size", [16, 32])
def test_key_counts_equal_prompt_keys(trace_block, block_size):
    rng = np.random.default_rng(trace_block + block_size)
    inp = rng.integers(1, 20_000, 300)
    blocks = -(-inp // trace_block) - rng.integers(0, 2, 300)  # some traces stop short of the prompt
    blocks = np.maximum(blocks, 0)
    off = np.concatenate([[0], np.cumsum(blocks)])
    tr = Trace("t", np.zeros(300), inp, np.ones(300, np.int64), off, np.arange(off[-1]), block_tokens=trace_block)
    got = compiledrun.prompt_key_counts(tr, block_size, True)
    want = [len(prompt_keys(tr.block_ids[off[r]:off[r + 1]], int(inp[r]), block_size, trace_block)) for r in range(300)]
    np.testing.assert_array_equal(got, want)


def tier_keys(hring, hmeta, t):
    """Tier t's keys in the compiled host tiers, least recent first."""
    i = t - 1
    base, mask = hmeta[compiledrun.H_BASE1 + i], hmeta[compiledrun.H_MASK1 + i]
    at = range(hmeta[compiledrun.H_HEAD1 + i], hmeta[compiledrun.H_TAIL1 + i])
    return [int(hring[base + (p & mask)]) for p in at if hring[base + (p & mask)] != compiledrun.TOMB]


def tier_entry(htab, hpage, hmeta, key):
    """The compiled host tiers' entry for key (ring index << 2 | tier), -1 where it is in no tier."""
    e = compiledrun._h_find(htab, hmeta, np.int64(key), compiledrun.H_VID)
    return -1 if e < 0 else int(hpage[e])


@pytest.mark.parametrize("layout", [(4, 1), (64, 16), (40, 16)], ids=["tb4-bs1", "tb64-bs16", "tb40-bs16"])
@pytest.mark.parametrize("caps", [(3, 0), (0, 4), (2, 3), (5, 11), (40, 0)], ids=str)
def test_host_rings_keep_fifo_order_through_gaps_and_compaction(caps, layout):
    """The compiled host tiers (a ring per tier, gaps where keys left from the middle, closed when the ring fills;
    a page of entries per trace block, freed when its last key leaves) against two plain lists: the same keys in
    the same order in each tier, the same keys found, loaded and dropped, over a long random mix of placements,
    hashes (stale copies dropped) and admissions (copies taken out); every held key's entry names its ring place,
    and exactly the trace blocks with held keys have pages."""
    hcap = np.array([0, *caps], np.int64)
    tb, bs = layout
    per = -(-tb // bs)  # keys per trace block (the last may hold fewer tokens)
    htab, hring, hpage, hmeta = compiledrun.host_state(hcap, tb, bs, 40_000)
    tiers = [[], []]
    moved = dict(hd=0, ds=0, hs=0, dh=0, sh=0)
    dropped = compacted = 0
    rng = np.random.default_rng(sum(caps) + tb)

    def key(c):  # the c-th prompt key: trace block c // per, as kvlab.serving.replica.prompt_keys makes them
        return (c // per) * tb + bs - 1 + (c % per) * bs if (c % per) * bs + bs <= tb else (c // per) * tb + tb - 1

    def other():  # a key of any trace block, or an output block's (negative)
        return int(rng.integers(-5, 0)) if rng.random() < 0.1 else key(int(rng.integers(40_000)))
    fresh = iter(range(40_000))
    got = np.zeros(2, np.int64)
    for _ in range(6_000):
        held = tiers[0] + tiers[1]
        op = rng.integers(4)
        before = hmeta[compiledrun.H_TAIL1:compiledrun.H_TAIL2 + 1].copy()
        if op <= 1:  # the pool evicts a block: its key goes to DRAM (else SSD), the least recent sink or leave
            k = key(next(fresh))
            while k in held:
                k = key(next(fresh))
            compiledrun._h_place(htab, hpage, hring, hmeta, hcap, k)
            t = 0 if caps[0] else 1 if caps[1] else None
            if t is None:
                dropped += 1
            else:
                moved["hd" if t == 0 else "hs"] += 1
                tiers[t].append(k)
                while len(tiers[t]) > caps[t]:
                    v = tiers[t].pop(0)
                    if t == 0 and caps[1]:
                        moved["ds"] += 1
                        tiers[1].append(v)
                        t = 1
                    else:
                        dropped += 1
        elif op == 2:  # the pool hashes a key: a held one (or one never placed, or an output block's)
            k = int(rng.choice(held)) if held and rng.random() < 0.7 else other()
            compiledrun._h_drop(htab, hpage, hring, hmeta, k)
            for t in (0, 1):
                if k in tiers[t]:
                    tiers[t].remove(k)
        else:  # an admission takes out every held key of its prompt; the first `run` of them are loads
            keys = [int(k) for k in rng.choice(held, min(len(held), 3), replace=False)] if held else []
            keys += [other()]
            run = int(rng.integers(len(keys) + 1))
            arr = np.array(keys, np.int64)
            lead = next((i for i, k in enumerate(keys) if k not in held), len(keys))
            assert compiledrun._h_run(htab, hpage, hmeta, arr) == lead
            compiledrun._h_admit(htab, hpage, hring, hmeta, arr, run, got)
            want = [0, 0]
            for i, k in enumerate(keys):
                for t in (0, 1):
                    if k in tiers[t]:
                        tiers[t].remove(k)
                        if i < run:
                            want[t] += 1
                            moved["dh" if t == 0 else "sh"] += 1
            assert list(got) == want
        compacted += int(np.any(hmeta[compiledrun.H_TAIL1:compiledrun.H_TAIL2 + 1] < before))
        assert [tier_keys(hring, hmeta, t) for t in (1, 2)] == tiers
        assert list(hmeta[compiledrun.H_COUNT1:compiledrun.H_COUNT2 + 1]) == [len(tiers[0]), len(tiers[1])]
        for t in (0, 1):  # every held key's entry names its tier and its ring place
            for k in tiers[t]:
                v = tier_entry(htab, hpage, hmeta, k)
                assert v >= 0 and v & 3 == t + 1
                assert hring[hmeta[compiledrun.H_BASE1 + t] + (v >> 2)] == k
        pages = {k // tb for k in tiers[0] + tiers[1]}  # the trace blocks with a page: those with held keys
        assert int(np.count_nonzero(htab[1::2] >= 0)) == len(pages)
        assert all(compiledrun._h_find(htab, hmeta, np.int64(p * tb), compiledrun.H_MID) >= 0 for p in pages)
    assert compacted > 0  # the gaps filled a ring and were closed


def test_compiled_modules_name_the_sources_they_embed():
    """numba's cache checks only a kernel's own file, but a compiled caller embeds its callees: each module's EMBEDS
    names the other kernel sources with their digests, so that editing one without this file (whose cache would
    then run the old kernels) fails here."""
    import hashlib
    from pathlib import Path

    from kvlab.serving import blockpool, prefetch
    for mod in (blockpool, compiledrun):
        here = Path(mod.__file__).parent
        for name, digest in mod.EMBEDS.items():
            text = (here / name).read_bytes().replace(b"\r\n", b"\n")
            assert hashlib.sha256(text).hexdigest()[:16] == digest, \
                f"{name} changed: update {Path(mod.__file__).name}'s EMBEDS to its new digest"
    assert set(compiledrun.EMBEDS) == {"blockpool.py", "prefetch.py"} and set(blockpool.EMBEDS) == {"prefetch.py"}
    assert prefetch.prefetch(np.zeros(1), 0) is None  # plain Python: the hint does nothing


@pytest.mark.parametrize("name", ["dram", "dram-ssd", "ssd-only", "dram-ssd-fifo-sync"])
def test_host_tiers_on_a_helper_thread_give_the_same_run(name, monkeypatch):
    """From OFFLOAD_MIN requests the host tiers' placements and drops go through a log that a helper thread applies
    (the loop waits for it to drain before an admission reads the tiers): every figure stays the one-thread run's."""
    tr = load_trace("synthetic", limit=300, seed=3)
    cfg, model = CASES[name]
    want = simulate_serving(tr, cfg, model, compiled=True)
    monkeypatch.setattr(compiledrun, "OFFLOAD_MIN", 0)
    monkeypatch.setattr(compiledrun.os, "cpu_count", lambda: 2)
    started = []
    real = compiledrun._h_worker

    def worker(*a):
        started.append(True)
        return real(*a)
    monkeypatch.setattr(compiledrun, "_h_worker", worker)
    got = simulate_serving(tr, cfg, model, compiled=True)
    assert started == [True]
    assert_same(got, want)
    assert sum(got.moved_bytes.values()) > 0
