"""`kvlab measure`: build a model's packed cache and compare measured bytes with predicted."""
from __future__ import annotations

import json

from .args import add_scheme, count


def register(sub) -> None:
    p = sub.add_parser("measure", help="build a model's packed KV cache and measure its bytes against the math")
    p.add_argument("model", help="catalog name (kvlab models) or path to a config.json")
    p.add_argument("--tokens", type=count("--tokens"), required=True, help="session length")
    p.add_argument("--kv-format", default=None, help="one uniform number format for every cached component")
    add_scheme(p, "storage / bf16: exact storage; vllm: paged as vLLM allocates (kvlab.engines)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (auto: cuda when available)")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler cross-check on CPU")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_measure)


def cmd_measure(args) -> int:
    from ..cache.measurement import measure_cache
    m = measure_cache(args.model, args.tokens, args.scheme, args.kv_format,
                      paged=args.scheme == "vllm", device=args.device, profile=not args.no_profile)
    if args.json:
        print(json.dumps(m.as_dict(), indent=2))
        return 0
    print(f"{m.model} ({m.scheme}{', ' + m.kv_format if m.kv_format else ''}, {m.engine}) on {m.device}, "
          f"{m.tokens:,} tokens")
    print(f"  measured  {m.measured_bytes:>16,} B  ({m.measured_growing_bytes:,} growing + "
          f"{m.measured_bounded_bytes:,} bounded; {m.method})")
    print(f"  predicted {m.predicted_bytes:>16,} B  ({m.predicted_growing_bytes:,} growing + "
          f"{m.predicted_bounded_bytes:,} bounded)")
    print(f"  difference {m.difference_bytes:>15,} B  (predicted rounding {m.predicted_rounding_bytes:,} B): {m.cause}")
    if m.check_bytes is not None:
        print(f"  check ({m.check_method}): {m.check_bytes:,} B")
    return 0 if m.exact else 1
