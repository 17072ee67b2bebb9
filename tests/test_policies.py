"""Eviction policies: hand-computed streams, reference == compiled, libCacheSim as the oracle, Belady's bound."""
import numpy as np
import pytest

from kvlab.errors import ParameterError
from kvlab.sim import oracle
from kvlab.sim import policy_kernels as pk
from kvlab.sim.curves import cache_hits, capacity_for, grid, reference_hits
from kvlab.sim.policies import NEVER, ONLINE, REGISTRY, get_policy, policy_names
from kvlab.sim.stackdist import next_access
from kvlab.sim.traces import block_stream, have_trace, load_trace, synthetic_agent_trace
from test_tiering import random_trace

needs_numba = pytest.mark.skipif(not pk.ENABLED, reason="numba not available")
needs_oracle = pytest.mark.skipif(not oracle.available(), reason="libCacheSim not installed (pip install "
                                  "'kvlab[oracle]'; its wheels cover Linux x86-64 only)")
needs_traces = pytest.mark.skipif(not (have_trace("conversation") and have_trace("mooncake_synthetic")),
                                  reason="Mooncake traces not present (kvlab traces fetch, or ../shared/traces)")


def hit_vector(name, stream, cap):
    """Per-access hits of the reference class, driven as libCacheSim drives a cache (get per access)."""
    ids = np.asarray(stream, np.int64)
    fut = {}
    nxt = next_access(ids)
    c = get_policy(name)(cap, fut)
    out = []
    for i, b in enumerate(ids.tolist()):
        fut[b] = int(nxt[i])
        out.append(int(c.get(b)))
    return out


S = [1, 2, 3, 1, 4, 1, 2, 5, 1, 3, 2, 4]  # hand-worked at capacity 3 (the derivations are in the comments)
HAND = {
    # LRU: 4 evicts 2; 2 evicts 3; 5 evicts 4; 3 evicts 2; 2 evicts 5; 4 evicts 1
    "lru": [0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0],
    # FIFO: 4 evicts 1 (stored first) so 1 misses; 2 hits at the end (stored at 6, evicted only by 4)
    "fifo": [0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0],
    # LFU: 1 reaches counts 2-4; the others stay at 1 and leave in the order they reached it
    "lfu": [0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0],
    # SIEVE: at 4 the hand clears 1's bit and evicts 2; it then evicts 3, 4, 2, 5, 3 as it passes, never 1
    "sieve": [0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0],
    # ARC: 1 moves to T2; 2, 1, 3, 2, 4 come back as ghosts (p 1, 0, 1, 0, 1) and miss
    "arc": [0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0],
    # Belady: 4 evicts 3 (next use 9), 5 evicts 4 (11): 1 and 2 always hit
    "belady": [0, 0, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0],
    # with bypass 4 and 5 are not stored (used later than every resident), so 3 hits at 9 too
    "belady-bypass": [0, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 0],
}
# S3-FIFO at capacity 20 (small 2, main 18, ghost 18): 1 and 2 go to small, 1 hit twice; 3..20 fill main (small is
# full before the first eviction); 21 moves 1 to main and evicts 2 into the ghost queue; 2 returns through the
# ghost to main, evicting main's oldest (3); 3 misses, 1 hits in main. LRU would have hit 3 and missed 1.
S3 = [1, 2, 1, 1] + list(range(3, 21)) + [21, 2, 3, 1]
S3_HITS = {2, 3, 25}


@pytest.mark.parametrize("name", HAND)
def test_hand_computed_stream(name):
    assert hit_vector(name, S, 3) == HAND[name]
    if pk.ENABLED:
        tr = block_stream(S)
        assert cache_hits(tr, name, [3], engine="compiled").found[0] == sum(HAND[name])


def test_s3fifo_hand_computed():
    v = hit_vector("s3fifo", S3, 20)
    assert {i for i, h in enumerate(v) if h} == S3_HITS
    assert {i for i, h in enumerate(hit_vector("lru", S3, 20)) if h} == {2, 3, 24}
    if pk.ENABLED:
        assert cache_hits(block_stream(S3), "s3fifo", [20], engine="compiled").found[0] == 3


