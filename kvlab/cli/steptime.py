"""`kvlab step-time`: the latency of one engine iteration (prefill chunks and / or decodes) for a model, GPU,
engine, TP and KV format, from aiconfigurator's data where it covers them, kvlab's roofline otherwise."""
from __future__ import annotations

import json

from ..engines import ENGINES
from .args import add_gpu, count as _count, gpu_of, number as _number


def cmd_step_time(args) -> int:
    from ..errors import ParameterError
    from ..serving.capacity import need_weights_fit
    from ..serving.native import kv_caveat
    from ..serving.stepmodel import describe_line
    from ..serving.steptime import Step, parse_decode, parse_prefill, step_time
    if args.prefill is None and args.decode is None:
        raise ParameterError("give --prefill TOKENS[xBATCH][@CACHED], --decode BATCHxCONTEXT or both")
    step = Step(prefill=parse_prefill(args.prefill) if args.prefill is not None else (),
                decode=parse_decode(args.decode) if args.decode is not None else ())
    weights = None if args.weight_gb is None else int(args.weight_gb * 1e9)
    gpu = gpu_of(args)
    src = step_time(args.model, gpu, args.engine, args.tp, args.kv_format, args.source, weights=weights)
    need_weights_fit(args.model, gpu, args.tp, weights)  # a deployment that cannot hold its weights has no step
    t = src.time(step)
    out = dict(model=args.model, gpu=gpu.name, gpu_memory=gpu.memory_label(), engine=args.engine, tp=args.tp,
               kv_format=args.kv_format, step=step.label(), **t.as_dict(), step_time=src.describe(),
               kv_caveat=kv_caveat(args.model, gpu, args.engine, args.kv_format))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{args.model} on {gpu.name}, {args.engine}, TP {args.tp}: {step.label()}: {t.ms:,.3f} ms")
    print(f"  step times: {describe_line(out['step_time'])}")
    print(f"  {t.note}")
    if out["kv_caveat"]:
        print(f"  caveat: {out['kv_caveat']}")
    return 0


def register(sub) -> None:
    from ..serving import stepsources
    s = sub.add_parser("step-time", help="latency of one engine step (aiconfigurator data or a roofline estimate)")
    s.add_argument("model", help="catalog name, config.json path or Hub id (ORG/NAME)")
    add_gpu(s)
    s.add_argument("--engine", required=True, choices=ENGINES)
    s.add_argument("--tp", type=_count("--tp", 1, 1 << 20), default=1, help="tensor-parallel size (default 1)")
    s.add_argument("--kv-format", default=None, help="KV number format (kvlab name, e.g. fp8_e4m3; default the model's)")
    s.add_argument("--prefill", default=None, help="TOKENS[xBATCH][@CACHED]: BATCH chunks of TOKENS new tokens "
                                                   "over CACHED cached ones (e.g. 4096, 1024x8, 2048@2048)")
    s.add_argument("--decode", default=None, help="BATCHxCONTEXT: BATCH decode requests at CONTEXT cached tokens")
    s.add_argument("--source", default="auto", choices=stepsources.catalog_names(),
                   help=stepsources.help_text(catalog=True))
    s.add_argument("--weight-gb", type=_number("--weight-gb", 0, 1e6, lo_open=True), default=None,
                   help="roofline: whole-model weight GB (default: data/weights.json and the config's dtype)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_step_time)
