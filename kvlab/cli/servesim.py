"""`kvlab serve-sim`: a request trace through R replicas of a deployment (discrete-event serving simulator);
`kvlab plan`: the fewest GPUs (tensor-parallel size x replicas) of that model meeting a latency SLO on the trace.

Both price steps the same way by default (`--step-time auto`: aiconfigurator's data where it covers the deployment,
else kvlab's roofline) and print where the step times come from; both take the trace at `--load` x its offered
load as notebook 09 does (kvlab.serving.study.trace_at).
"""
from __future__ import annotations

import json
import math

from .args import add_gpu, count as _count, gpu_of, number as _number
from .serving import bytes_readable

AFFINE = (("overhead_ms", "--overhead-ms", 1e-3), ("prefill_token_us", "--prefill-token-us", 1e-6),
          ("decode_request_us", "--decode-request-us", 1e-6), ("context_token_ns", "--context-token-ns", 1e-9))
PROGRESS_REQUESTS = 20_000  # serve-sim shows a progress bar (stderr) on traces of this many requests or more
NOT_MET_EXIT = 1  # `kvlab plan`'s exit status when no candidate meets the SLO (2 stays for bad input)


def _pricer(args, gpu):
    """tp -> the step model of that deployment, from the source registered as --step-time
    (kvlab.serving.stepsources); the affine coefficients only with a source that takes them, all four or none."""
    from ..errors import ParameterError
    from ..serving import stepsources
    src = stepsources.get(args.step_time)
    given = {flag: getattr(args, k) for k, flag, _ in AFFINE if getattr(args, k) is not None}
    if given and not src.coefficients:
        raise ParameterError(f"{', '.join(given)}: the affine step model's coefficients; add --step-time affine "
                             f"(--step-time {args.step_time} prices steps without them)")
    if 0 < len(given) < len(AFFINE):
        missing = [flag for _, flag, _ in AFFINE if flag not in given]
        raise ParameterError(f"give all four affine coefficients ({', '.join(missing)} missing), or none for the "
                             "fit to aiconfigurator's Qwen3-8B / H200 figures")
    coef = tuple(getattr(args, k) * unit for k, _, unit in AFFINE) if given else None
    build = lambda tp: src.build(stepsources.Deployment(args.model, gpu, args.engine, tp, args.kv_format, coef,  # noqa: E731
                                                        _weights(args)))
    if not src.per_tp:  # one model for every TP: built once, up front (bad coefficients refused before any run)
        one = build(1)
        return lambda tp: one
    return build


def _trace(args):
    """The trace at --load x its offered load (synthetic: more users; a file: replayed faster). A file's request
    with no prompt or no output token is refused by the trace reader with its file and line (kvlab.sim.traces);
    the simulator refuses one in a trace built in code (kvlab.serving.simulator.empty_requests)."""
    from ..serving.study import trace_at
    workload = {k: v for k, v in (("sessions", args.sessions), ("human_pause_median_s", args.human_pause_s))
                if v is not None}
    return trace_at(args.trace, args.load, limit=args.limit, seed=args.seed, block_tokens=args.block_tokens,
                    **workload)


def _weights(args) -> int | None:
    """--weight-gb in bytes (None: kvlab's estimate)."""
    return None if args.weight_gb is None else int(args.weight_gb * 1e9)


def _config(args, gpu, trace, tp: int, replicas: int = 1):
    from ..serving.simulator import deployment_config
    sched = dict(router=args.router, max_num_batched_tokens=args.max_num_batched_tokens,
                 max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, policy=args.policy,
                 admission=args.admission,
                 prefix_caching=not args.no_prefix_caching, async_scheduling=not args.sync_scheduling,
                 chunked_prefill=not args.no_chunked_prefill, reserve_full_isl=not args.no_reserve_full_isl,
                 long_prefill_token_threshold=args.long_prefill_token_threshold)
    if args.open_loop:
        sched["closed_loop"] = False
    return deployment_config(args.model, gpu, trace, engine=args.engine, tp=tp, pp=args.pp, replicas=replicas,
                             kv_format=args.kv_format, dram_gb=args.dram_gb, ssd_gb=args.ssd_gb,
                             ttl_s=math.inf if args.ttl_s is None else args.ttl_s, block_size=args.block_size,
                             num_blocks=args.num_blocks, pool_tokens=args.pool_tokens, weights=_weights(args),
                             **sched)


