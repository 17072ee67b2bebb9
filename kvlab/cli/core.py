"""`kvlab models`, `kvlab bytes` and `kvlab claims`: the byte math and the articles' audit."""
from __future__ import annotations

import json

from .args import add_engine, add_formats, add_parallel, add_scheme, count, format_kwargs


def _num(x):
    from fractions import Fraction
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)


def cmd_models(args):
    from ..models import catalog
    from ..layout import build_layout
    rows = []
    for m in catalog():
        L = build_layout(m)
        rows.append({"model": m.name, "family": m.family, "layers": m.num_layers,
                     "bytes_per_token": _num(L.bytes_per_token), "state_bytes": L.state_bytes, "source": m.source})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    w = max(len(r["model"]) for r in rows)
    f = max(len(r["family"]) for r in rows)
    print(f"{'model':<{w}}  {'family':<{f}} {'layers':>6}  {'B/token (storage)':>18}  {'fixed state B':>14}")
    for r in rows:
        print(f"{r['model']:<{w}}  {r['family']:<{f}} {r['layers']:>6}  {r['bytes_per_token']:>18,}  "
              f"{r['state_bytes']:>14,}")
    return 0


def cmd_bytes(args):
    from ..explain import fmt_bytes
    from ..serving.parallel import Parallelism, per_gpu
    par = Parallelism(args.tp, args.dcp, args.pp)
    share = per_gpu(args.model, par, args.scheme, engine=args.engine, page_size=args.page_size, **format_kwargs(args))
    a = share.whole
    L = a.layout
    s = a.session(args.tokens)
    out = {
        "model": L.model.name,
        "family": L.model.family,
        "scheme": L.scheme,
        "kv_format": L.kv_format,
        "engine": a.engine.name,
        "bytes_per_token": _num(a.bytes_per_token),
        "exact_bytes_per_token": _num(L.bytes_per_token),
        "bounded_bytes": L.bounded_bytes,
        "state_bytes": L.state_bytes,
        "tokens": args.tokens,
        "growing_bytes": s.growing,
        "session_bounded_bytes": s.bounded,
        "session_bytes": s.total,
    }
    if a.engine.source:
        out["engine_rule"] = a.engine.source
    if par.gpus > 1:
        out.update(gpus=par.gpus, tp=par.tp, dcp=par.dcp, pp=par.pp,
                   per_gpu_bytes_per_token=_num(share.per_gpu_bytes_per_token),
                   per_gpu_exact_bytes_per_token=_num(share.per_gpu_exact_bytes_per_token),
                   per_gpu_session_bytes=share.session_bytes(args.tokens),
                   per_gpu_layers=[len(x.layout.layers) for x in share.stages],
                   components=list(share.components))
        if par.pp > 1:
            from ..layout import PP_SOURCE
            out["pp_rule"] = PP_SOURCE
    if args.explain:
        out["explanation"] = a.explain()
        if par.gpus > 1:
            out["per_gpu_explanation"] = share.busiest.explain()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    if args.explain:
        print("\n".join(out["explanation"]))
    print(f"{out['model']}: {fmt_bytes(a.bytes_per_token)} B per token ({L.scheme}"
          + (f", {L.kv_format}" if L.kv_format else "") + f", {a.engine.name})")
    print(f"bounded state: {L.bounded_bytes:,} B; session of {args.tokens:,} tokens: {s.growing:,} B growing "
          f"+ {s.bounded:,} B bounded = {s.total:,} B")
    if par.gpus > 1:
        if args.explain:
            print("\n".join(out["per_gpu_explanation"]))
        print(f"{par.label()} ({par.gpus} GPUs): the busiest GPU holds {fmt_bytes(share.per_gpu_bytes_per_token)} B "
              f"per token, {out['per_gpu_session_bytes']:,} B of the session")
        for r in share.components:
            print(f"  {r['component']}: {r['tp']}; {r['dcp']}")
    return 0


def cmd_claims(args):
    from dataclasses import asdict
    from ..report.claims import audit
    checks = audit()
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
        return 0
    for c in checks:
        computed = "-" if c.computed is None else f"{c.computed:,.4g}" if isinstance(c.computed, float) else f"{c.computed:,}"
        print(f"{c.status:<23} {computed:>14}  {c.claim}")
    return 0


def register(sub) -> None:
    m = sub.add_parser("models", help="list the model catalog")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_models)
    b = sub.add_parser("bytes", help="KV bytes per token and per session for a model (and per GPU under parallelism)")
    b.add_argument("model", help="catalog name (kvlab models), path to a config.json, or a Hub id (ORG/NAME)")
    add_formats(b)
    add_scheme(b, default=None, help="layout scheme: the model's storage formats, what vLLM allocates, or all BF16 "
                                     "(default: vllm under --engine vllm, storage otherwise)")
    add_engine(b)
    add_parallel(b)
    b.add_argument("--tokens", type=count("--tokens"), default=1_000_000, help="session length (default 1,000,000)")
    b.add_argument("--explain", action="store_true", help="show the derivation step by step")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bytes)
    c = sub.add_parser("claims", help="audit the source articles' numeric claims")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_claims)
