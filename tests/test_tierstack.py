"""The one tier stack (kvlab.sim.tierstack): serve-sim's prefix cache and `kvlab simulate` give the same answers,
tier by tier, on bounded HBM, for every online policy; its rules (empty tiers skipped, TTL on DRAM to SSD)."""
import math

import numpy as np
import pytest

from kvlab.errors import ParameterError
from kvlab.sim import policy_kernels as pk
from kvlab.sim.policies import ONLINE
from kvlab.sim.tiering import Tiers, simulate_compiled, simulate_sequential
from kvlab.sim.tierstack import TierStack
from test_tiering import random_trace

# bounded HBM, then each lower tier alone, both, and a TTL with and without SSD
CASES = [((3, 0, 0), math.inf), ((2, 4, 0), math.inf), ((2, 0, 5), math.inf), ((2, 3, 6), math.inf),
         ((3, 5, 0), 4.0), ((2, 3, 6), 4.0), ((20, 20, 20), 2.0)]


def serve_side(tr, caps, ttl, policy, admission="all"):
    """Per-tier prefix-hit blocks and tokens as a serve-sim replica counts them: one `access` per request."""
    st = TierStack(caps, 1000, ttl, policy, admission)
    hb = np.zeros(3, np.int64)
    ht = np.zeros(3, np.int64)
    for r in range(len(tr)):
        a0, a1 = tr.block_offsets[r], tr.block_offsets[r + 1]
        blocks = tr.block_ids[a0:a1].tolist()
        tok = [16] * len(blocks)
        if blocks:
            tok[-1] = int(tr.input_tokens[r]) - 16 * (len(blocks) - 1)
        h, t = st.access(blocks, tok, float(tr.timestamps[r]))
        hb += h
        ht += t
    return hb, ht, st


@pytest.mark.parametrize("admission", [("all", "second", "all"), "all"])
@pytest.mark.parametrize("policy", ONLINE)
@pytest.mark.parametrize("caps, ttl", CASES)
def test_serving_cache_equals_simulate_tier_by_tier(policy, caps, ttl, admission):
    """Equal answers; and per-block history (access counts, last uses) is kept only where a rule reads it: a
    long serving run sees hundreds of millions of distinct blocks."""
    if policy == "s3fifo" and min(c for c in caps if c) < 20:
        caps = tuple(c * 10 for c in caps)  # S3-FIFO's smallest capacity
    for seed in range(2):
        tr = random_trace(seed, requests=200, pool=80)
        t = Tiers(16, 1000, caps, (1e12, 1e9, 1e8), ttl, 1e4)
        ref = simulate_sequential(tr, t, policy, admission=admission)
        hb, ht, st = serve_side(tr, caps, ttl, policy, admission)
        assert bool(st.count) == (admission != "all" and caps[1] > 0) and bool(st.last) == math.isfinite(ttl)
        assert hb.tolist() == ref.hit_blocks.tolist() and ht.tolist() == ref.hit_tokens.tolist()
        assert st.evicted == ref.evicted_blocks and st.declined == ref.declined_blocks
        for k in ("dram->hbm", "ssd->hbm"):
            assert st.moved.get(k, 0) == ref.moved_bytes.get(k, 0)
        if pk.ENABLED:
            comp = simulate_compiled(tr, t, policy, admission=admission)
            assert comp.hit_blocks.tolist() == hb.tolist() and comp.hit_tokens.tolist() == ht.tolist()


def test_empty_dram_sends_hbm_victims_to_ssd():
    """A tier of 0 blocks is absent: HBM's victim lands on SSD (the old serving cache dropped it)."""
    st = TierStack((1, 0, 4), 10)
    st.access([1], [16], 0.0)
    st.access([2], [16], 1.0)
    assert st.where == {2: 0, 1: 2} and st.moved["hbm->ssd"] == 10
    hits, _ = st.access([1], [16], 2.0)
    assert hits.tolist() == [0, 0, 1]


def test_ttl_sinks_dram_to_ssd_and_ssd_keeps_no_ttl():
    st = TierStack((1, 2, 4), 10, ttl_s=5.0)
    st.access([1], [16], 0.0)
    st.access([2], [16], 1.0)  # 1 demoted to DRAM
    assert st.where[1] == 1
    st.access([3], [16], 10.0)  # 1 idle 10 s > 5 s: to SSD; 2, demoted from HBM idle 9 s, expires on arrival
    assert st.where[1] == 2 and st.where[2] == 2 and st.moved["dram->ssd"] == 20
    st.access([4], [16], 11.0)  # 3, idle 1 s, is demoted to DRAM and stays
    assert st.where[3] == 1
    hits, _ = st.access([1], [16], 100.0)  # SSD keeps it however long it waited
    assert hits.tolist() == [0, 0, 1]


def test_serving_refuses_offline_policies():
    with pytest.raises(ParameterError, match="next use"):
        TierStack((2, 2, 0), 10, policy="belady")
    with pytest.raises(ParameterError, match="hbm tier: S3-FIFO needs a capacity of at least 20"):
        TierStack((2, 2, 0), 10, policy="s3fifo")


@pytest.mark.parametrize("policy", ONLINE)
@pytest.mark.parametrize("caps", [(0, 30, 0), (0, 30, 40), (0, 0, 40), (0, 25, 25)])
@pytest.mark.parametrize("ttl", [math.inf, 30.0])
def test_place_many_equals_place_one_at_a_time(policy, caps, ttl):
    """Host tiers place a pool's evicted blocks in bulk (TierStack.place_many, Policy.insert_run): the same tiers,
    victims, counters as placing them one by one, including runs longer than a tier."""
    rng = np.random.default_rng(7)
    bulk, one = (TierStack(caps, 10, ttl, policy=policy, hbm_external=True) for _ in range(2))
    for step in range(120):
        free = np.setdiff1d(np.arange(400), list(bulk.where))
        keys = rng.choice(free, int(rng.integers(0, 60)), replace=False).tolist()
        for st in (bulk, one):
            st.expire(float(step))
            st.take_absent(keys, float(step - 40 * (step % 3 == 0)))  # some idle past the TTL
        bulk.place_many(keys, 1, 0, float(step))
        for k in keys:
            one.place(k, 1, 0, float(step))
        assert bulk.where == one.where
        assert (bulk.moved, bulk.evicted, bulk.declined) == (one.moved, one.evicted, one.declined)
    assert bulk.evicted > 0 and len(bulk.where) == sum(caps)
