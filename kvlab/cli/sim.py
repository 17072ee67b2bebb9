"""`kvlab simulate`: HBM / DRAM / SSD KV tiering on a request trace."""
from __future__ import annotations

import json
import math

from .args import ArgError, add_gpu, count as _count, gpu_of, number as _number


def load_cli_trace(args, block_tokens: int | None = None):
    """The trace a command names (args.trace, args.limit, args.seed): --seed only for the synthetic workload, where
    it applies (a trace file has no seed; an option that changes nothing is refused, not ignored)."""
    from ..sim.traces import load_trace
    kw = {} if block_tokens is None else dict(block_tokens=block_tokens)
    if str(args.trace) == "synthetic":
        return load_trace("synthetic", limit=args.limit, seed=0 if args.seed is None else args.seed, **kw)
    if args.seed is not None:
        raise ArgError(f"--seed seeds the synthetic workload only; trace {str(args.trace)!r} is read as it is "
                       "(leave --seed out)")
    return load_trace(args.trace, limit=args.limit, **kw)


def _unused_tier_options(args) -> None:
    """Options of a tier whose budget is 0 would change nothing: refused, not ignored."""
    for tier, gb, opts in (("DRAM", args.dram_gb, ("dram_policy", "dram_admission", "ttl_s")),
                           ("SSD", args.ssd_gb, ("ssd_policy", "ssd_admission"))):
        given = [o for o in opts if getattr(args, o) is not None]
        if gb == 0 and given:
            opt = "--" + given[0].replace("_", "-")
            raise ArgError(f"{opt} applies to the {tier} tier, which --{tier.lower()}-gb leaves at 0 GB: give "
                           f"--{tier.lower()}-gb too, or leave {opt} out")


def cmd_simulate(args) -> int:
    from ..errors import ParameterError
    from ..serving.native import kv_caveat
    from ..sim.tiering import make_tiers, simulate
    _unused_tier_options(args)
    gpu = gpu_of(args)
    if args.hbm_gb * 1e9 > gpu.hbm_bytes:
        raise ParameterError(f"--hbm-gb {args.hbm_gb:g} is more than {gpu.name}'s memory ({gpu.memory_label()}); "
                             "give --gpu-memory to plan with more")
    tr = load_cli_trace(args, block_tokens=args.block_tokens)
    tiers = make_tiers(args.model, args.hbm_gb, args.dram_gb, args.ssd_gb, gpu=gpu,
                       block_tokens=tr.block_tokens, ttl_s=args.ttl_s if args.ttl_s is not None else math.inf,
                       prefill_tokens_per_s=args.prefill_tps, kv_format=args.kv_format)
    policy = (args.policy, args.dram_policy or args.policy, args.ssd_policy or args.policy)
    admission = (args.admission, args.dram_admission or args.admission, args.ssd_admission or args.admission)
    r = simulate(tr, tiers, policy, progress=not args.json and not args.no_progress, admission=admission)
    out = {"trace": tr.name, "model": args.model, "gpu": gpu.name, "gpu_memory": gpu.memory_label(),
           "kv_caveat": kv_caveat(args.model, gpu, None, args.kv_format), **r.summary()}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{tr.name}: {r.requests:,} requests, {r.accesses:,} block accesses; {args.model}: "
          f"{tiers.block_bytes:,} B per {tiers.block_tokens}-token block; policy {r.policy}, admission {r.admission}")
    print("  capacity (blocks): " + ", ".join(f"{k} {v:,}" for k, v in out["capacity_blocks"].items()))
    print(f"  hit rate: {r.token_hit_rate:.1%} of tokens, {r.block_hit_rate:.1%} of blocks "
          f"(hbm {out['hbm_token_hit_rate']:.1%}, dram {out['dram_token_hit_rate']:.1%}, "
          f"ssd {out['ssd_token_hit_rate']:.1%})")
    print(f"  recomputed tokens: {r.recomputed_tokens:,} of {r.input_tokens:,}")
    print("  bytes moved: " + ", ".join(f"{k} {v / 1e9:,.1f} GB" for k, v in r.moved_bytes.items()))
    print(f"  TTFT: mean {out['ttft_mean_s']:.3f} s, p50 {out['ttft_p50_s']:.3f} s, p99 {out['ttft_p99_s']:.3f} s")
    print(f"  {gpu.name} (bandwidths, and the bound on --hbm-gb): {out['gpu_memory']}")
    if out["kv_caveat"]:
        print(f"  caveat: {out['kv_caveat']}")
    return 0


def register(sub) -> None:
    from ..sim.policies import ADMISSIONS, policy_names
    m = sub.add_parser("simulate", help="HBM / DRAM / SSD KV tiering on a request trace")
    m.add_argument("--trace", default="synthetic",
                   help="'synthetic', a path, or a public trace by name (kvlab traces list; e.g. mooncake-conversation)")
    m.add_argument("--block-tokens", type=_count("--block-tokens", 1), default=None,
                   help="tokens per hashed block of a Mooncake trace's hash_ids, or of the synthetic workload "
                        "(default 512)")
    m.add_argument("--model", required=True)
    m.add_argument("--hbm-gb", type=_number("--hbm-gb"), required=True,
                   help="KV budget in HBM, GB (at most kvlab.sim.tiering.MAX_GB, 1e9)")
    m.add_argument("--dram-gb", type=_number("--dram-gb"), default=0.0, help="KV budget in host DRAM, GB")
    m.add_argument("--ssd-gb", type=_number("--ssd-gb"), default=0.0, help="KV budget on SSD, GB")
    names = policy_names()
    m.add_argument("--policy", default="lru", choices=names, help="eviction policy of every tier (default lru)")
    m.add_argument("--dram-policy", default=None, choices=names, help="DRAM's policy (default: --policy)")
    m.add_argument("--ssd-policy", default=None, choices=names, help="SSD's policy (default: --policy)")
    m.add_argument("--admission", default="all", choices=list(ADMISSIONS),
                   help="store every block (all) or only from its second access (second), in every tier")
    m.add_argument("--dram-admission", default=None, choices=list(ADMISSIONS), help="DRAM's (default: --admission)")
    m.add_argument("--ssd-admission", default=None, choices=list(ADMISSIONS), help="SSD's (default: --admission)")
    m.add_argument("--ttl-s", type=_number("--ttl-s", 0.0, lo_open=True), default=None,
                   help="host DRAM TTL in seconds (default none)")
    add_gpu(m, required=False, default="H100", what="bandwidths for the TTFT estimate, and memory --hbm-gb fits in")
    m.add_argument("--prefill-tps", type=_number("--prefill-tps", 0.0, lo_open=True), default=10_000.0,
                   help="prefill tokens/s for recomputed tokens (assumption; default 10,000)")
    m.add_argument("--kv-format", default=None)
    m.add_argument("--seed", type=_count("--seed"), default=None,
                   help="seed of the synthetic workload (default 0)")
    m.add_argument("--limit", type=_count("--limit"), default=None, help="read only the first N requests")
    m.add_argument("--no-progress", action="store_true")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_simulate)
