"""Host tiers (DRAM, SSD) behind the vLLM scheduler's pool (kvlab.serving.hosttiers): no change without capacity,
more prefix hits with it, the pool's evictions found in DRAM, and tier-by-tier agreement with `kvlab simulate`
(kvlab.sim.tiering) where the two see the same block stream."""
import math

import numpy as np
import pytest

from schedcheck import _config, load, trace_of, unit_steps

import kvlab.serving.simulator as simulator
from kvlab.cli import main
from kvlab.errors import ParameterError
from kvlab.serving.hosttiers import HostTiers
from kvlab.serving.simulator import ServeConfig, simulate_serving
from kvlab.sim.tiering import Tiers, simulate_sequential
from kvlab.sim.traces import Trace

STREAMS = load()
BW = (3.35e12, 64e9, 7e9)  # read bandwidths into HBM (H100 defaults of ServeConfig)


def same_run(a, b):
    for k in ("arrival_s", "queue_s", "ttft_s", "e2e_s", "rejected", "request_preemptions", "prefix_hit_tokens",
              "hit_blocks", "hit_tokens", "busy_s"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
    assert a.steps == b.steps and a.preemptions == b.preemptions
    if a.steps_log is not None:
        assert a.steps_log == b.steps_log


@pytest.mark.parametrize("s", STREAMS, ids=lambda s: s["name"])
def test_zero_host_tiers_change_nothing(s, monkeypatch):
    """Every vLLM fixture stream with empty DRAM and SSD tiers wired in (each pool eviction, hashing and admission
    goes through them) runs step for step as without them."""
    tr, cfg = trace_of(s), _config(s["config"])
    plain = simulate_serving(tr, cfg, unit_steps(), record_steps=True)
    calls = []

    def zero(cfg, trace):
        h = HostTiers(0, 0, 1, BW, math.inf)
        orig = h.admit
        h.admit = lambda *a: calls.append(1) or orig(*a)
        return h
    monkeypatch.setattr(simulator, "host_tiers", zero)
    if not cfg.prefix_caching:
        pytest.skip("host tiers need prefix caching")
    tiered = simulate_serving(tr, cfg, unit_steps(), record_steps=True)
    assert calls, "the host tiers were never asked"
    same_run(plain, tiered)


def test_dram_zero_in_config_is_the_untiered_run():
    s = next(x for x in STREAMS if x["name"] == "shared_prefix_pressured")
    tr, cfg = trace_of(s), _config(s["config"])
    a = simulate_serving(tr, cfg, unit_steps(), record_steps=True)
    b = simulate_serving(tr, ServeConfig(**{**cfg.__dict__, "cache_blocks": (7, 0, 0)}), unit_steps(),
                         record_steps=True)
    same_run(a, b)


def shared_prefix_trace(groups=6, per_group=12, prefix=1000, suffix=200, out=40, gap=3.0, seed=0):
    """Requests of `groups` groups sharing a `prefix`-token prompt head, in random group order, 16-token trace
    blocks (one per KV block), `gap` seconds apart."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(np.repeat(np.arange(groups), per_group))
    ids, off, nxt = [], [0], groups * 1000
    for g in order:
        head = [g * 1000 + i for i in range(math.ceil(prefix / 16))]
        tail = list(range(nxt, nxt + math.ceil(suffix / 16)))
        nxt += len(tail)
        ids += head + tail
        off.append(len(ids))
    n = len(order)
    _, dense = np.unique(np.array(ids), return_inverse=True)
    return Trace("shared", np.arange(n) * gap, np.full(n, prefix + suffix), np.full(n, out), np.array(off),
                 dense.astype(np.int64), 16)


def test_dram_tier_raises_hits_and_holds_the_pools_evictions(monkeypatch):
    tr = shared_prefix_trace()
    base = dict(num_blocks=300, page_tokens=16, max_num_seqs=8, closed_loop=False, block_bytes=16 * 1000)
    seen = []
    orig = HostTiers.evicted

    def spy(self, keys):
        keys = list(keys)
        orig(self, keys)
        prompt = [k for k in keys if k >= 0]
        seen.extend(prompt)
        assert all(self.stack.where.get(k) == 1 for k in prompt), "a block the pool evicted is not in DRAM"
    monkeypatch.setattr(HostTiers, "evicted", spy)
    without = simulate_serving(tr, ServeConfig(**base), unit_steps())
    assert not seen
    tiered = simulate_serving(tr, ServeConfig(**base, cache_blocks=(0, 100_000, 0)), unit_steps(),
                              compiled=False)  # the Python HostTiers spied on
    assert seen, "the pool evicted nothing: the stream is not pressured"
    s, w = tiered.summary(), without.summary()
    assert w["dram_hit_tokens"] == 0 and s["dram_hit_tokens"] > 0
    assert s["hbm_hit_tokens"] + s["dram_hit_tokens"] > w["hbm_hit_tokens"]
    assert (tiered.prefix_hit_tokens >= 0).all() and tiered.prefix_hit_tokens.sum() > without.prefix_hit_tokens.sum()
    assert s["moved_bytes"]["hbm->dram"] > 0 and s["moved_bytes"]["dram->hbm"] == s["dram_hit_tokens"] // 16 * 16_000
    # a DRAM hit is loaded, not recomputed: fewer prefill tokens, so the run does not take more steps
    assert tiered.steps <= without.steps


@pytest.mark.parametrize("caps", [(0, 100_000, 0), (0, 40, 0), (0, 30, 60)])
def test_admission_looks_past_the_pool_hit_only_where_nothing_reads_history(monkeypatch, caps):
    """Without an admission count or a TTL, an admission looks only at the keys past its pool hit (a key the pool
    holds has no host copy): the same run, tier for tier, as the path that visits every key (forced here by a TTL
    too long to expire anything), and no pool-hit key is ever found in a host tier."""
    tr = shared_prefix_trace()
    base = dict(num_blocks=300, page_tokens=16, max_num_seqs=8, closed_loop=False, block_bytes=16 * 1000,
                cache_blocks=caps)
    orig = HostTiers.admit

    def spy(self, keys, start, run):
        assert not any(map(self.stack.where.__contains__, keys[:start].tolist())), "a pool hit in a host tier"
        return orig(self, keys, start, run)
    monkeypatch.setattr(HostTiers, "admit", spy)
    fast = simulate_serving(tr, ServeConfig(**base), unit_steps(), compiled=False)  # the Python HostTiers spied on
    full = simulate_serving(tr, ServeConfig(**base, ttl_s=1e15), unit_steps())
    assert fast.hit_blocks.tolist() == full.hit_blocks.tolist() and fast.hit_blocks[1] > 0
    assert fast.moved_bytes == full.moved_bytes and fast.steps == full.steps
    assert np.array_equal(fast.ttft_s, full.ttft_s) and np.array_equal(fast.prefix_hit_tokens, full.prefix_hit_tokens)


def one_block_trace(n=600, keys=150, seed=1, gap=10.0):
    """Requests of one full 16-token block (drawn from `keys` with a Zipf-like skew) plus one token of their own,
    one output token, `gap` seconds apart: one request at a time, so the pool's hashed blocks are an LRU cache of
    num_blocks - 2 blocks (the null block, and one block for the partial one)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, keys + 1)
    k = rng.choice(keys, n, p=p / p.sum())
    ids = np.stack([k, keys + np.arange(n)], 1).ravel()  # [2n] the shared block, then the request's own partial
    serve = Trace("one", np.arange(n) * gap, np.full(n, 17), np.ones(n, np.int64), np.arange(0, 2 * n + 1, 2),
                  ids.astype(np.int64), 16)
    sim = Trace("one", np.arange(n) * gap, np.full(n, 16), np.ones(n, np.int64), np.arange(n + 1),
                k.astype(np.int64), 16)  # the same stream of full blocks, as `kvlab simulate` sees it
    return serve, sim


