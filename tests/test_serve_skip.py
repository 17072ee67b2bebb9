"""The vLLM replica's fast-forward across block boundaries and past waiting requests that cannot be admitted
(VllmScheduler.decode_room / skip_decodes): the skipped steps leave the scheduler exactly where the step loop
leaves it (every request's counters and blocks, the pool's free queue, hashes and reference counts, compared at
every skip), so every per-request time and every figure of the run is the step loop's; on vLLM 0.33's own fixture
streams the fast run still agrees with vLLM request for request."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from schedcheck import _config, assert_requests_match, load, trace_of, unit_steps

from kvlab.serving.replica import VllmReplica
from kvlab.serving.scheduler import VllmScheduler
from kvlab.serving.simulator import ServeConfig, simulate_serving
from kvlab.serving.stepmodel import AffineStepModel
from kvlab.sim.traces import load_trace

STREAMS = load()
PER_REQUEST = ("arrival_s", "queue_s", "ttft_s", "tpot_s", "e2e_s", "rejected", "output_tokens", "request_preemptions",
               "prefix_hit_tokens", "busy_s")


def state(s: VllmScheduler) -> tuple:
    """Everything of a scheduler a later step can read: requests in queue order with every counter and block, the
    pool's reference counts, hashes, cached blocks per key (in order), the free queue (in order)."""
    p = s.pool
    req = lambda r: (r.id, r.computed, r.out, r.placeholders, r.inflight, r.stale, tuple(r.blocks), r.cached_upto,
                     r.finished, r.hit_tokens, r.preemptions)
    return ([req(r) for r in s.running], [req(r) for r in s.waiting], sorted(p.ref.items()), sorted(p.key.items()),
            sorted((k, list(v)) for k, v in p.cached.items()), sorted(p.first.items()), p.queue(), s.preemptions)


def same_state(fast: tuple, slow: tuple) -> bool:
    """A closed replica's stretch runs past arrivals, which the event loop queues after it (the step loop queued
    them on the way): the step loop's waiting queue may go on with requests that arrived and were never tried."""
    running, waiting, *pool = fast
    s_running, s_waiting, *s_pool = slow
    late = s_waiting[len(waiting):]
    return (running, waiting, pool) == (s_running, s_waiting[:len(waiting)], s_pool) and \
        all(w[1:] == (0, 0, 0, 0, 0, (), 0, False, -1, 0) for w in late)


def run_with_states(tr, cfg, model, fast: bool, at: set | None = None):
    """(result, {(replica, step index): state}): with `fast`, the state after every fast-forward, keyed by the step
    then in flight; without, the state after the step loop schedules each step in `at`."""
    states, skips = {}, []
    skip, step = VllmReplica.skip_decodes, VllmReplica.step

    def spy_skip(self, m, starts=None):
        before = (self.sched.pool.free_count(), len(self.sched.waiting))
        got = skip(self, m, starts)
        if got:
            states[(self.index, self.steps + got)] = state(self.sched)
            s = self.sched
            extra = 0 if s.k.async_scheduling else 1
            last = any(r.out + r.placeholders + extra == min(r.max_tokens, s.k.max_model_len - r.prompt)
                       for r in s.running)  # the stretch ends with a request's last token in flight
            skips.append((m, got, before[0] - s.pool.free_count(), before[1], last))
        return got

    def spy_step(self, now):
        out = step(self, now)
        if at is not None and (self.index, self.steps) in at:
            states[(self.index, self.steps)] = state(self.sched)
        return out

    closed = VllmReplica.closed

    def spy_closed(self):
        got = closed(self)
        skips.append((0, 0, 0, "closed" if got else 0, False))
        return got

    mp = pytest.MonkeyPatch()
    mp.setattr(VllmReplica, "closed", spy_closed)
    mp.setattr(VllmReplica, "skip_decodes", spy_skip)
    mp.setattr(VllmReplica, "step", spy_step)
    try:
        res = simulate_serving(tr, cfg, model, fast_forward=fast, compiled=False)  # the Python classes spied on
    finally:
        mp.undo()
    return res, states, skips


