"""Which part of Gemma-3-270M's cache makes NVFP4 lose where MXFP4 holds: keys or values, full or sliding layers.

    .venv/bin/python examples/gemma_fp4_split.py [--tokens 4096] [--samples 16] [--out FILE.json]

niah_single_2, question-agnostic, seed 0 (the samples of examples/sweep-10-gemma.yaml's grid), every answer greedy
to its end (RULER's 128 new tokens): BF16, NVFP4 and MXFP4 for K and V, each format on K alone and on V alone, and
NVFP4 on the three full-attention layers alone and on the 15 sliding ones alone (`make_cache(per_layer=...)`).
Measured 2026-12-06 on 2 shared cores: 3,793 s at 4,096 tokens (docs/quality.md has the figures).
"""
from __future__ import annotations

import argparse
import json
import time

from kvlab.hf.evaluate import load
from kvlab.hf.pretrained import resolve_model
from kvlab.hf.quality import Setting
from kvlab.quality.evaluate import evaluate_task
from kvlab.stats import wilson


def settings(layer_types: list[str]) -> list[Setting]:
    """The split: whole formats, each on K or V alone, NVFP4 on one kind of layer alone (the rest BF16)."""
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    sliding = [i for i, t in enumerate(layer_types) if t != "full_attention"]
    only = lambda layers: {i: {"kv_format": "nvfp4"} for i in layers}  # noqa: E731
    return [Setting("bf16", "kvlab", {"kv_format": "bf16"}),
            Setting("nvfp4", "kvlab", {"kv_format": "nvfp4"}),
            Setting("mxfp4", "kvlab", {"kv_format": "mxfp4"}),
            Setting("nvfp4 K only", "kvlab", {"k_format": "nvfp4", "v_format": "bf16"}),
            Setting("nvfp4 V only", "kvlab", {"k_format": "bf16", "v_format": "nvfp4"}),
            Setting("nvfp4 on the full layers only", "kvlab", {"kv_format": "bf16", "per_layer": only(full)}),
            Setting("nvfp4 on the sliding layers only", "kvlab", {"kv_format": "bf16", "per_layer": only(sliding)}),
            Setting("mxfp4 K only", "kvlab", {"k_format": "mxfp4", "v_format": "bf16"}),
            Setting("mxfp4 V only", "kvlab", {"k_format": "bf16", "v_format": "mxfp4"})]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096, help="context tokens per sample")
    ap.add_argument("--samples", type=int, default=16, help="niah_single_2 samples (seed 0)")
    ap.add_argument("--out", help="write every setting's verdicts and texts here (JSON)")
    a = ap.parse_args(argv)
    model, tok = load(str(resolve_model("gemma-3-270m")))
    t = time.perf_counter()
    run = evaluate_task(model, tok, "niah_single_2", a.tokens, settings(model.config.layer_types), seed=0,
                        samples=a.samples, halfwidth=None, progress=True)
    wall = time.perf_counter() - t
    for label, s in run.scores.items():
        lo, hi = wilson(s.right, s.n)
        print(f"{label:34s} {s.right:2d}/{s.n} {s.accuracy:.2f} [{lo:.2f}, {hi:.2f}]")
    print(f"{wall:,.0f} s")
    if a.out:
        out = {label: {"right": s.right, "n": s.n, "verdicts": [x.right for x in s.answers],
                       "texts": [x.text for x in s.answers]} for label, s in run.scores.items()}
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump({"tokens": a.tokens, "wall_s": round(wall, 1), "settings": out}, f, indent=1)


if __name__ == "__main__":
    main()