@pytest.mark.parametrize("policy,admission,ttl", [("lru", "all", math.inf), ("s3fifo", "all", math.inf),
                                                  ("arc", "second", math.inf), ("lru", "all", 95.0),
                                                  ("fifo", "second", 150.0)])
def test_tiers_match_kvlab_simulate(policy, admission, ttl):
    serve, sim = one_block_trace()
    hbm, dram, ssd = 6, 24, 30  # S3-FIFO needs 20 blocks at least
    cfg = ServeConfig(num_blocks=hbm + 2, page_tokens=16, closed_loop=False, cache_blocks=(0, dram, ssd),
                      policy=policy, admission=admission, ttl_s=ttl, block_bytes=1000, read_bytes_per_s=BW)
    r = simulate_serving(serve, cfg, unit_steps())
    want = simulate_sequential(sim, Tiers(16, 1000, (hbm, dram, ssd), BW, ttl), ("lru", policy, policy),
                               admission=("all", admission, admission))
    assert r.completed.all()
    np.testing.assert_array_equal(r.prefix_hit_tokens, want.request_hit_tokens)
    np.testing.assert_array_equal(r.hit_tokens, want.hit_tokens)
    assert want.hit_tokens[1] > 0 and want.hit_tokens[2] > 0, "the stream never reaches DRAM and SSD"
    for k in ("hbm->dram", "dram->ssd", "dram->hbm", "ssd->hbm"):
        assert r.moved_bytes.get(k, 0) == want.moved_bytes.get(k, 0), k


