"""`kvlab step-time`: the latency of one engine iteration (prefill chunks and / or decodes) for a model, GPU,
engine, TP and KV format, from aiconfigurator's data where it covers them, kvlab's roofline otherwise."""
from __future__ import annotations

import json

from ..engines import ENGINES
from .args import count as _count, number as _number


def cmd_step_time(args) -> int:
    from ..serving.steptime import Step, parse_decode, parse_prefill, step_time
    from ..errors import ParameterError
    if args.prefill is None and args.decode is None:
        raise ParameterError("give --prefill TOKENS[xBATCH][@CACHED], --decode BATCHxCONTEXT or both")
    step = Step(prefill=parse_prefill(args.prefill) if args.prefill else (),
                decode=parse_decode(args.decode) if args.decode else ())
    weights = None if args.weight_gb is None else int(args.weight_gb * 1e9)
    src = step_time(args.model, args.gpu, args.engine, args.tp, args.kv_format, args.source, weights=weights)
    t = src.time(step)
    out = dict(model=args.model, gpu=args.gpu, engine=args.engine, tp=args.tp, kv_format=args.kv_format,
               step=step.label(), **t.as_dict())
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    kind = "estimate" if t.estimate else "aiconfigurator data"
    print(f"{args.model} on {args.gpu}, {args.engine}, TP {args.tp}: {step.label()}: {t.ms:,.3f} ms ({t.source}, {kind})")
    print(f"  {t.note}")
    return 0


def register(sub) -> None:
    s = sub.add_parser("step-time", help="latency of one engine step (aiconfigurator data or a roofline estimate)")
    s.add_argument("model", help="catalog name, config.json path or Hub id (ORG/NAME)")
    s.add_argument("--gpu", required=True, help="H100, H200, B200, MI300X, L40S (data/hardware.json)")
    s.add_argument("--engine", required=True, choices=ENGINES)
    s.add_argument("--tp", type=_count("--tp", 1, 1 << 20), default=1, help="tensor-parallel size (default 1)")
    s.add_argument("--kv-format", default=None, help="KV number format (kvlab name, e.g. fp8_e4m3; default the model's)")
    s.add_argument("--prefill", default=None, help="TOKENS[xBATCH][@CACHED]: BATCH chunks of TOKENS new tokens "
                                                   "over CACHED cached ones (e.g. 4096, 1024x8, 2048@2048)")
    s.add_argument("--decode", default=None, help="BATCHxCONTEXT: BATCH decode requests at CONTEXT cached tokens")
    s.add_argument("--source", default="auto", choices=("auto", "aiconfigurator", "roofline"),
                   help="auto: aiconfigurator where it covers the combination, the roofline otherwise")
    s.add_argument("--weight-gb", type=_number("--weight-gb", 0, 1e6, lo_open=True), default=None,
                   help="roofline: whole-model weight GB (default: data/weights.json and the config's dtype)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_step_time)
