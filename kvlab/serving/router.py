"""Routing a request to one of R replicas.

  round_robin   replicas in turn
  least_loaded  fewest outstanding requests (running + waiting), lowest index on ties
  prefix        Dynamo's KV router cost (docs: Dynamo "KV Cache Routing": cost = overlap_score_weight x prefill
                blocks not cached on the worker + decode blocks active on it; lowest cost wins, temperature 0), as
                llm-d's prefix-cache scorer plus load scorer weigh the same two terms (llm-d inference-scheduler
                docs: prefix-cache-scorer, load-aware-scorer)
"""
from __future__ import annotations

ROUTERS = ("round_robin", "least_loaded", "prefix")


def route(kind: str, replicas, blocks, counter: int, overlap_weight: float = 1.0) -> int:
    """Index of the replica for a request whose prompt is `blocks` (trace block ids; empty without prefixes)."""
    if kind == "round_robin" or len(replicas) == 1:
        return counter % len(replicas)
    if kind == "least_loaded":
        return min(range(len(replicas)), key=lambda i: (replicas[i].outstanding(), i))
    best, arg = None, 0
    for i, r in enumerate(replicas):
        cached = r.cache.peek(blocks) if r.cache is not None else 0
        cost = overlap_weight * (len(blocks) - cached) + r.active_blocks()
        if best is None or cost < best:
            best, arg = cost, i
    return arg