def test_bad_host_tiers_one_clear_line(capsys):
    with pytest.raises(ParameterError, match="dram cache blocks"):
        ServeConfig(cache_blocks=(0, -1, 0))
    with pytest.raises(ParameterError, match="need prefix caching"):
        ServeConfig(cache_blocks=(0, 10, 0), prefix_caching=False)
    with pytest.raises(ParameterError, match="admission"):
        ServeConfig(admission="third")
    for argv, msg in ((["--dram-gb", "-1"], "--dram-gb"), (["--ssd-gb", "nan"], "--ssd-gb"),
                      (["--dram-gb", "8", "--no-prefix-caching"], "need prefix caching"),
                      (["--hbm-gb", "8"], "hbm-gb")):
        assert main(["serve-sim", "synthetic", "--model", "llama-3.1-8b", "--gpu", "H100", "--limit", "5",
                     "--step-time", "unit", "--no-progress", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], err


def test_a_decode_run_tells_host_tiers_its_keys_in_order_at_each_steps_time():
    """A stretch's log reaches the host tiers run by run (evicted, then hashed, ...), each at its step's time; an empty
    log (takes of never-used blocks, no hash yet) tells them nothing and still leaves the clock at the last step with
    block events."""
    from kvlab.serving.blockpool import EVICTED, HASHED_KEY
    from kvlab.serving.scheduler import SchedulerKnobs, VllmScheduler
    calls = []

    class Spy:
        now = 0.0

        def evicted(self, keys):
            calls.append(("evicted", self.now, keys))

        def hashed(self, keys):
            calls.append(("hashed", self.now, keys))

    s = VllmScheduler(SchedulerKnobs(num_blocks=8), host=HostTiers(0, 0, 1, BW, math.inf))
    s.host = Spy()
    starts = [0.0, 1.0, 2.0, 3.0]
    s._tell_host(np.zeros((3, 0), np.int64), 2, starts)
    assert calls == [] and s.host.now == 2.0
    log = np.array([[EVICTED, EVICTED, HASHED_KEY, EVICTED, HASHED_KEY],
                    [1, 1, 1, 3, 3],
                    [10, 11, 12, 13, 14]], np.int64)
    s._tell_host(log, 3, starts)
    assert calls == [("evicted", 1.0, [10, 11]), ("hashed", 1.0, [12]), ("evicted", 3.0, [13]),
                     ("hashed", 3.0, [14])] and s.host.now == 3.0