def _context(args, gpu, trace) -> dict:
    """What every output names: the trace at its load, the GPU and its memory's source, the KV caveat."""
    from ..serving.native import kv_caveat
    return {"trace": trace.name, "load": args.load, "requests": len(trace), "model": args.model, "gpu": gpu.name,
            "gpu_memory_bytes": gpu.hbm_bytes, "gpu_memory": gpu.memory_label(), "engine": args.engine,
            "kv_format": args.kv_format, "pp": args.pp, "router": args.router,
            "kv_caveat": kv_caveat(args.model, gpu, args.engine, args.kv_format)}


def _head(out: dict) -> str:
    load = "" if out["load"] == 1 else f" at x{out['load']:g} load"
    return f"{out['trace']}{load} ({out['requests']:,} requests)"


def _tail_lines(out: dict, step_time: dict) -> list[str]:
    from ..serving.stepmodel import describe_line
    lines = [f"  step times: {describe_line(step_time)}", f"  {out['gpu']}: {out['gpu_memory']}"]
    if out.get("kv_caveat"):
        lines.append(f"  caveat: {out['kv_caveat']}")
    return lines


def cmd_serve_sim(args) -> int:
    from ..serving.runlog import check_new_file, write_requests_csv, write_steps_jsonl
    from ..serving.simulator import scheduler_blocks, simulate_serving
    for flag, path in (("--requests-out", args.requests_out), ("--steps-out", args.steps_out)):
        if path is not None:
            check_new_file(flag, path)
    gpu = gpu_of(args)
    tr = _trace(args)
    tp = args.tp or 1
    cfg = _config(args, gpu, tr, tp, args.replicas)
    model = _pricer(args, gpu)(tp)
    slo = {k: v for k, v in (("ttft_s", args.slo_ttft_s), ("tpot_s", args.slo_tpot_s)) if v is not None}
    progress = not (args.no_progress or args.json) and len(tr) >= PROGRESS_REQUESTS
    r = simulate_serving(tr, cfg, model, slo, record_steps=args.steps_out is not None, progress=progress)
    if args.requests_out is not None:
        write_requests_csv(args.requests_out, r)
    if args.steps_out is not None:
        write_steps_jsonl(args.steps_out, r)
    s = r.summary()
    out = {**_context(args, gpu, tr), "tp": tp, "replicas": args.replicas, "pool_tokens": cfg.pool_tokens,
           "scheduler": "vllm", "num_blocks": scheduler_blocks(cfg), "block_size": cfg.page_tokens,
           "layout_note": cfg.layout_note or None, "pool_note": cfg.pool_note or None,
           "cache_blocks": None if cfg.cache_blocks is None else dict(zip(("hbm", "dram", "ssd"), cfg.cache_blocks)),
           **s}
    out["loop"] = r.loop  # the figures are the same from either loop
    if args.explain:
        from ..serving.scheduler import explain
        out["scheduler_rules"] = explain() + f"\n  loop: {r.loop} (either loop gives the same figures to the last bit)"
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    f = lambda v, u="s": "-" if v is None else f"{v:.3f} {u}"  # noqa: E731
    print(f"{_head(out)} through {args.replicas} x {args.model} on {gpu.name} (TP{tp} PP{args.pp}, {args.engine}), "
          f"router {args.router}; pool {out['num_blocks']:,} blocks of {cfg.page_tokens} tokens per replica, "
          "vLLM 0.33 scheduler" + ("" if cfg.cache_blocks is None or not any(cfg.cache_blocks[1:]) else
                                   f", host tiers {cfg.cache_blocks[1]:,} / {cfg.cache_blocks[2]:,} trace blocks "
                                   f"(DRAM / SSD, {cfg.policy}, admission {cfg.admission})"))
    if cfg.pool_note:
        print(f"  {bytes_readable(cfg.pool_note)}")
    if cfg.layout_note:
        print(f"  {cfg.layout_note}")
    print(f"  completed {out['completed']:,}, rejected {out['rejected']:,}, preemptions {out['preemptions']:,}")
    print(f"  TTFT p50 {f(out['ttft_p50_s'])}, p99 {f(out['ttft_p99_s'])}; TPOT p50 {f(out['tpot_p50_s'])}, "
          f"p99 {f(out['tpot_p99_s'])}; queue mean {f(out['queue_mean_s'])}")
    print(f"  throughput {out['throughput_tokens_per_s']:,.1f} tokens/s, goodput "
          f"{out['goodput_requests_per_s']:.3f} requests/s; {out['gpu_seconds']:,.1f} GPU-s")
    print(f"  prefix hits: {out['token_hit_rate']:.1%} of tokens (hbm {out['hbm_token_hit_rate']:.1%}, "
          f"dram {out['dram_token_hit_rate']:.1%}, ssd {out['ssd_token_hit_rate']:.1%})")
    print("\n".join(_tail_lines(out, s["step_time"])))
    if args.explain:
        print(out["scheduler_rules"])
    return 0


