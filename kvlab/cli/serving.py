"""`kvlab sessions`: sessions per GPU and per deployment for a model, GPU, context length and deployment."""
from __future__ import annotations

import json
import re

from ..errors import ParameterError
from .args import (add_engine, add_formats, add_gpu, add_parallel, add_scheme, count as _count, format_kwargs, gpu_of,
                   number as _number)


def bytes_readable(text: str) -> str:
    """Every 'N,NNN B' of a rule written with exact bytes, in GB / MB for a reader (exact integers stay in --json)."""
    from ..explain import fmt_size
    return re.sub(r"\b(\d{1,3}(?:,\d{3})+|\d+) B\b", lambda m: fmt_size(int(m[1].replace(",", ""))), text)


def _deployment(args, cap, explicit: bool) -> tuple[str, str]:
    """The deployment line (GPUs and how they were chosen, the allocation and memory rules) and the weights line."""
    from ..explain import fmt_size
    from ..serving.capacity import SHARD_CHOICES, weight_bytes
    par = cap.parallel
    how = ("as given" if explicit else
           f"{cap.weight_shards} given by --weight-shards" if args.weight_shards is not None else
           f"the fewest of {', '.join(map(str, SHARD_CHOICES))} GPUs whose weight share takes at most half the "
           "usable memory, each GPU keeping whole sessions; --tp / --pp / --dp-attention choose")
    alloc = "exact storage" if cap.engine == "exact" else f"{cap.engine}'s paging"
    gpus = par.label() if cap.gpus == 1 else f"{par.label()} = {cap.gpus} GPUs"
    dep = f"deployment: {gpus} ({how}); KV counted as {alloc}, {cap.budget.engine}'s memory rule"
    if args.kv_cache_memory_bytes is not None:
        return dep, (f"weights: not counted (--kv-cache-memory-bytes gives the KV pool: "
                     f"{fmt_size(args.kv_cache_memory_bytes)} per GPU)")
    src = "given (--weight-gb)" if args.weight_gb is not None else f"estimate: {weight_bytes(cap.model).note}"
    w = (f"weights: {fmt_size(cap.weight_bytes)}, {fmt_size(cap.weight_share)} per GPU over {cap.weight_shards} "
         f"GPU(s) ({src})")
    return dep, w


VLLM_FLAGS = ("kv_cache_memory_bytes", "max_model_len", "max_num_batched_tokens", "no_prefix_caching",
              "no_async_scheduling")  # options that ask for vLLM's plan: with any of them a refusal is an error


def vllm_record(args, cap, par) -> dict:
    """vLLM's plan ("reserved at admission") for the sessions command; a refusal is an error when vLLM's plan was
    asked for (--engine vllm or one of its options), else recorded as unavailable."""
    from ..serving.vllm_plan import VLLM_BATCHES_IN_FLIGHT, VLLM_MAX_NUM_BATCHED_TOKENS, vllm_plan
    asked = args.engine == "vllm" or any(getattr(args, f) not in (None, False) for f in VLLM_FLAGS)
    if args.engine not in (None, "vllm"):
        return {}
    try:
        if par is not None and par.pp > 1:
            raise ParameterError("vLLM plans each pipeline stage's pool and keeps the smallest block count; kvlab's "
                                 "vLLM plan covers TP and DCP, not PP")
        return vllm_plan(args.model, cap.usable_kv_bytes, args.context if args.max_model_len is None
                         else args.max_model_len, args.kv_format, tp=1 if par is None else par.attention_tp,
                         dcp=1 if par is None else par.dcp,
                         max_num_batched_tokens=args.max_num_batched_tokens or VLLM_MAX_NUM_BATCHED_TOKENS,
                         batches_in_flight=1 if args.no_async_scheduling else VLLM_BATCHES_IN_FLIGHT,
                         prefix_caching=not args.no_prefix_caching)
    except ParameterError as e:
        if asked:
            raise
        return {"unavailable": str(e)}


