"""`kvlab models`, `kvlab bytes` and `kvlab claims`: the byte math and the articles' audit."""
from __future__ import annotations

import json

from .args import add_scheme, count


def _num(x):
    from fractions import Fraction
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)


def cmd_models(args):
    from ..models import catalog
    from ..layout import build_layout
    rows = []
    for m in catalog():
        bpt = build_layout(m).bytes_per_token
        rows.append({"model": m.name, "family": m.family, "layers": m.num_layers, "bytes_per_token": _num(bpt),
                     "source": m.source})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    w = max(len(r["model"]) for r in rows)
    print(f"{'model':<{w}}  {'family':<8} {'layers':>6}  {'B/token (storage)':>18}")
    for r in rows:
        print(f"{r['model']:<{w}}  {r['family']:<8} {r['layers']:>6}  {r['bytes_per_token']:>18,}")
    return 0


def cmd_bytes(args):
    from ..engines import allocate
    from ..explain import fmt_bytes
    a = allocate(args.model, args.scheme, args.kv_format)
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
        "tokens": args.tokens,
        "growing_bytes": s.growing,
        "session_bounded_bytes": s.bounded,
        "session_bytes": s.total,
    }
    if args.explain:
        out["explanation"] = a.explain()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    if args.explain:
        print("\n".join(out["explanation"]))
    print(f"{out['model']}: {fmt_bytes(a.bytes_per_token)} B per token ({L.scheme}"
          + (f", {L.kv_format}" if L.kv_format else "") + f", {a.engine.name})")
    print(f"bounded state: {L.bounded_bytes:,} B; session of {args.tokens:,} tokens: {s.growing:,} B growing "
          f"+ {s.bounded:,} B bounded = {s.total:,} B")
    return 0


def cmd_claims(args):
    from dataclasses import asdict
    from ..claims import audit
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
    b = sub.add_parser("bytes", help="KV bytes per token and per session for a model")
    b.add_argument("model", help="catalog name (kvlab models) or path to a config.json")
    b.add_argument("--kv-format", default=None, help="one uniform number format for every cached component")
    add_scheme(b)
    b.add_argument("--tokens", type=count("--tokens"), default=1_000_000, help="session length (default 1,000,000)")
    b.add_argument("--explain", action="store_true", help="show the derivation step by step")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bytes)
    c = sub.add_parser("claims", help="audit the source articles' numeric claims")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_claims)