def _tps(args) -> list[int]:
    """The tensor-parallel sizes plan searches: --tp alone when given (or for affine step times, which price one
    deployment), else 1, 2, 4, 8 up to --max-tp."""
    from ..serving.plan import TP_CHOICES
    if args.tp is not None:
        return [args.tp]
    from ..serving import stepsources
    if not stepsources.get(args.step_time).per_tp:  # one model for every TP (affine): TP 1
        return [1]
    return [t for t in TP_CHOICES if t <= args.max_tp] or [args.max_tp]


def cmd_plan(args) -> int:
    import sys
    from ..serving.plan import parse_slo, search
    slo = parse_slo(args.slo)
    gpu = gpu_of(args)
    tr = _trace(args)
    price, notes, pools = _pricer(args, gpu), {}, {}

    def configure(tp: int):
        cfg = _config(args, gpu, tr, tp)
        if cfg.layout_note:
            notes[cfg.layout_note] = None
        pools[f"TP{tp}"] = cfg.pool_note or None
        return cfg
    s = search(tr, slo, configure, price, _tps(args), args.pp, max_replicas=args.max_replicas)
    p = s.best
    out = {**_context(args, gpu, tr), **s.to_dict(), "layout_note": "; ".join(notes) or None, "pool_notes": pools}
    first = s.candidates[0]
    out.setdefault("step_time", first.step_time)
    if p is not None and not args.no_steady:  # aiconfigurator's steady-state answer beside the simulated one
        from ..serving.steady import beside_plan
        out["aiconfigurator"] = beside_plan(tr, p, args.model, gpu.name, args.engine, args.kv_format)
    lim = ", ".join(f"{k} <= {v:g} s" for k, v in slo.items())
    fail = (f"no candidate ({', '.join(f'TP{c.tp}' for c in s.candidates)}) of {args.model} on {gpu.name} meets "
            f"{lim} on {tr.name}; best reached: " + "; ".join(f"TP{c.tp} {c.reached_line()}" for c in s.candidates))
    if args.json:
        print(json.dumps(out, indent=2))
        if p is None:
            print(f"kvlab: plan: {fail}", file=sys.stderr)
        return 0 if p is not None else NOT_MET_EXIT
    if p is None:
        print(f"{_head(out)}: no deployment of {args.model} on {gpu.name} meets {lim}")
    else:
        m = p.metrics
        print(f"{_head(out)}: {p.replicas} replica{'s' if p.replicas > 1 else ''} x TP{p.tp}"
              + (f" x PP{args.pp}" if args.pp > 1 else "") + f" = {p.gpus} x {gpu.name} meet {lim} "
              f"({args.model}, {args.engine})")
        print(f"  TTFT p99 {m['ttft_p99_s']:.3f} s, TPOT p99 {(m['tpot_p99_s'] or 0):.4f} s, "
              f"{m['throughput_tokens_per_s']:,.0f} tokens/s, prefix hits {m['token_hit_rate']:.1%}"
              + (f"; {p.replicas - 1} replica{'s' if p.replicas > 2 else ''} fail it" if p.below else ""))
    print(f"  candidates ({s.rule}):")
    for c in s.candidates:
        got = f"{c.gpus} GPU{'s' if c.gpus > 1 else ''} ({c.replicas} x TP{c.tp})" if c.replicas else None
        print(f"    TP{c.tp}: " + (got or f"not met ({c.why_not}); best reached {c.reached_line()}"))
    for tp, why in s.skipped.items():
        print(f"    TP{tp}: not searched: {why}")
    for tp, pool in pools.items():
        if pool:
            print(f"  {tp}: {bytes_readable(pool)}")
    if out["layout_note"]:
        print(f"  {out['layout_note']}")
    print("\n".join(_tail_lines(out, (p or first).step_time)))
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
    if p is None:
        print(f"kvlab: plan: {fail}", file=sys.stderr)
        return NOT_MET_EXIT
    return 0


