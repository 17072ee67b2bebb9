"""`kvlab serve-sim`: a request trace through R replicas of a deployment (discrete-event serving simulator);
`kvlab plan`: the fewest replicas (and GPUs) of that deployment meeting a latency SLO on the trace."""
from __future__ import annotations

import json
import math

from .args import count as _count, number as _number

STEP_TIMES = ("affine", "auto", "aiconfigurator", "roofline")  # --step-time choices


def _step_model(args):
    """The simulator's step model: the affine fit (serve-sim's default, its --overhead-ms ... options) or a step-time
    source (kvlab.serving.steptime: aiconfigurator's data where it covers the deployment, else the roofline)."""
    from ..serving.stepmodel import AffineStepModel
    if args.step_time == "affine":
        return AffineStepModel(args.overhead_ms / 1e3, args.prefill_token_us / 1e6, args.decode_request_us / 1e6,
                               args.context_token_ns / 1e9)
    from ..serving.steptime import step_time
    return step_time(args.model, args.gpu, args.engine, args.tp, args.kv_format, source=args.step_time)


def _trace_and_config(args, replicas: int):
    from ..serving.simulator import deployment_config
    from ..sim.traces import load_trace
    tr = load_trace(args.trace, limit=args.limit, seed=args.seed)
    sched = dict(router=args.router, max_num_batched_tokens=args.max_num_batched_tokens,
                 max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len)
    if args.open_loop:
        sched["closed_loop"] = False
    cfg = deployment_config(args.model, args.gpu, tr, engine=args.engine, tp=args.tp, pp=args.pp,
                            replicas=replicas, kv_format=args.kv_format, hbm_gb=args.hbm_gb, dram_gb=args.dram_gb,
                            ssd_gb=args.ssd_gb, ttl_s=math.inf if args.ttl_s is None else args.ttl_s, **sched)
    return tr, cfg


def cmd_serve_sim(args) -> int:
    from ..serving.simulator import simulate_serving
    tr, cfg = _trace_and_config(args, args.replicas)
    model = _step_model(args)
    slo = {k: v for k, v in (("ttft_s", args.slo_ttft_s), ("tpot_s", args.slo_tpot_s)) if v is not None}
    r = simulate_serving(tr, cfg, model, slo)
    out = {"trace": tr.name, "model": args.model, "gpu": args.gpu, "engine": args.engine, "tp": args.tp,
           "pp": args.pp, "replicas": args.replicas, "router": args.router, "pool_tokens": cfg.pool_tokens,
           "step_time": getattr(model, "name", args.step_time), "layout_note": cfg.layout_note or None,
           "cache_blocks": None if cfg.cache_blocks is None else dict(zip(("hbm", "dram", "ssd"), cfg.cache_blocks)),
           **r.summary()}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    f = lambda v, u="s": "-" if v is None else f"{v:.3f} {u}"  # noqa: E731
    print(f"{tr.name}: {out['requests']:,} requests through {args.replicas} x {args.model} on {args.gpu} "
          f"(TP{args.tp} PP{args.pp}, {args.engine}), router {args.router}; pool {cfg.pool_tokens:,} tokens per replica")
    if cfg.layout_note:
        print(f"  {cfg.layout_note}")
    print(f"  completed {out['completed']:,}, rejected {out['rejected']:,}, preemptions {out['preemptions']:,}")
    print(f"  TTFT p50 {f(out['ttft_p50_s'])}, p99 {f(out['ttft_p99_s'])}; TPOT p50 {f(out['tpot_p50_s'])}, "
          f"p99 {f(out['tpot_p99_s'])}; queue mean {f(out['queue_mean_s'])}")
    print(f"  throughput {out['throughput_tokens_per_s']:,.1f} tokens/s, goodput "
          f"{out['goodput_requests_per_s']:.3f} requests/s; {out['gpu_seconds']:,.1f} GPU-s")
    print(f"  prefix hits: {out['token_hit_rate']:.1%} of tokens (hbm {out['hbm_token_hit_rate']:.1%}, "
          f"dram {out['dram_token_hit_rate']:.1%}, ssd {out['ssd_token_hit_rate']:.1%})")
    return 0


