"""Tiering simulator throughput on Mooncake's conversation trace, beside a plain OrderedDict LRU.

Figures (block accesses per second, best of a few repeats, all in this one process):
  baseline      an OrderedDict LRU for one capacity, hits only (written here)
  fast          kvlab.tiering.simulate_lru_fast: three tiers, prefix rule, bytes moved, TTFT per request
  fast (reuse)  the same with the trace's LruIndex (stack distances) built once: each further configuration
  sequential    kvlab.tiering.simulate_sequential (the block-by-block reference; LRU)
  curve         kvlab.stackdist: the LRU hit count at every capacity, one pass
Falls back to the synthetic agent workload when ../shared/traces is absent (and says so).
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
    from kvlab.stackdist import hit_curve, stack_distances
    from kvlab.tiering import LruIndex, make_tiers, simulate_lru_fast, simulate_sequential
    from kvlab.traces import have_trace, load_trace

    name = "conversation" if have_trace("conversation") else "synthetic"
    tr = load_trace(name)
    A = tr.n_accesses
    ids = tr.block_ids.tolist()
    tiers = make_tiers("qwen3-8b", 20, 100, 500)  # HBM / DRAM / SSD budgets in GB
    cap = tiers.capacity_blocks[0] + tiers.capacity_blocks[1] + tiers.capacity_blocks[2]
    print(f"trace: {tr.name}, {len(tr):,} requests, {A:,} block accesses; LRU capacity {cap:,} blocks "
          f"(qwen3-8b, 20 / 100 / 500 GB)")
    t_base, hits = _best(lambda: baseline_lru(ids, cap))
    t_fast, r = _best(lambda: simulate_lru_fast(tr, tiers))
    index = LruIndex.build(tr)
    t_reuse, _ = _best(lambda: simulate_lru_fast(tr, tiers, index))
    t_curve, (caps, curve) = _best(lambda: hit_curve(stack_distances(tr.block_ids)))
    t_seq, rs = _best(lambda: simulate_sequential(tr, tiers), repeats=1)
    same = int(curve[min(cap, len(curve)) - 1]) == hits
    assert r.summary() == rs.summary(), "fast and sequential simulators disagree"
    rows = [("baseline OrderedDict LRU (1 capacity, hits only)", t_base),
            ("kvlab fast LRU, full tier accounting", t_fast),
            ("kvlab fast LRU, trace index reused", t_reuse),
            ("kvlab sequential reference (LRU)", t_seq),
            (f"kvlab LRU hit curve, all {len(caps):,} capacities", t_curve)]
    for label, t in rows:
        print(f"  {label:<52} {t * 1e3:9.1f} ms  {A / t / 1e6:7.2f} M accesses/s  {t_base / t:6.2f}x baseline")
    print(f"  curve at {cap:,} blocks = baseline hits ({hits:,}): {same}")
    print(f"  ratios: fast / baseline = {t_base / t_fast:.2f}x, reuse / baseline = {t_base / t_reuse:.2f}x, "
          f"curve time / baseline time = {t_curve / t_base:.2f}")


if __name__ == "__main__":
    main()