def _deployment_args(m, ENGINES, ROUTERS) -> None:
    from ..serving import stepsources
    from ..serving.study import MAX_SESSIONS
    from ..sim.policies import ADMISSIONS, ONLINE
    m.add_argument("trace", help="'synthetic', a path, or a public trace by name (kvlab traces list)")
    m.add_argument("--block-tokens", type=_count("--block-tokens", 1), default=None,
                   help="tokens per hashed block of a Mooncake trace's hash_ids, or of the synthetic workload "
                        "(default 512)")
    m.add_argument("--model", required=True)
    m.add_argument("--weight-gb", type=_number("--weight-gb", 0, 1e6, lo_open=True), default=None,
                   help="whole-model weight GB, instead of kvlab's estimate (data/weights.json; a model it has none "
                        "for, e.g. a config of your own, needs this)")
    add_gpu(m)
    m.add_argument("--engine", default="vllm", choices=list(ENGINES), help="allocation and memory rule (default vllm)")
    m.add_argument("--pp", type=_count("--pp", 1, 1 << 20), default=1, help="pipeline stages per replica")
    m.add_argument("--router", default="round_robin", choices=list(ROUTERS))
    m.add_argument("--kv-format", default=None)
    m.add_argument("--load", type=_number("--load", 0, 1e6, lo_open=True), default=1.0,
                   help="offered load, x the trace's (default 1): the synthetic workload grows by users (x the "
                        "sessions, arriving x as fast), a recorded trace is replayed x faster (as notebook 09)")
    m.add_argument("--sessions", type=_count("--sessions", 1, MAX_SESSIONS), default=None,
                   help="synthetic workload: sessions at load 1 (default 200)")
    m.add_argument("--human-pause-s", type=_number("--human-pause-s", 0, 1e9, lo_open=True), default=None,
                   help="synthetic workload: median pause for a human reply, seconds (default 60)")
    m.add_argument("--dram-gb", type=_number("--dram-gb"), default=0.0,
                   help="host DRAM tier per replica, GB: takes the blocks the KV pool evicts (the pool is the HBM "
                        "tier: size it with --num-blocks / --pool-tokens)")
    m.add_argument("--ssd-gb", type=_number("--ssd-gb"), default=0.0, help="SSD tier per replica, GB (behind DRAM)")
    m.add_argument("--policy", default="lru", choices=ONLINE,
                   help="eviction policy of the DRAM and SSD tiers (default lru; the tier stack: kvlab.sim.tierstack)")
    m.add_argument("--admission", default="all", choices=list(ADMISSIONS),
                   help="host tiers store a block from its first access (all, default) or its second (second)")
    m.add_argument("--ttl-s", type=_number("--ttl-s", 0, lo_open=True), default=None,
                   help="host DRAM TTL, seconds: a DRAM block idle this long sinks to SSD, or is dropped")
    m.add_argument("--max-num-batched-tokens", type=_count("--max-num-batched-tokens", 1, 1 << 24), default=8192)
    m.add_argument("--max-num-seqs", type=_count("--max-num-seqs", 1, 1 << 20), default=256)
    m.add_argument("--max-model-len", type=_count("--max-model-len", 1, 1 << 40), default=None)
    m.add_argument("--step-time", default="auto", choices=stepsources.names(), help=f"step model: {stepsources.help_text()}")
    for k, flag, _ in AFFINE:
        unit = flag.rsplit("-", 1)[1]
        m.add_argument(flag, dest=k, type=_number(flag, 0, 1e9), default=None,
                       help=f"affine step model ({unit}; with --step-time affine, all four or none)")
    g = m.add_argument_group("scheduler (vLLM 0.33's knobs; serve-sim --explain says what is modelled)")
    g.add_argument("--num-blocks", type=_count("--num-blocks", 1, 1 << 40), default=None,
                   help="KV pool blocks per replica, vLLM's null block included (default: from the GPU's memory)")
    g.add_argument("--pool-tokens", type=_count("--pool-tokens", 1, 1 << 50), default=None,
                   help="KV pool per replica in tokens (a multiple of --block-size; default: from the GPU's memory)")
    g.add_argument("--block-size", type=_count("--block-size", 1, 1 << 20), default=None,
                   help="tokens per KV block (default: the engine's, 16 for vLLM)")
    g.add_argument("--no-chunked-prefill", action="store_true", help="a prompt's prefill is never split")
    g.add_argument("--no-prefix-caching", action="store_true", help="no prefix caching")
    g.add_argument("--sync-scheduling", action="store_true",
                   help="synchronous scheduling (default: async, vLLM's default)")
    g.add_argument("--no-reserve-full-isl", action="store_true",
                   help="admit on the first chunk's blocks (default: the whole input must fit, vLLM's default)")
    g.add_argument("--long-prefill-token-threshold", type=_count("--long-prefill-token-threshold"), default=0,
                   help="most tokens of one prefill chunk when other requests wait (default 0: no limit)")
    m.add_argument("--open-loop", action="store_true", help="sessions arrive at trace times, not after their last turn")
    m.add_argument("--seed", type=_count("--seed"), default=0, help="seed of the synthetic workload")
    m.add_argument("--limit", type=_count("--limit", 1), default=None, help="read only the first N requests")
    m.add_argument("--json", action="store_true")