def cmd_plan(args) -> int:
    from ..serving.plan import parse_slo, plan_config
    slo = parse_slo(args.slo)
    tr, cfg = _trace_and_config(args, 1)
    model = _step_model(args)
    p = plan_config(tr, cfg, slo, step_model=model, max_replicas=args.max_replicas)
    out = {"trace": tr.name, "model": args.model, "gpu": args.gpu, "engine": args.engine, "tp": args.tp,
           "pp": args.pp, "kv_format": args.kv_format, "router": args.router, "pool_tokens": cfg.pool_tokens,
           "step_time": getattr(model, "name", args.step_time), "layout_note": cfg.layout_note or None,
           **p.to_dict()}
    if not args.no_steady:  # aiconfigurator's steady-state answer beside the simulated one (kvlab.serving.steady)
        from ..serving.steady import beside_plan
        out["aiconfigurator"] = beside_plan(tr, p, args.model, args.gpu, args.engine, args.kv_format)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    lim = ", ".join(f"{k} <= {v:g} s" for k, v in slo.items())
    if cfg.layout_note:
        print(f"  {cfg.layout_note}")
    if p.replicas is None:
        print(f"{tr.name}: {args.model} on {args.gpu} cannot meet {lim}: {p.why_not}")
    else:
        m = p.metrics
        print(f"{tr.name}: {p.replicas} replicas x {p.gpus_per_replica} GPU = {p.gpus} x {args.gpu} meet {lim} "
              f"({args.model}, {args.engine}, step times: {out['step_time']})")
        print(f"  TTFT p99 {m['ttft_p99_s']:.3f} s, TPOT p99 {(m['tpot_p99_s'] or 0):.4f} s, "
              f"{m['throughput_tokens_per_s']:,.0f} tokens/s, prefix hits {m['token_hit_rate']:.1%}"
              + (f"; {p.replicas - 1} replica{'s' if p.replicas > 2 else ''} fail it" if p.below else ""))
    a = out.get("aiconfigurator")
    if a is not None:
        if a.get("gpus") is None:
            print(f"  aiconfigurator's steady-state answer: none ({a['why_not']})")
        else:
            d = a["differences"]
            print(f"  aiconfigurator's steady-state answer (mean request {a['isl']:,} in / {a['osl']:,} out, "
                  f"{a['prefix']:,} prefix hits, {a['rate_per_s']:.3g} req/s from {a['rate_from']}): "
                  f"{a['gpus']} GPU(s), {a['replicas']} x "
                  f"TP{a['tp']}; the trace's busiest {d['burst_window_s']:g} s brings "
                  + ("-" if d["burst_peak_to_mean"] is None else f"{d['burst_peak_to_mean']:.1f}x")
                  + f" the mean rate, input p99 is {d['input_p99_to_mean']:.1f}x the mean")
    return 0


