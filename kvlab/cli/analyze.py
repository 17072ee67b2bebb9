"""`kvlab analyze TRACE`: the offline prefix-cache analyzer (no GPU): sharing, reuse, hit-rate curves per policy."""
from __future__ import annotations

import json

from .args import ArgError, count as _count, number as _number


def _gb(x) -> str:
    """Bytes with a decimal unit and three significant digits."""
    if x is None:
        return "-"
    for div, unit in ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if x >= div:
            return f"{x / div:.3g} {unit}"
    return f"{x:.0f} B"


def cmd_analyze(args) -> int:
    import numpy as np

    from ..sim.analyze import SHOW_DEPTHS, analyze
    from .sim import load_cli_trace
    if args.kv_format is not None and args.model is None:
        raise ArgError("--kv-format needs --model: it sets the bytes per token that capacities are priced in "
                       "(without --model they are in blocks and tokens)")
    tr = load_cli_trace(args, block_tokens=args.block_tokens)
    a = analyze(tr, args.model, args.policy, args.points, args.target, args.admission, args.kv_format)
    if args.json:
        print(json.dumps(a.to_dict(), indent=2))
        return 0
    c = a.counts
    print(f"{a.trace}: {c['requests']:,} requests, {c['prompt_tokens']:,} prompt tokens, {c['block_accesses']:,} "
          f"block accesses of {a.block_tokens} tokens, {c['unique_blocks']:,} unique blocks")
    if a.model:
        print(f"  {a.model}: {a.block_bytes:,} B per block; every block cached: {_gb(c['unique_blocks'] * a.block_bytes)}")
    s = a.sharing
    print("prefix sharing (requests whose first d blocks match another request's):")
    for d in SHOW_DEPTHS:
        if d <= len(s["depth"]):
            i = d - 1
            n = s["requests"][i]
            print(f"  depth {d:>4}: {n:>9,} requests, {s['distinct'][i]:>9,} distinct prefixes, shared by "
                  f"{s['shared'][i] / n:6.1%}, seen earlier by {s['seen_before'][i] / n:6.1%}")
    r = a.reuse
    p = r["distance_percentiles"]
    if r["reuses"]:
        print(f"reuse: {r['cold_accesses']:,} first accesses, {r['reuses']:,} reuses; LRU stack distance p50 "
              f"{p['50']:,.0f}, p90 {p['90']:,.0f}, p99 {p['99']:,.0f} blocks; reuse time p50 "
              f"{r['reuse_time_percentiles_s']['50']:,.1f} s, p90 {r['reuse_time_percentiles_s']['90']:,.1f} s")
    else:
        print(f"reuse: none - all {r['cold_accesses']:,} block accesses are first accesses, so no cache of any size "
              "hits (every hit rate below is 0)")
    ce = a.ceiling
    print(f"ceiling (every block cached): {ce['token_hit_rate']:.2%} of prompt tokens, {ce['block_hit_rate']:.2%} of "
          "block accesses")
    names = list(a.curves)
    caps = a.curves[names[0]]["capacity_blocks"]
    show = np.unique(np.linspace(0, len(caps) - 1, min(len(caps), 10)).round().astype(int))
    unit = "capacity_bytes" if a.model else "capacity_tokens"
    print("token hit rate against capacity (" + ("bytes" if a.model else "tokens") + "):")
    print("  " + f"{'capacity':>12}" + "".join(f"{n:>14}" for n in names))
    for i in show:
        cap = a.curves[names[0]][unit][i]
        label = _gb(cap) if a.model else f"{cap:,}"
        row = "".join(f"{a.curves[n]['token_hit_rate'][i]:>14.2%}" if not np.isnan(a.curves[n]['token_hit_rate'][i])
                      else f"{'-':>14}" for n in names)
        print(f"  {label:>12}{row}")
    print("capacity for a token hit rate (" + ("bytes" if a.model else "blocks") + "):" +
          ("" if a.targets else " none to size for (the trace has no reuse; --target sets one)"))
    for t in sorted({row["target"] for row in a.targets}):
        rows = [row for row in a.targets if row["target"] == t]
        cells = ", ".join(f"{row['policy']} " + (_gb(row["capacity_bytes"]) if a.model else
                                                 ("-" if row["capacity_blocks"] is None else f"{row['capacity_blocks']:,}"))
                          for row in rows)
        print(f"  {t:.2%}: {cells}")
    print("cache-ratio definitions (every block cached)" +
          (f"; the paper (Mooncake FAST'25 Table 2) gives {a.paper_cache_ratio:.0%} for this trace:"
           if a.paper_cache_ratio is not None else ":"))
    for d in a.definitions:
        mark = "  <- rounds to the paper's figure" if (a.paper_cache_ratio is not None and
                                                      round(d["value"], 2) == a.paper_cache_ratio) else ""
        print(f"  {d['value']:7.2%}  {d['name']}: {d['definition']}{mark}")
    return 0


def register(sub) -> None:
    from ..sim.policies import ADMISSIONS, policy_names
    m = sub.add_parser("analyze", help="offline prefix-cache analysis of a trace: sharing, reuse, hit-rate curves")
    m.add_argument("trace", help="a Mooncake JSONL path, a public trace by name (kvlab traces list), or 'synthetic'")
    m.add_argument("--model", default=None, help="price capacities in this model's bytes per token")
    m.add_argument("--block-tokens", type=_count("--block-tokens", 1), default=None,
                   help="tokens per hashed block (Mooncake: 512; for 'synthetic', the workload's block size)")
    m.add_argument("--kv-format", default=None, help="KV number format for the bytes per token")
    m.add_argument("--policy", action="append", choices=policy_names(), default=None,
                   help="a policy to analyze (repeat for several; default all)")
    m.add_argument("--admission", default="all", choices=list(ADMISSIONS))
    m.add_argument("--points", type=_count("--points"), default=100, help="capacities on each curve (default 100)")
    m.add_argument("--target", type=_number("--target", 0.0, 1.0), action="append", default=None,
                   help="token hit rate to size for (repeat; default 50%% and 90%% of the trace's ceiling)")
    m.add_argument("--limit", type=_count("--limit"), default=None, help="only the first N requests")
    m.add_argument("--seed", type=_count("--seed"), default=None, help="seed of the synthetic workload (default 0)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_analyze)