def test_registry_and_interface():
    assert policy_names()[:7] == ["lru", "fifo", "lfu", "sieve", "s3fifo", "arc", "belady"]
    assert "belady" not in ONLINE and "belady-bypass" not in ONLINE and "arc" in ONLINE
    assert sorted(c.kernel for c in REGISTRY.values()) == list(range(len(REGISTRY)))
    with pytest.raises(ParameterError, match="policy must be one of lru, fifo"):
        get_policy("clock")
    with pytest.raises(ParameterError, match="S3-FIFO needs a capacity of at least 20"):
        get_policy("s3fifo")(19)
    with pytest.raises(ParameterError, match="Belady is offline"):
        get_policy("belady")(5)
    with pytest.raises(ParameterError, match="capacity"):
        get_policy("lru")(0)
    c = get_policy("arc")(2)
    assert [c.get(b) for b in (1, 2, 1, 3)] == [False, False, True, False] and 1 in c and len(c) == 2
    c.remove(1)
    assert 1 not in c and len(c) == 1


@needs_numba
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", list(REGISTRY))
@pytest.mark.parametrize("admission", ["all", "second"])
def test_compiled_equals_reference(seed, name, admission):
    tr = random_trace(seed, requests=250, pool=90)
    caps = [20, 23, 41, 60, 100]
    h = cache_hits(tr, name, caps, admission, engine="compiled")
    for i, c in enumerate(caps):
        assert (h.found[i], h.prefix_blocks[i], h.prefix_tokens[i]) == reference_hits(tr, name, c, admission)
    assert h.found[-1] > 0


@needs_numba
def test_lru_stack_distances_equal_compiled_run():
    tr = synthetic_agent_trace(seed=4, sessions=12, block_tokens=128)
    caps = [1, 3, 17, 80, 400, tr.n_blocks]
    a, b = cache_hits(tr, "lru", caps), cache_hits(tr, "lru", caps, engine="compiled")
    for f in ("found", "prefix_blocks", "prefix_tokens"):
        assert np.array_equal(getattr(a, f), getattr(b, f))


@needs_oracle
@needs_numba
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("admission", ["all", "second"])
def test_every_policy_equals_libcachesim(seed, admission):
    rng = np.random.default_rng(seed)
    # a skewed stream (Zipf) and a prefix-chained one (the synthetic agent workload), several capacities each
    streams = [(rng.zipf(1.2, 6000) % 700).astype(np.int64),
               synthetic_agent_trace(seed=seed, sessions=15, block_tokens=256).block_ids]
    for ids in streams:
        tr = block_stream(ids)
        caps = [20, 57, 150, 400]
        for name in oracle.CLASSES:
            ours = cache_hits(tr, name, caps, admission, engine="compiled").found.tolist()
            assert ours == oracle.hits(name, caps, ids, admission), (name, admission)


@needs_oracle
def test_reference_answers_each_access_as_libcachesim():
    ids = (np.random.default_rng(7).zipf(1.3, 1500) % 120).astype(np.int64)
    for name in oracle.CLASSES:
        for cap in (20, 35):
            assert hit_vector(name, ids, cap) == oracle.hits_get(name, cap, ids).astype(int).tolist(), name


@needs_oracle
@needs_numba
@needs_traces
@pytest.mark.parametrize("trace", ["conversation", "mooncake_synthetic"])
def test_mooncake_streams_equal_libcachesim(trace):
    tr = load_trace(trace)
    caps = [2_000, 8_210]
    with_lcs = {}
    for name in oracle.CLASSES:
        ours = cache_hits(tr, name, caps, engine="compiled").found.tolist()
        with_lcs[name] = oracle.hits(name, caps, tr.block_ids)
        assert ours == with_lcs[name], name
    if trace == "conversation":  # measured with libCacheSim when the issue was filed: LRU at 8,210 blocks
        assert with_lcs["lru"][1] == 52_351 and round(52_351 / tr.n_accesses, 4) == 0.1815


def bound_traces():
    out = [synthetic_agent_trace(seed=1, sessions=20, block_tokens=256), random_trace(2, requests=300, pool=150)]
    if have_trace("conversation"):
        out.append(load_trace("conversation", limit=3000))
    return out


@needs_numba
@pytest.mark.parametrize("k", range(3))
def test_no_policy_beats_belady(k):
    trs = bound_traces()
    if k >= len(trs):
        pytest.skip("Mooncake traces not present")
    tr = trs[k]
    caps = grid(tr.n_blocks, 12, lo=20)
    opt = cache_hits(tr, "belady", caps)
    byp = cache_hits(tr, "belady-bypass", caps)
    assert (byp.found >= opt.found).all()
    chained = k != 1  # prefix-chained: a block's id names it and all before it (not so in the random stream)
    for name in ONLINE:
        h = cache_hits(tr, name, caps)
        assert (h.found <= opt.found).all(), name
        if chained:  # Belady keeps a prefix's earlier blocks longest: its prefix hits bound the others' too
            assert (h.prefix_tokens <= opt.prefix_tokens).all(), name
        assert (cache_hits(tr, name, caps, "second").found <= byp.found).all(), name


