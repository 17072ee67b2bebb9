"""Tiering simulator throughput on Mooncake's conversation trace, beside a plain OrderedDict LRU.

Figures (block accesses per second, best of a few repeats, all in this one process):
  baseline      an OrderedDict LRU for one capacity, hits only (written here)
  fast          kvlab.sim.tiering.simulate_lru_fast on a cold trace: three tiers, prefix rule, bytes moved, TTFT per
                request, including every per-trace step but parsing the file (the compiled numba kernel, or the
                numpy path where numba is absent)
  numpy         the vectorized path (the fallback), cold and with its per-trace LruIndex reused (with numba the
                index's stack distances come from the compiled Fenwick kernel)
  sequential    kvlab.sim.tiering.simulate_sequential (the block-by-block reference; LRU)
  curve         kvlab.sim.stackdist: the LRU hit count at every capacity, one pass
The compiled kernels are warmed up on a small trace first, so their one-time JIT compile (or cache load) is not
timed; the warm-up time is printed. Falls back to the synthetic agent workload when the Mooncake traces are absent
(kvlab.sim.traces.TRACES_DIR; and says so).
"""
from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np


def baseline_lru(ids: list, capacity: int) -> int:
    """Hits of an LRU cache of `capacity` blocks over the access list (the peer to beat)."""
    od: OrderedDict = OrderedDict()
    hits = 0
    for x in ids:
        if x in od:
            od.move_to_end(x)
            hits += 1
        else:
            od[x] = None
            if len(od) > capacity:
                od.popitem(last=False)
    return hits


def _best(fn, repeats: int = 5) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    from kvlab.sim import kernels as lru_kernels
    from kvlab.sim.stackdist import hit_curve, stack_distances
    from kvlab.sim.tiering import (LruIndex, _simulate_lru_numpy, make_tiers, simulate_lru_fast,
                               simulate_sequential)
    from kvlab.sim.traces import have_trace, load_trace

    name = "conversation" if have_trace("conversation") else "synthetic"
    tr = load_trace(name)
    A = tr.n_accesses
    ids = tr.block_ids.tolist()
    tiers = make_tiers("qwen3-8b", 20, 100, 500)  # HBM / DRAM / SSD budgets in GB
    cap = tiers.capacity_blocks[0] + tiers.capacity_blocks[1] + tiers.capacity_blocks[2]
    print(f"trace: {tr.name}, {len(tr):,} requests, {A:,} block accesses; LRU capacity {cap:,} blocks "
          f"(qwen3-8b, 20 / 100 / 500 GB)")
    if lru_kernels.ENABLED:
        import numba
        t = time.perf_counter()
        small = tr.head(20)
        simulate_lru_fast(small, tiers)
        stack_distances(small.block_ids)
        print(f"numba {numba.__version__}: kernels compiled or loaded from cache in {time.perf_counter() - t:.2f} s "
              "on a 20-request warm-up trace (not timed below)")
    else:
        print("numba not available (or KVLAB_NUMBA=0): the fast rows use the numpy paths")
    t_base, hits = _best(lambda: baseline_lru(ids, cap))
    t_fast, r = _best(lambda: simulate_lru_fast(tr, tiers))
    t_np, rn = _best(lambda: _simulate_lru_numpy(tr, tiers), repeats=3)
    index = LruIndex.build(tr)
    t_reuse, _ = _best(lambda: _simulate_lru_numpy(tr, tiers, index))
    t_curve, (caps, curve) = _best(lambda: hit_curve(stack_distances(tr.block_ids)))
    t_seq, rs = _best(lambda: simulate_sequential(tr, tiers), repeats=1)
    assert r.summary() == rs.summary() and np.array_equal(r.ttft_s, rs.ttft_s), "fast and sequential disagree"
    assert rn.summary() == rs.summary(), "numpy and sequential simulators disagree"
    same = int(curve[min(cap, len(curve)) - 1]) == hits
    assert same, "the hit curve disagrees with the baseline LRU"
    fast = "compiled" if lru_kernels.ENABLED else "numpy"
    rows = [("baseline OrderedDict LRU (1 capacity, hits only)", t_base),
            (f"kvlab fast LRU ({fast}), full tier accounting, cold", t_fast),
            (f"kvlab numpy LRU path, cold{' (index: compiled stack dist.)' if lru_kernels.ENABLED else ''}", t_np),
            ("kvlab numpy LRU path, trace index reused", t_reuse),
            ("kvlab sequential reference (LRU)", t_seq),
            (f"kvlab LRU hit curve, all {len(caps):,} capacities", t_curve)]
    for label, t in rows:
        print(f"  {label:<56} {t * 1e3:9.1f} ms  {A / t / 1e6:7.2f} M accesses/s  {t_base / t:6.2f}x baseline")
    print(f"  fast and numpy summaries = sequential reference: True; curve at {cap:,} blocks = baseline hits "
          f"({hits:,}): {same}")
    print(f"  ratios: fast (cold) / baseline = {t_base / t_fast:.2f}x, curve time / baseline time = "
          f"{t_curve / t_base:.2f}")


if __name__ == "__main__":
    main()
