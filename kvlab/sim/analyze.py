"""The offline prefix-cache analyzer: what a request trace offers a KV cache, with no GPU.

From a trace with prefix information (block hashes that name a block and everything before it):
  counts        requests, prompt tokens, block accesses, unique blocks
  sharing       per prefix depth d (blocks): requests reaching it, distinct d-block prefixes, requests whose
                d-block prefix another request shares, and whose prefix an earlier request already had
  reuse         LRU stack distances (distinct blocks between two uses of a block) and reuse times
  curves        hit rate against capacity, in blocks, tokens and - for a model - bytes (kvlab.engines'
                bytes per token), for every policy and Belady's bound, at `points` capacities
  targets       the capacity each policy needs to reach a target hit rate
  definitions   the cache-ratio definitions one can read into a paper's "cache ratio", each computed exactly
                (Mooncake, FAST'25, Table 2 reports 40% / 59% / 66% for its conversation / tool&agent /
                synthetic traces; users report the figures cannot be reproduced - the table shows which
                definition gives which number)
Hit rates are prefix hits (an engine reuses a request's leading run of cached blocks) weighted by tokens unless
named otherwise; "block" rates count every cached block found, as libCacheSim does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..checks import need_choice, need_int, need_number
from ..errors import ParameterError
from .curves import MEASURES, cache_hits, capacity_for, grid
from .policies import get_policy, policy_names
from .stackdist import LruIndex
from .tiering import block_bytes, simulate_lru_fast, Tiers
from .traces import Trace

# Mooncake (FAST'25) Table 2 "cache ratio" of each released trace (the paper's PDF in kvcache-ai/Mooncake,
# FAST25-release/Mooncake-FAST25.pdf), keyed by the published file name
PAPER_CACHE_RATIO = {"conversation_trace.jsonl": 0.40, "toolagent_trace.jsonl": 0.59, "synthetic_trace.jsonl": 0.66}
SHOW_DEPTHS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # prefix depths (blocks) shown in the text report


@dataclass
class Analysis:
    """Everything `analyze` finds in one trace (arrays are per capacity or per depth)."""

    trace: str  # trace name
    model: str | None  # model whose bytes per token price the capacities (None: blocks and tokens only)
    block_tokens: int  # tokens per hashed block
    block_bytes: int | None  # bytes of one block for the model
    counts: dict  # requests, prompt tokens, block accesses, unique blocks
    sharing: dict  # per depth: requests, distinct prefixes, shared, seen before
    reuse: dict  # stack-distance and reuse-time distribution
    ceiling: dict  # hit rates with every block cached
    curves: dict = field(default_factory=dict)  # policy -> capacity_blocks, token_hit_rate, block_hit_rate
    targets: list = field(default_factory=list)  # rows: target, policy, capacity_blocks (None: unreachable)
    definitions: list = field(default_factory=list)  # cache-ratio definitions and their values
    paper_cache_ratio: float | None = None  # the paper's figure for this trace file, where it gives one

    def to_dict(self) -> dict:
        def clean(x):
            if isinstance(x, np.ndarray):
                return [clean(v) for v in x.tolist()]
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return [clean(v) for v in x]
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, np.generic):
                return clean(x.item())
            return x
        return clean(dict(trace=self.trace, model=self.model, block_tokens=self.block_tokens,
                          block_bytes=self.block_bytes, counts=self.counts, sharing=self.sharing, reuse=self.reuse,
                          ceiling=self.ceiling, curves=self.curves, targets=self.targets,
                          definitions=self.definitions, paper_cache_ratio=self.paper_cache_ratio))


def _positions(trace: Trace) -> np.ndarray:
    """[A] position of each access within its request (0-based)."""
    off = trace.block_offsets
    return np.arange(trace.n_accesses) - np.repeat(off[:-1], np.diff(off))


def prefix_sharing(trace: Trace) -> dict:
    """Per depth d = 1..max blocks: requests with at least d blocks, distinct d-block prefixes among them, requests
    whose d-block prefix at least one other request has, and requests whose d-block prefix an earlier request had.
    Prefixes are compared as whole block sequences (not trusting a hash to name its prefix)."""
    pos = _positions(trace)
    req = trace.request_of_access
    ids = trace.block_ids
    order = np.argsort(pos, kind="stable")  # accesses grouped by depth, requests in order within each depth
    bounds = np.searchsorted(pos[order], np.arange(int(pos.max()) + 2 if len(pos) else 1))
    pid = np.zeros(len(trace), np.int64)  # each request's prefix id at the current depth
    rows = dict(depth=[], requests=[], distinct=[], shared=[], seen_before=[])
    for d in range(len(bounds) - 1):
        a = order[bounds[d]:bounds[d + 1]]  # accesses at position d
        if not len(a):
            break
        r = req[a]
        if (int(pid.max(initial=0)) + 1) * (trace.n_blocks + 1) < 2**62:
            key = pid[r] * (trace.n_blocks + 1) + ids[a]  # (prefix so far, this block) as one integer
        else:  # pragma: no cover - beyond 2**62 pairs: number them instead
            key = np.unique(np.stack([pid[r], ids[a]]), axis=1, return_inverse=True)[1].reshape(-1)
        uniq, first, inv, cnt = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        inv = inv.reshape(-1)
        pid[r] = inv
        rows["depth"].append(d + 1)
        rows["requests"].append(len(a))
        rows["distinct"].append(len(uniq))
        rows["shared"].append(int(np.count_nonzero(cnt[inv] > 1)))
        rows["seen_before"].append(len(a) - len(uniq))  # all but the first request with each prefix
    return {k: np.array(v, np.int64) for k, v in rows.items()}


def reuse_distribution(trace: Trace, ix: LruIndex | None = None) -> dict:
    """LRU stack distances (blocks) of the reuses, as log2 bins and percentiles, the cold (first) accesses, and
    the reuse times (seconds between two accesses of a block)."""
    ix = LruIndex.build(trace) if ix is None else ix
    d = ix.dist[ix.dist >= 0]
    t = trace.timestamps[ix.req]
    reuse_t = (t - t[np.maximum(ix.prev, 0)])[ix.prev >= 0]
    edges = np.concatenate(([0], 2 ** np.arange(0, max(int(d.max(initial=0)), 1).bit_length() + 1)))
    hist = np.histogram(d, bins=edges)[0] if len(d) else np.zeros(len(edges) - 1, np.int64)
    q = [50, 90, 99]
    return dict(cold_accesses=int(np.count_nonzero(ix.dist < 0)), reuses=int(len(d)),
                distance_bins_lo=edges[:-1].astype(np.int64), distance_counts=hist.astype(np.int64),
                distance_percentiles={str(p): float(np.percentile(d, p)) if len(d) else None for p in q},
                reuse_time_percentiles_s={str(p): float(np.percentile(reuse_t, p)) if len(d) else None for p in q})


def cache_ratio_definitions(trace: Trace, ix: LruIndex | None = None) -> list[dict]:
    """Every reading of "cache ratio" (unlimited capacity) computed exactly on the trace: (name, definition,
    value). The released Mooncake files are cut out of longer traffic, so "warm" variants let the first half of
    the requests fill the cache without being counted."""
    ix = LruIndex.build(trace) if ix is None else ix
    B = trace.block_tokens
    R = len(trace)
    n = np.diff(trace.block_offsets)
    inp = trace.input_tokens
    r = simulate_lru_fast(trace, Tiers(B, 1, (max(trace.n_blocks, 1), 0, 0), (1.0, 1.0, 1.0)))
    ht = r.request_hit_tokens  # [R] prefix-hit tokens per request
    hit = (ix.prefix_dist >= 0)  # [A] prefix hit with every block cached
    hb = np.bincount(ix.req[hit], minlength=R)
    full = inp // B  # full blocks per request
    hit_full = np.bincount(ix.req[hit & (ix.tok == B)], minlength=R)
    h = R // 2
    a0 = int(trace.block_offsets[h])
    pos = inp > 0
    rows = [
        ("block_reuse", "blocks seen before (any earlier access, no prefix rule) / block accesses",
         float(np.mean(ix.prev >= 0)) if len(hit) else 0.0),
        ("prefix_blocks", "prefix-hit blocks / block accesses", float(hit.mean()) if len(hit) else 0.0),
        ("prefix_tokens", "prefix-hit tokens / prompt tokens (a partial last block counts its own tokens)",
         float(ht.sum() / max(inp.sum(), 1))),
        ("prefix_blocks_x_block_tokens", f"prefix-hit blocks x {B} / prompt tokens", float(hb.sum() * B / max(inp.sum(), 1))),
        ("full_blocks", "prefix-hit full blocks / full blocks (partial last blocks left out of both)",
         float(hit_full.sum() / max(full.sum(), 1))),
        ("request_mean_tokens", "mean over requests of prefix-hit tokens / prompt tokens",
         float(np.mean(ht[pos] / inp[pos])) if pos.any() else 0.0),
        ("request_mean_blocks", "mean over requests of prefix-hit blocks / blocks",
         float(np.mean(hb[n > 0] / n[n > 0])) if (n > 0).any() else 0.0),
        ("warm_prefix_tokens", "prefix_tokens over the second half of the requests (first half warms the cache)",
         float(ht[h:].sum() / max(inp[h:].sum(), 1))),
        ("warm_prefix_blocks", "prefix_blocks over the second half of the requests",
         float(hit[a0:].mean()) if len(hit) > a0 else 0.0),
        ("warm_request_mean_tokens", "request_mean_tokens over the second half of the requests",
         float(np.mean(ht[h:][pos[h:]] / inp[h:][pos[h:]])) if pos[h:].any() else 0.0),
    ]
    return [dict(name=a, definition=b, value=c) for a, b, c in rows]


def analyze(trace: Trace, model: str | None = None, policies=None, points: int = 100, targets=None,
            admission: str = "all", kv_format=None, scheme: str = "storage", target_shares=None) -> Analysis:
    """The whole analysis of one trace (see the module docstring). `targets`: token hit rates, or `target_shares`:
    shares of the trace's ceiling (the hit rate with every block cached; default 50% and 90% of it);
    `policies`: names (default all)."""
    if not isinstance(trace, Trace) or not trace.has_prefixes:
        raise ParameterError(f"trace {getattr(trace, 'name', trace)!r} has no block ids: the analyzer needs prefix "
                             "(block hash) information (Azure traces give arrivals and lengths only)")
    if trace.n_accesses == 0:
        raise ParameterError(f"trace {trace.name!r} has no block accesses")
    if model is None and (kv_format is not None or scheme != "storage"):
        given = "kv_format" if kv_format is not None else "scheme"
        raise ParameterError(f"{given} sets the bytes per token that capacities are priced in, so it needs a model; "
                             "give model too (or leave it out: capacities in blocks and tokens)")
    names = policy_names() if policies is None else list(dict.fromkeys(get_policy(p).name for p in policies))
    points = need_int("points", points, 2, 10_000)
    bb = block_bytes(model, trace.block_tokens, scheme, kv_format) if model is not None else None
    ix = LruIndex.build(trace)
    counts = dict(requests=len(trace), prompt_tokens=int(trace.input_tokens.sum()), block_accesses=trace.n_accesses,
                  unique_blocks=trace.n_blocks, mean_prompt_tokens=float(trace.input_tokens.mean()))
    defs = cache_ratio_definitions(trace, ix)
    by = {d["name"]: d["value"] for d in defs}
    ceiling = dict(token_hit_rate=by["prefix_tokens"], block_hit_rate=by["block_reuse"],
                   capacity_blocks=trace.n_blocks)
    caps = grid(trace.n_blocks, points)
    curves = {}
    for p in names:
        cls = get_policy(p)
        ok = caps >= cls.min_capacity
        tok = np.full(len(caps), np.nan)
        blk = np.full(len(caps), np.nan)
        if ok.any():
            h = cache_hits(trace, p, caps[ok], admission)
            tok[ok], blk[ok] = h.token_hit_rate, h.block_hit_rate
        curves[p] = dict(capacity_blocks=caps, token_hit_rate=tok, block_hit_rate=blk)
    if targets is not None and target_shares is not None:
        raise ParameterError("give targets (hit rates) or target_shares (shares of the ceiling), not both")
    if targets is None:
        shares = [0.5, 0.9] if target_shares is None else [need_number("target share", s, 0.0, 1.0)
                                                              for s in target_shares]
        # shares of a zero ceiling (a trace without reuse) would all ask for a 0% hit rate: nothing to size for
        targets = [s * ceiling["token_hit_rate"] for s in shares] if ceiling["token_hit_rate"] > 0 else []
    targets = list(dict.fromkeys(need_number("target", t, 0.0, 1.0) for t in targets))  # each target once
    trows = []
    for t in targets:
        for p in names:
            c = _capacity_from_curve(trace, p, caps, curves[p]["token_hit_rate"], t, admission)
            trows.append(dict(target=t, policy=p, capacity_blocks=c,
                              capacity_tokens=None if c is None else c * trace.block_tokens,
                              capacity_bytes=None if c is None or bb is None else c * bb))
    for c in curves.values():
        c["capacity_tokens"] = caps * trace.block_tokens
        if bb is not None:
            c["capacity_bytes"] = caps * bb
    return Analysis(trace.name, model, trace.block_tokens, bb, counts, prefix_sharing(trace),
                    reuse_distribution(trace, ix), ceiling, curves, trows, defs, PAPER_CACHE_RATIO.get(trace.name))


def _capacity_from_curve(trace, policy, caps, rates, target, admission):
    """The smallest capacity reaching `target`: exact for LRU; otherwise the first grid point that reaches it,
    refined by bisection down to the grid point before (None where no grid point does)."""
    if policy == "lru" and admission == "all":
        return capacity_for(trace, "lru", target)
    ok = np.flatnonzero(np.nan_to_num(rates, nan=-1.0) >= target)
    if not len(ok):
        return None
    i = int(ok[0])
    lo = max(int(caps[i - 1]) if i > 0 else get_policy(policy).min_capacity - 1, get_policy(policy).min_capacity - 1)
    hi = int(caps[i])
    while hi - lo > 1:
        m = (lo + hi) // 2
        r = cache_hits(trace, policy, [m], admission).token_hit_rate[0]
        lo, hi = (lo, m) if r >= target else (m, hi)
    return hi


def policy_table(trace: Trace, capacities, policies=None, admission: str = "all") -> list[dict]:
    """One row per policy and capacity (blocks): blocks found cached (libCacheSim's hits), prefix-hit blocks and
    tokens, and both hit rates. A capacity below a policy's smallest (S3-FIFO's) gives None counts and NaN rates."""
    names = policy_names() if policies is None else list(dict.fromkeys(get_policy(p).name for p in policies))
    caps = np.array([need_int("capacity (blocks)", c, 1) for c in np.atleast_1d(capacities).tolist()], np.int64)
    rows = []
    for p in names:
        ok = caps >= get_policy(p).min_capacity
        h = cache_hits(trace, p, caps[ok], admission) if ok.any() else None
        k = 0
        for i, c in enumerate(caps.tolist()):
            row = dict(policy=p, capacity_blocks=int(c), found=None, prefix_blocks=None, prefix_tokens=None,
                       block_hit_rate=math.nan, token_hit_rate=math.nan)
            if ok[i]:
                row.update(found=int(h.found[k]), prefix_blocks=int(h.prefix_blocks[k]),
                           prefix_tokens=int(h.prefix_tokens[k]), block_hit_rate=float(h.block_hit_rate[k]),
                           token_hit_rate=float(h.token_hit_rate[k]))
                k += 1
            rows.append(row)
    return rows


def bound_excess(a: Analysis, measure: str = "token", bound: str = "belady") -> dict:
    """Per policy on an analysis's curves: the most its hit rate (`measure`: "token" or "block") exceeds the
    `bound` policy's at any capacity both were run at (<= 0: the bound holds on every point). The bound's own
    curve must be in the analysis."""
    need_choice("measure", measure, MEASURES)
    if bound not in a.curves:
        raise ParameterError(f"the analysis has no {bound!r} curve to hold the others against "
                             f"(it has {', '.join(a.curves)})")
    key = f"{measure}_hit_rate"
    opt = np.asarray(a.curves[bound][key])
    out = {}
    for p, c in a.curves.items():
        if p == bound:
            continue
        d = np.asarray(c[key]) - opt
        d = d[~np.isnan(d)]
        out[p] = float(d.max()) if len(d) else math.nan
    return out
