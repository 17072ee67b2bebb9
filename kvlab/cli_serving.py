"""`kvlab sessions` (sessions per GPU) and `kvlab simulate` (KV tiering on a trace)."""
from __future__ import annotations

import argparse
import json
import math

from .cli import count_arg as _count
from .errors import ParameterError


def _number(name, lo=0.0, hi=math.inf):
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {s!r}") from None
        if not (lo <= v <= hi) or math.isnan(v):
            raise argparse.ArgumentTypeError(f"{name} must lie in [{lo}, {hi}], got {s!r}")
        return v
    return parse


def cmd_sessions(args) -> int:
    from .capacity import plan, vllm_plan
    cap = plan(args.model, args.gpu, args.context, args.prefix_hit_rate, kv_format=args.kv_format,
               scheme=args.layout, utilization=args.utilization, weight_shards=args.weight_shards,
               weights=None if args.weight_gb is None else int(args.weight_gb * 1e9),
               activation_gb=args.activation_gb, replay_probability=args.replay_probability)
    out = cap.as_dict()
    try:
        v = vllm_plan(args.model, cap.usable_kv_bytes, args.max_model_len or args.context, args.kv_format)
        out["vllm"] = dict(num_blocks=v.num_blocks, block_tokens=v.block_tokens, max_model_len=v.max_model_len,
                           max_concurrency=v.max_concurrency, exact_concurrency=v.exact_concurrency,
                           formula=v.formula)
    except ParameterError as e:
        out["vllm"] = {"unavailable": str(e)}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    s = cap.session
    print(f"{out['model']} on {cap.gpu.name}, {s.tokens:,}-token sessions")
    print(f"  session: {s.growing_bytes:,} B growing - {s.prefix_hit_bytes:,} B prefix hits "
          f"+ {s.replay_bytes:,.0f} B expected replay + {s.bounded_bytes:,} B bounded = {s.total:,.0f} B")
    print(f"  usable KV: {cap.gpu.hbm_bytes:,} B x {cap.utilization:g} - {cap.weight_share:,} B weights "
          f"(1/{cap.weight_shards}) - {cap.activation_bytes:,} B activations = {cap.usable_kv_bytes:,} B")
    print(f"  sessions per GPU: {cap.sessions_per_gpu:,} ({cap.sessions_without_replay:,} without the replay penalty)")
    if "num_blocks" in out["vllm"]:
        v = out["vllm"]
        print(f"  vLLM: {v['num_blocks']:,} blocks of {v['block_tokens']} tokens, max concurrency "
              f"{v['max_concurrency']:.2f} at {v['max_model_len']:,} tokens (exact storage: {v['exact_concurrency']:.2f})")
    return 0


def cmd_simulate(args) -> int:
    from .tiering import make_tiers, simulate
    from .traces import load_trace
    tr = load_trace(args.trace, limit=args.limit, seed=args.seed)
    tiers = make_tiers(args.model, args.hbm_gb, args.dram_gb, args.ssd_gb, gpu=args.gpu,
                       block_tokens=tr.block_tokens, ttl_s=args.ttl_s if args.ttl_s is not None else math.inf,
                       prefill_tokens_per_s=args.prefill_tps, kv_format=args.kv_format)
    r = simulate(tr, tiers, args.policy, progress=not args.json and not args.no_progress)
    out = {"trace": tr.name, "model": args.model, **r.summary()}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{tr.name}: {r.requests:,} requests, {r.accesses:,} block accesses; {args.model}: "
          f"{tiers.block_bytes:,} B per {tiers.block_tokens}-token block")
    print("  capacity (blocks): " + ", ".join(f"{k} {v:,}" for k, v in out["capacity_blocks"].items()))
    print(f"  hit rate: {r.token_hit_rate:.1%} of tokens, {r.block_hit_rate:.1%} of blocks "
          f"(hbm {out['hbm_token_hit_rate']:.1%}, dram {out['dram_token_hit_rate']:.1%}, "
          f"ssd {out['ssd_token_hit_rate']:.1%})")
    print(f"  recomputed tokens: {r.recomputed_tokens:,} of {r.input_tokens:,}")
    print("  bytes moved: " + ", ".join(f"{k} {v / 1e9:,.1f} GB" for k, v in r.moved_bytes.items()))
    print(f"  TTFT: mean {out['ttft_mean_s']:.3f} s, p50 {out['ttft_p50_s']:.3f} s, p99 {out['ttft_p99_s']:.3f} s")
    return 0


def register(sub) -> None:
    s = sub.add_parser("sessions", help="sessions per GPU for a model, GPU and context length")
    s.add_argument("model", help="catalog name or config.json path")
    s.add_argument("--gpu", required=True, help="H100, H200, B200, MI300X, L40S (data/hardware.json)")
    s.add_argument("--context", type=_count("--context"), required=True, help="tokens per session")
    s.add_argument("--prefix-hit-rate", type=_number("--prefix-hit-rate", 0, 1), default=0.0)
    s.add_argument("--kv-format", default=None, help="one uniform number format for every cached component")
    s.add_argument("--layout", default="storage", choices=["storage", "vllm", "bf16"])
    s.add_argument("--utilization", type=_number("--utilization", 0, 1), default=0.9)
    s.add_argument("--weight-shards", type=_count("--weight-shards"), default=None,
                   help="GPUs the weights are spread over (default: smallest of 1/2/4/8 leaving half the memory)")
    s.add_argument("--weight-gb", type=_number("--weight-gb"), default=None, help="override the weight estimate")
    s.add_argument("--activation-gb", type=_number("--activation-gb"), default=4.0)
    s.add_argument("--replay-probability", type=_number("--replay-probability", 0, 1), default=1.0,
                   help="chance a turn finds its host-resident window state expired (V4.1 replay)")
    s.add_argument("--max-model-len", type=_count("--max-model-len"), default=None,
                   help="vLLM comparison length (default: --context)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_sessions)

    m = sub.add_parser("simulate", help="HBM / DRAM / SSD KV tiering on a request trace")
    m.add_argument("--trace", default="synthetic",
                   help="'synthetic', a path, or conversation / mooncake_synthetic (from ../shared/traces)")
    m.add_argument("--model", required=True)
    m.add_argument("--hbm-gb", type=_number("--hbm-gb"), required=True, help="KV budget in HBM, GB")
    m.add_argument("--dram-gb", type=_number("--dram-gb"), default=0.0)
    m.add_argument("--ssd-gb", type=_number("--ssd-gb"), default=0.0)
    m.add_argument("--policy", default="lru", choices=["lru", "lfu"])
    m.add_argument("--ttl-s", type=_number("--ttl-s"), default=None, help="host DRAM TTL in seconds (default none)")
    m.add_argument("--gpu", default="H100", help="bandwidths for the TTFT estimate")
    m.add_argument("--prefill-tps", type=_number("--prefill-tps"), default=10_000.0,
                   help="prefill tokens/s for recomputed tokens (assumption; default 10,000)")
    m.add_argument("--kv-format", default=None)
    m.add_argument("--seed", type=_count("--seed"), default=0, help="seed of the synthetic workload")
    m.add_argument("--limit", type=_count("--limit"), default=None, help="read only the first N requests")
    m.add_argument("--no-progress", action="store_true")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_simulate)