@needs_numba
def test_capacity_for_a_target():
    tr = synthetic_agent_trace(seed=1, sessions=30, block_tokens=128)
    for name in ("lru", "arc", "belady"):
        c = capacity_for(tr, name, 0.5)
        h = cache_hits(tr, name, [c - 1, c])
        assert h.token_hit_rate[1] >= 0.5 > h.token_hit_rate[0], name
    assert capacity_for(tr, "lru", 0.999) is None  # above the trace's own reuse
    best = cache_hits(tr, "lru", [tr.n_blocks]).block_hit_rate[0]
    assert capacity_for(tr, "lru", best, measure="block") <= tr.n_blocks
    with pytest.raises(ParameterError, match="target must lie in"):
        capacity_for(tr, "lru", 1.5)


def test_curve_arguments_refused():
    tr = synthetic_agent_trace(seed=0, sessions=3)
    with pytest.raises(ParameterError, match="capacities must be integers"):
        cache_hits(tr, "lru", [1.5])
    with pytest.raises(ParameterError, match="engine must be one of"):
        cache_hits(tr, "lru", [5], engine="gpu")
    with pytest.raises(ParameterError, match="admission must be one of"):
        cache_hits(tr, "lru", [5], admission="never")
    assert NEVER == np.iinfo(np.int64).max


@pytest.mark.parametrize("seed", [0, 1])
def test_next_uses_equal_next_access(seed):
    """The compiled one-pass next uses (Belady's preparation) equal kvlab.sim.stackdist.next_access's sorted ones,
    and its most-accesses count equals bincount's."""
    from kvlab.sim import policy_kernels as pk
    from kvlab.sim.stackdist import next_access
    ids = np.random.default_rng(seed).integers(0, 50, 2000)
    dense, n, nxt, mf = pk.stream_arrays(ids, True)
    assert np.array_equal(nxt, next_access(dense)) and mf == int(np.bincount(dense).max())
    assert pk.stream_arrays(ids[:0], True)[2].shape == (0,)


def test_kernel_ids_come_from_registration():
    """Each policy's kernel id is its place in the registry, the kernels read them from there, and one compiled
    runner exists per registered policy (made by one loop, not one copied function each)."""
    assert [c.kernel for c in REGISTRY.values()] == list(range(len(REGISTRY)))
    assert pk.KERNEL_IDS == {n: c.kernel for n, c in REGISTRY.items()}
    assert sorted(pk.RUNNERS) == sorted(pk.KERNEL_IDS.values())
    assert "globals()" not in open(pk.__file__).read()


@pytest.mark.parametrize("bad", [len(REGISTRY), -1, 99, 2.0, True, "lru"])
def test_unknown_kernel_id_is_refused(bad):
    """An id no policy has raises ParameterError (it once ran Belady, or another policy by a negative index)."""
    dense, n, nxt, mf = pk.stream_arrays(np.array([0, 1, 0, 2]), True)
    args = (np.zeros(3), dense, nxt, np.array([0, 4]), np.array([64]), 16, 1, n, mf)
    with pytest.raises(ParameterError, match="no eviction policy has kernel id"):
        pk._run_one(bad, 2, *args)
    with pytest.raises(ParameterError, match="no eviction policy has kernel id"):
        pk.run_curve(bad, [2, 3], *args)
    if pk.ENABLED and type(bad) is int:  # the compiled dispatch's last branch raises too
        S, iv, fv, heap = pk._state(1, n, mf, np.array([2]))
        fut = np.zeros(n, np.int64)
        for op in (pk.lookup_any, pk.insert_any):
            with pytest.raises(ParameterError, match="unknown eviction policy kernel id"):
                op(bad, 0, S, iv, fv, fut, n, 0)
    with pytest.raises(ParameterError, match="no eviction policy has kernel id"):
        pk.tiered([0, bad, 0], np.array([2, 2, 2]), np.zeros((3, 3)), np.ones(3, np.int64), dense, nxt,
                  np.array([0, 4]), np.array([64]), np.zeros(1), 16, 0.0, False, np.zeros(3), n, mf)