def register(sub) -> None:
    from ..engines import ENGINES
    from ..serving.plan import METRICS, TIE_RULE
    from ..serving.router import ROUTERS
    m = sub.add_parser("serve-sim", help="discrete-event serving simulation of a trace on R replicas")
    _deployment_args(m, ENGINES, ROUTERS)
    m.add_argument("--tp", type=_count("--tp", 1, 1 << 20), default=None, help="tensor-parallel size per replica "
                                                                                "(default 1)")
    m.add_argument("--replicas", type=_count("--replicas", 1, 1 << 20), default=1, help="replicas behind the router")
    m.add_argument("--slo-ttft-s", type=_number("--slo-ttft-s", 0, lo_open=True), default=None)
    m.add_argument("--slo-tpot-s", type=_number("--slo-tpot-s", 0, lo_open=True), default=None)
    m.add_argument("--requests-out", default=None, metavar="FILE.csv",
                   help="write one row per request (id, arrival_s, admitted_s, first_token_s, finish_s, preemptions, "
                        "prefix_hit_tokens, rejected); the file must not exist")
    m.add_argument("--steps-out", default=None, metavar="FILE.jsonl",
                   help="write one line per step (time, tokens per request [prefill, decode], preempted, free "
                        "blocks); the file must not exist")
    m.add_argument("--no-progress", action="store_true",
                   help=f"no progress bar (shown on stderr for traces of {PROGRESS_REQUESTS:,} requests or more, "
                        "never with --json)")
    m.add_argument("--explain", action="store_true",
                   help="also say which of vLLM 0.33's scheduling rules are modelled and which are left out")
    m.set_defaults(func=cmd_serve_sim)
    p = sub.add_parser("plan", help="fewest GPUs (TP x replicas) meeting a TTFT / TPOT SLO on a trace (serve-sim "
                                    "search); exits 1 when no candidate meets it")
    _deployment_args(p, ENGINES, ROUTERS)
    p.add_argument("--slo", required=True,
                   help=f"limits in seconds, e.g. ttft_p99=2,tpot_p99=0.05; metrics: {', '.join(METRICS)}")
    p.add_argument("--tp", type=_count("--tp", 1, 1 << 20), default=None,
                   help=f"search only this tensor-parallel size (default: 1, 2, 4, 8 up to --max-tp; {TIE_RULE})")
    p.add_argument("--max-tp", type=_count("--max-tp", 1, 1 << 20), default=8,
                   help="largest tensor-parallel size searched (default 8)")
    p.add_argument("--max-replicas", type=_count("--max-replicas", 1, 1 << 20), default=4096,
                   help="give up past this many replicas (default 4096)")
    p.add_argument("--no-steady", action="store_true",
                   help="skip aiconfigurator's steady-state answer beside the plan (its recommend, ~10 s a call)")
    p.set_defaults(func=cmd_plan)