def cmd_sessions(args) -> int:
    from ..explain import fmt_size
    from ..serving.capacity import plan
    from ..serving.native import kv_caveat
    from ..serving.parallel import Parallelism
    explicit = args.tp > 1 or args.dcp > 1 or args.pp > 1 or args.dp_attention
    par = Parallelism(args.tp, args.dcp, args.pp, args.dp_attention) if explicit else None
    gpu = gpu_of(args)
    cap = plan(args.model, gpu, args.context, args.prefix_hit_rate, scheme=args.scheme,
               utilization=args.utilization, weight_shards=args.weight_shards,
               weights=None if args.weight_gb is None else int(args.weight_gb * 1e9),
               activation_gb=args.activation_gb, replay_probability=args.replay_probability, parallel=par,
               engine=args.engine, memory_fraction=args.memory_fraction, page_size=args.page_size,
               kv_cache_memory_bytes=args.kv_cache_memory_bytes, **format_kwargs(args))
    out = cap.as_dict()
    deployment, weights = _deployment(args, cap, explicit)
    out.update(gpu_memory=gpu.memory_label(), deployment_line=deployment, weights_line=weights,
               kv_caveat=kv_caveat(args.model, gpu, args.engine, **format_kwargs(args)))
    v = vllm_record(args, cap, par)
    if v:
        out["vllm"] = v if isinstance(v, dict) else v.as_dict()
        if args.explain and not isinstance(v, dict):
            out["vllm"]["explanation"] = v.explain()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    s = cap.session
    where = cap.parallel.label()
    print(f"{out['model']} on {cap.gpu.name} ({where}), {s.tokens:,}-token sessions, counted {cap.engine}")
    print(f"  {deployment}")
    print(f"  {weights}")
    print(f"  {cap.gpu.name}: {out['gpu_memory']}")
    if cap.layout_note:
        print(f"  per GPU: {cap.layout_note}")
    share = " (the busiest GPU's share)" if cap.parallel.sessions_spread and cap.gpus > 1 else ""
    print(f"  session{share}: {fmt_size(s.growing_bytes)} growing - {fmt_size(s.prefix_hit_bytes)} prefix hits "
          f"+ {fmt_size(s.replay_bytes)} expected replay + {fmt_size(s.bounded_bytes)} bounded = {fmt_size(s.total)}")
    print(f"  usable KV per GPU ({cap.budget.engine}'s rule): {bytes_readable(cap.budget.rule)}")
    print(f"  sessions per GPU, held while decoding: {cap.sessions_per_gpu:,} ({cap.sessions_without_replay:,} "
          f"without the replay penalty); per deployment of {cap.gpus} GPU(s): {cap.sessions_per_deployment:,}")
    if cap.sessions_per_deployment == 0:
        print(f"  (one {s.tokens:,}-token session needs {fmt_size(s.total)} on a GPU, more than the "
              f"{fmt_size(cap.usable_kv_bytes)} usable: shorten the context, shard the KV or choose a smaller format)")
    if out["kv_caveat"]:
        print(f"  caveat: {out['kv_caveat']}")
    if "num_blocks" in out.get("vllm", {}):
        r = out["vllm"]
        print(f"  vLLM, reserved at admission: {r['num_blocks']:,} blocks of {r['block_tokens']:,} tokens "
              f"({fmt_size(r['bytes_per_block'])} each), {r['blocks_per_request']:,} blocks per "
              f"{r['max_model_len']:,}-token request over {len(r['groups'])} group(s): max concurrency "
              f"{r['max_concurrency']:.2f}")
        print(f"    vLLM logs: {r['logged']}")
        print(f"    held while decoding: {fmt_size(r['held_while_decoding']['bytes_per_request'])} per request -> "
              f"{r['held_while_decoding']['concurrency']:.2f} requests")
        if args.explain:
            for line in v.explain()[1:]:
                print("  " + line)
    elif "unavailable" in out.get("vllm", {}):
        print(f"  vLLM plan unavailable: {out['vllm']['unavailable']}")
    return 0


def register(sub) -> None:
    s = sub.add_parser("sessions", help="sessions per GPU and per deployment for a model, GPU and context length")
    s.add_argument("model", help="catalog name, config.json path or Hub id (ORG/NAME)")
    add_gpu(s)
    s.add_argument("--context", type=_count("--context", 1), required=True, help="tokens per session")
    s.add_argument("--prefix-hit-rate", type=_number("--prefix-hit-rate", 0, 1), default=0.0)
    add_formats(s)
    add_scheme(s, default=None, help="layout scheme (default: vllm under --engine vllm, storage otherwise)")
    add_engine(s, help="count and budget as this engine does (default: exact storage under vLLM's memory rule)")
    add_parallel(s, dp_attention=True)
    s.add_argument("--utilization", type=_number("--utilization", 0, 1, lo_open=True), default=0.9,
                   help="vLLM's gpu_memory_utilization (default 0.9)")
    s.add_argument("--memory-fraction", type=_number("--memory-fraction", 0, 1, lo_open=True), default=None,
                   help="the engine's memory fraction: SGLang mem_fraction_static (default: derived as SGLang does), "
                        "TensorRT-LLM free_gpu_memory_fraction (default 0.9)")
    s.add_argument("--weight-shards", type=_count("--weight-shards", 1), default=None,
                   help="GPUs the weights are spread over (default: the deployment's GPUs; without --tp/--pp the "
                        "smallest of 1/2/4/8 leaving half the memory)")
    s.add_argument("--weight-gb", type=_number("--weight-gb", 0, 1e6), default=None,
                   help="override the weight estimate (GB; 0 asks what a pool with no weights beside it holds)")
    s.add_argument("--activation-gb", type=_number("--activation-gb", 0, 1e6), default=4.0)
    s.add_argument("--replay-probability", type=_number("--replay-probability", 0, 1), default=1.0,
                   help="chance a turn finds its host-resident window state expired (V4.1 replay)")
    s.add_argument("--max-model-len", type=_count("--max-model-len", 1, 2**31), default=None,
                   help="vLLM's max_model_len for its plan (default: --context)")
    s.add_argument("--kv-cache-memory-bytes", type=_count("--kv-cache-memory-bytes", 1, 2**60), default=None,
                   help="KV memory handed to the engine per GPU, as vLLM's --kv-cache-memory-bytes (default: the "
                        "engine's rule on GPU memory less weights and activations)")
    s.add_argument("--max-num-batched-tokens", type=_count("--max-num-batched-tokens", 1, 2**31), default=None,
                   help="vLLM's max_num_batched_tokens (default 8192, `vllm serve` on an H100 / H200)")
    s.add_argument("--no-prefix-caching", action="store_true",
                   help="vLLM without prefix caching (hybrid state in 'none' mode)")
    s.add_argument("--no-async-scheduling", action="store_true",
                   help="vLLM with synchronous scheduling: one batch in flight instead of two")
    s.add_argument("--explain", action="store_true", help="show vLLM's plan group by group")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_sessions)