def _deployment_args(m, sm, ENGINES, ROUTERS) -> None:
    m.add_argument("trace", help="'synthetic', a path, or a public trace by name (kvlab traces list)")
    m.add_argument("--model", required=True)
    m.add_argument("--gpu", required=True, help="H100, H200, B200, MI300X, L40S (data/hardware.json)")
    m.add_argument("--engine", default="vllm", choices=list(ENGINES), help="allocation and memory rule (default vllm)")
    m.add_argument("--tp", type=_count("--tp", 1, 1 << 20), default=1, help="tensor-parallel size per replica")
    m.add_argument("--pp", type=_count("--pp", 1, 1 << 20), default=1, help="pipeline stages per replica")
    m.add_argument("--router", default="round_robin", choices=list(ROUTERS))
    m.add_argument("--kv-format", default=None)
    m.add_argument("--hbm-gb", type=_number("--hbm-gb"), default=None,
                   help="prefix cache in HBM per replica, GB (default: the KV pool over the replica's GPUs)")
    m.add_argument("--dram-gb", type=_number("--dram-gb"), default=0.0)
    m.add_argument("--ssd-gb", type=_number("--ssd-gb"), default=0.0)
    m.add_argument("--policy", default="lru", choices=["lru"], help="eviction policy of every tier (lru)")
    m.add_argument("--ttl-s", type=_number("--ttl-s", 0, lo_open=True), default=None, help="host-tier TTL, seconds")
    m.add_argument("--max-num-batched-tokens", type=_count("--max-num-batched-tokens", 1), default=8192)
    m.add_argument("--max-num-seqs", type=_count("--max-num-seqs", 1), default=256)
    m.add_argument("--max-model-len", type=_count("--max-model-len", 1), default=None)
    m.add_argument("--overhead-ms", type=_number("--overhead-ms"), default=sm.DEFAULT_OVERHEAD_S * 1e3,
                   help="affine step model: fixed ms per step (defaults: an affine fit to aiconfigurator's Qwen3-8B "
                        "H200)")
    m.add_argument("--prefill-token-us", type=_number("--prefill-token-us"), default=sm.DEFAULT_PREFILL_TOKEN_S * 1e6)
    m.add_argument("--decode-request-us", type=_number("--decode-request-us"),
                   default=sm.DEFAULT_DECODE_REQUEST_S * 1e6)
    m.add_argument("--context-token-ns", type=_number("--context-token-ns"), default=sm.DEFAULT_CONTEXT_TOKEN_S * 1e9)
    m.add_argument("--open-loop", action="store_true", help="sessions arrive at trace times, not after their last turn")
    m.add_argument("--seed", type=_count("--seed"), default=0, help="seed of the synthetic workload")
    m.add_argument("--limit", type=_count("--limit", 1), default=None, help="read only the first N requests")
    m.add_argument("--json", action="store_true")


def register(sub) -> None:
    from ..engines import ENGINES
    from ..serving.router import ROUTERS
    from ..serving import stepmodel as sm
    m = sub.add_parser("serve-sim", help="discrete-event serving simulation of a trace on R replicas")
    _deployment_args(m, sm, ENGINES, ROUTERS)
    m.add_argument("--replicas", type=_count("--replicas", 1, 1 << 20), default=1, help="replicas behind the router")
    m.add_argument("--step-time", default="affine", choices=STEP_TIMES,
                   help="step model: affine (the --overhead-ms ... fit, default), auto (aiconfigurator's data where "
                        "it covers the deployment, else kvlab's roofline), aiconfigurator, roofline")
    m.add_argument("--slo-ttft-s", type=_number("--slo-ttft-s", 0, lo_open=True), default=None)
    m.add_argument("--slo-tpot-s", type=_number("--slo-tpot-s", 0, lo_open=True), default=None)
    m.set_defaults(func=cmd_serve_sim)
    p = sub.add_parser("plan", help="fewest replicas and GPUs meeting a TTFT / TPOT SLO on a trace (serve-sim search)")
    _deployment_args(p, sm, ENGINES, ROUTERS)
    p.add_argument("--slo", required=True,
                   help="limits in seconds, e.g. ttft_p99=2,tpot_p99=0.05 (ttft / tpot / e2e at p50 / p99, "
                        "queue_mean, ttft_mean)")
    p.add_argument("--step-time", default="auto", choices=STEP_TIMES,
                   help="step model (default auto: aiconfigurator's data where it covers the deployment, else "
                        "kvlab's roofline; affine: the --overhead-ms ... fit)")
    p.add_argument("--max-replicas", type=_count("--max-replicas", 1, 1 << 20), default=4096,
                   help="give up past this many replicas (default 4096)")
    p.add_argument("--no-steady", action="store_true",
                   help="skip aiconfigurator's steady-state answer beside the plan (its recommend, ~10 s a call)")
    p.set_defaults(func=cmd_plan)
