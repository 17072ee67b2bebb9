"""`kvlab sessions`: sessions per GPU for a model, GPU and context length."""
from __future__ import annotations

import json

from ..errors import ParameterError
from .args import add_scheme, count as _count, number as _number


def cmd_sessions(args) -> int:
    from ..serving.capacity import plan, vllm_plan
    cap = plan(args.model, args.gpu, args.context, args.prefix_hit_rate, kv_format=args.kv_format,
               scheme=args.scheme, utilization=args.utilization, weight_shards=args.weight_shards,
               weights=None if args.weight_gb is None else int(args.weight_gb * 1e9),
               activation_gb=args.activation_gb, replay_probability=args.replay_probability)
    out = cap.as_dict()
    max_len = args.context if args.max_model_len is None else args.max_model_len
    try:
        v = vllm_plan(args.model, cap.usable_kv_bytes, max_len, args.kv_format)
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
    if cap.sessions_per_gpu == 0:
        print(f"  (one {s.tokens:,}-token session needs {s.total:,.0f} B, more than the {cap.usable_kv_bytes:,} B "
              "usable: shorten the context, shard the KV or choose a smaller format)")
    if "num_blocks" in out["vllm"]:
        v = out["vllm"]
        print(f"  vLLM: {v['num_blocks']:,} blocks of {v['block_tokens']} tokens, max concurrency "
              f"{v['max_concurrency']:.2f} at {v['max_model_len']:,} tokens (exact storage: {v['exact_concurrency']:.2f})")
    return 0


def register(sub) -> None:
    s = sub.add_parser("sessions", help="sessions per GPU for a model, GPU and context length")
    s.add_argument("model", help="catalog name or config.json path")
    s.add_argument("--gpu", required=True, help="H100, H200, B200, MI300X, L40S (data/hardware.json)")
    s.add_argument("--context", type=_count("--context", 1), required=True, help="tokens per session")
    s.add_argument("--prefix-hit-rate", type=_number("--prefix-hit-rate", 0, 1), default=0.0)
    s.add_argument("--kv-format", default=None, help="one uniform number format for every cached component")
    add_scheme(s)
    s.add_argument("--utilization", type=_number("--utilization", 0, 1, lo_open=True), default=0.9)
    s.add_argument("--weight-shards", type=_count("--weight-shards", 1), default=None,
                   help="GPUs the weights are spread over (default: smallest of 1/2/4/8 leaving half the memory)")
    s.add_argument("--weight-gb", type=_number("--weight-gb", 0, 1e6), default=None, help="override the weight estimate")
    s.add_argument("--activation-gb", type=_number("--activation-gb", 0, 1e6), default=4.0)
    s.add_argument("--replay-probability", type=_number("--replay-probability", 0, 1), default=1.0,
                   help="chance a turn finds its host-resident window state expired (V4.1 replay)")
    s.add_argument("--max-model-len", type=_count("--max-model-len", 1), default=None,
                   help="vLLM comparison length (default: --context)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_sessions)