def pressured(**knobs):
    """A pool that 300 synthetic agent requests (turns of a session share their prefix) fill: requests wait, some are
    preempted, decodes cross block boundaries."""
    return ServeConfig(replicas=1, pool_tokens=24_000, max_num_seqs=32, cache_blocks=(1_500, 0, 0), **knobs)


CASES = {
    "default": pressured(),
    "sync": pressured(async_scheduling=False),
    "first-chunk-admission": pressured(reserve_full_isl=False),
    "no-prefix-caching": pressured(prefix_caching=False),
    "long-prefill-threshold": pressured(long_prefill_token_threshold=256),
    "two-replicas-prefix-router": replace(pressured(), replicas=2, router="prefix"),
    # host tiers behind the pool: evictions inside a stretch go to DRAM at each skipped step's time (a TTL reads it)
    "dram-ssd-ttl": replace(pressured(), cache_blocks=(1_500, 300, 600), ttl_s=2.0, policy="s3fifo"),
    "dram-prefix-router": replace(pressured(), replicas=2, router="prefix", cache_blocks=(1_500, 400, 0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_skipped_steps_leave_the_scheduler_as_the_step_loop_does(name):
    tr = load_trace("synthetic", limit=300, seed=3)
    model = replace(AffineStepModel.fitted(), prefill_token_s=50e-6)
    fast, states, skips = run_with_states(tr, CASES[name], model, True)
    slow, want, _ = run_with_states(tr, CASES[name], model, False, set(states))
    assert states, "nothing was fast-forwarded"
    assert set(want) == set(states)
    for key in states:
        assert same_state(states[key], want[key]), f"replica {key[0]}, step {key[1]}"
    for f in PER_REQUEST:
        assert np.array_equal(getattr(fast, f), getattr(slow, f), equal_nan=True), f
    assert fast.steps == slow.steps and fast.preemptions == slow.preemptions
    assert fast.summary() == slow.summary()
    # the stretches this change adds: blocks taken inside a stretch, and stretches with requests waiting
    assert any(took > 0 for _, _, took, w, _ in skips if w != "closed"), "no stretch crossed a block boundary"
    if name in ("default", "sync"):
        assert any(waiting > 0 for _, _, _, waiting, _ in skips if waiting != "closed"), \
            "no stretch ran with requests waiting"
        assert "closed" in [w for *_, w, _ in skips], "no stretch ran past arrivals"
        assert any(last for *_, last in skips), "no stretch ran up to a request's last token"


def test_the_stretch_stops_where_the_free_queue_runs_out():
    """A pool so small that decodes use up the free queue: stretches stop short of the step that would preempt,
    and the run still is the step loop's (preemptions included)."""
    tr = load_trace("synthetic", limit=150, seed=5)
    cfg = ServeConfig(replicas=1, pool_tokens=16_000, max_num_seqs=64, cache_blocks=(1_000, 0, 0))
    model = AffineStepModel.fitted()
    fast, states, skips = run_with_states(tr, cfg, model, True)
    slow, want, _ = run_with_states(tr, cfg, model, False, set(states))
    assert slow.preemptions > 0
    assert any(got < asked for asked, got, *_ in skips), "no stretch stopped for want of free blocks"
    assert set(states) == set(want) and all(same_state(states[k], want[k]) for k in states)
    for f in PER_REQUEST:
        assert np.array_equal(getattr(fast, f), getattr(slow, f), equal_nan=True), f


@pytest.mark.parametrize("s", STREAMS, ids=lambda s: s["name"])
def test_fast_forward_agrees_with_vllm(s):
    """vLLM 0.33's decisions on the fixture streams, with the fast-forward on (the step records, which switch it
    off, are test_vllm_scheduler's)."""
    res = simulate_serving(trace_of(s), _config(s["config"]), unit_steps(), compiled=False)
    assert_requests_match(res, s)
    logged = simulate_serving(trace_of(s), _config(s["config"]), unit_steps(), record_steps=True)
    assert (res.steps, res.busy_s.tolist()) == (logged.steps, logged.busy_s.tolist())


class PlainPool:
    """vLLM's block pool written plainly, one block at a time (the free queue one list): what BlockPool's bulk
    operations must equal."""

    def __init__(self, n):
        self.q = list(range(1, n))  # free queue, head first (block 0: the null block)
        self.ref, self.key, self.cached = {}, {}, {}
        self.evicted = []  # keys gone from the pool, in order

    def take(self, n):
        out = [self.q.pop(0) for _ in range(n)]
        for b in out:
            k = self.key.pop(b, None)
            if k is not None:
                self.cached[k].remove(b)
                if not self.cached[k]:
                    del self.cached[k]
                    self.evicted.append(k)  # its last cached block reused: what host tiers are told
            self.ref[b] = 1
        return out

    def touch(self, blocks):
        for b in blocks:
            if self.ref.get(b, 0) == 0:
                self.q.remove(b)
            self.ref[b] = self.ref.get(b, 0) + 1

    def cache_many(self, blocks, keys):
        for b, k in zip(blocks, keys):
            if b not in self.key:
                self.key[b] = k
                self.cached.setdefault(k, []).append(b)

    def hit(self, keys):
        out = []
        for k in keys:
            if k not in self.cached:
                break
            out.append(self.cached[k][0])
        return out

    def free(self, blocks):
        front = []
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                del self.ref[b]
                if b in self.key:
                    self.q.append(b)
                else:
                    front.append(b)
        self.q[:0] = front


@pytest.mark.parametrize("span", [1, 8, 1000], ids=["key-per-page", "pages-of-8", "pages-of-256"])
@pytest.mark.parametrize("seed", range(6))
def test_block_pool_bulk_operations_equal_one_block_at_a_time(seed, span, monkeypatch):
    """Requests with shared and repeated prefixes (some keys computed twice, so a key holds several blocks) take,
    hit, hash and free blocks in random order: BlockPool hands out and caches what the plain pool does, whatever
    pages its key table files keys on (`span` consecutive keys a family: each its own, 8 to a page, or a family of
    four pages of 256)."""
    from kvlab.serving import blockpool as bp
    from kvlab.serving.blockpool import T_LIVE, T_PAGES, BlockPool
    rng = np.random.default_rng(seed)
    if seed % 2:  # a key table with room for 2 pages: it grows, and pages emptied leave its directory
        monkeypatch.setattr(BlockPool, "TABLE_PAGES", 2)
    fast, plain = BlockPool(120, key_span=span), PlainPool(120)
    fast.evicted = []  # as host tiers set it
    held = []  # (blocks, keys) of live requests
    seen_more = seen_shared = False
    for _ in range(400):
        if held and rng.random() < 0.2:  # a decode grows a request by one block, hashing the one it filled
            blocks, keys = held[int(rng.integers(len(held)))]
            got = fast.take(1)
            assert got == plain.take(1)
            if len(blocks) < len(keys):
                fast.cache_many(blocks[-1:], keys[len(blocks) - 1:len(blocks)])
                plain.cache_many(blocks[-1:], keys[len(blocks) - 1:len(blocks)])
            blocks.extend(got)
        elif held and (rng.random() < 0.45 or fast.free_count() < 30):
            blocks, keys = held.pop(int(rng.integers(len(held))))
            if rng.random() < 0.7:  # hash its full blocks before it leaves, as a prefill would
                fast.cache_many(blocks, keys)
                plain.cache_many(blocks, keys)
            fast.free(blocks)
            plain.free(blocks)
        else:
            prefix = int(rng.integers(4))  # one of four shared prefixes, or its own blocks
            keys = [prefix * 1000 + i for i in range(int(rng.integers(1, 8)))] + \
                   [10_000 + int(rng.integers(10**6)) for _ in range(int(rng.integers(0, 5)))]
            if rng.random() < 0.3:  # blocks holding output tokens (negative keys)
                keys += [-1 - int(rng.integers(40)) for _ in range(int(rng.integers(1, 4)))]
            hit = fast.hit(keys).tolist()
            assert hit == plain.hit(keys)
            if rng.random() < 0.3:
                hit = hit[:len(hit) // 2]  # a hit cut short: the rest is computed again, its keys cached twice
            fast.touch(hit)
            plain.touch(hit)
            new = max(len(keys) - len(hit) - int(rng.integers(2)), 0)  # a prefill may leave its last block to a decode
            got = fast.take(new)
            assert got == plain.take(new)
            held.append((hit + got, keys))
        assert fast.free_count() == len(plain.q)
        assert fast.queue() == plain.q
        assert fast.cached == plain.cached and fast.ref == plain.ref
        assert fast.evicted == plain.evicted
        seen_more |= any(len(bs) > 1 for bs in fast.cached.values())
        seen_shared |= max(fast.ref.values(), default=0) > 1
    assert seen_more and seen_shared and plain.evicted
    assert not seed % 2 or fast.tab[T_PAGES] > 2 * 8, "the key table never grew"
    assert fast.tab[T_LIVE] == len({bp._family(fast.tab, np.int64(k))[0] for k in fast.cached}), "pages left behind"


@pytest.mark.parametrize("n", [8, 9, 33])
def test_free_queue_ring_closes_its_gaps_in_order(n):
    """Hits taking free blocks from the middle of the queue leave gaps in its ring; a ring full of them is closed
    up (every block keeping its place in the order, and learning its new one) while no take moves its head: the
    queue, later hits, the evictions and their order stay the plain pool's."""
    from kvlab.serving.blockpool import QHEAD, QMASK, QTAIL, BlockPool
    rng = np.random.default_rng(n)
    fast, plain = BlockPool(n), PlainPool(n)
    fast.evicted = []
    ring = int(fast.meta[QMASK]) + 1
    blocks = fast.take(n - 1)
    assert blocks == plain.take(n - 1)
    keys = list(range(100, 100 + n - 1))
    for p in (fast, plain):
        p.cache_many(blocks, keys)
        p.free(blocks)
    closed = 0
    for _ in range(6 * ring):
        lo = int(rng.integers(n - 1))
        hi = int(rng.integers(lo, n - 1)) + 1
        hit = fast.hit(keys[lo:hi]).tolist()  # a run from the middle (its first key's block onwards)
        assert hit == plain.hit(keys[lo:hi])
        before = int(fast.meta[QTAIL] - fast.meta[QHEAD])
        for p in (fast, plain):
            p.touch(hit)
            p.free(hit)
        closed += int(fast.meta[QTAIL] - fast.meta[QHEAD]) < before  # the ring was full and closed its gaps
        assert fast.queue() == plain.q
    assert closed > 0, "the ring never filled"
    assert fast.take(n - 1) == plain.take(n - 1)  # every block evicted, least recently freed first
    assert fast.evicted == plain.evicted and len(fast.evicted) == n - 1
    assert fast.queue() == plain.q == []


EDGE_KEYS = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**62 + 12345, 2**63 - 1, -1, -2**31, -2**31 - 1,
             -2**32, -2**63]


@pytest.mark.parametrize("numba", [True, False], ids=["compiled", "plain-python"])
def test_block_rows_keep_every_int64_key(numba, monkeypatch):
    """A block row holds its key as two int32 halves: every 64-bit key (prompt keys past 2^31, negative output
    keys, the extremes) comes back whole from the row, the key table's hit and the eviction log."""
    from kvlab.serving import blockpool
    from kvlab.serving.blockpool import BlockPool, output_key
    if not numba:  # the same kernels as plain Python (KVLAB_NUMBA=0)
        for name in ("_take", "_cache", "_free"):
            monkeypatch.setattr(blockpool, name, getattr(blockpool, name).py_func)
    keys = EDGE_KEYS + [output_key(7, 3), output_key(2**20, 2**31 - 1)]
    pool = BlockPool(len(keys) + 1)
    pool.evicted = []
    blocks = pool.take(len(keys))
    pool.cache_many(blocks, keys)
    assert pool.key == dict(zip(blocks, keys))
    assert pool.hit(keys).tolist() == blocks
    pool.free(blocks)
    pool.take(len(keys))  # every block taken anew: each key evicted, the last block freed first
    assert pool.evicted == keys[::-1]


def test_block_pool_past_32_bit_block_numbers_is_refused():
    """Block rows number blocks, and their places in the free queue's ring, in int32: a pool past that is one clear
    error, before anything is allocated."""
    from kvlab.errors import ParameterError
    from kvlab.serving.blockpool import MAX_BLOCKS, BlockPool
    for n in (MAX_BLOCKS + 1, 2**31 - 2):
        with pytest.raises(ParameterError, match="32 bits"):
            BlockPool(n)
    assert BlockPool(1000).blk.dtype == np.int32
