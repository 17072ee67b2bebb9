"""Fit the roofline's three assumed constants to aiconfigurator and measure its error where both exist.

`fit(points)` grid-searches MEMORY_EFFICIENCY, COMPUTE_EFFICIENCY and OVERHEAD_MS for the least mean |log| error
on the fit points; `errors(points, ...)` reports the roofline's relative error on any covered points. Needs
aiconfigurator-core (the `serving` extra).
"""
from __future__ import annotations

import math

from .aiconfigurator import Aiconfigurator
from .base import Chunk, Step
from .roofline import COMPUTE_EFFICIENCY, MEMORY_EFFICIENCY, OVERHEAD_MS, Roofline

# (model, GPU, engine, TP) -> steps; the fit set first, then held-out combinations
FIT = {("qwen3-8b", "H200", "vllm", 1): [Step.decode_of(b, c) for b in (1, 8, 32, 128, 256) for c in (1024, 8192, 32768)]
       + [Step.prefill_of(t) for t in (512, 2048, 4096, 16384)] + [Step.prefill_of(1024, 8)]}
HELD_OUT = {combo: [Step.decode_of(1, 4096), Step.decode_of(32, 4096), Step.decode_of(128, 16384),
                    Step.prefill_of(4096), Step(prefill=(Chunk(2048),), decode=(4096,) * 32)]
            for combo in [("qwen3-8b", "H200", "sglang", 1), ("qwen3-8b", "H200", "trtllm", 1),
                          ("qwen3-8b", "H100", "vllm", 1), ("qwen3-8b", "B200", "vllm", 1),
                          ("llama-3.1-8b", "H200", "vllm", 1), ("llama-3.1-70b", "H100", "vllm", 4)]}


def _pairs(points: dict, **kw):
    for (model, gpu, engine, tp), steps in points.items():
        a, r = Aiconfigurator(model, gpu, engine, tp), Roofline(model, gpu, engine, tp, **kw)
        for s in steps:
            yield (model, gpu, engine, tp), s, a.step_ms(s), r


def errors(points: dict = HELD_OUT, **kw) -> list[dict]:
    """One row per point: aiconfigurator's ms, the roofline's, the relative error (roofline / aic - 1)."""
    rows = []
    for combo, s, ref, r in _pairs(points, **kw):
        est = r.step_ms(s)
        rows.append(dict(combo=combo, step=s.label(), aiconfigurator_ms=ref, roofline_ms=est, error=est / ref - 1))
    return rows


def summary(rows: list[dict]) -> dict:
    e = [abs(r["error"]) for r in rows]
    return dict(points=len(e), mean_abs_error=sum(e) / len(e), max_abs_error=max(e))


def fit(points: dict = FIT) -> dict:
    """The (memory_efficiency, compute_efficiency, overhead_ms) with the least mean |log(roofline / aic)|."""
    pairs = [(s, ref, r) for _, s, ref, r in _pairs(points)]
    parts = [(r.time(s).parts, ref) for s, ref, r in pairs]
    best = None
    for me in [x / 100 for x in range(50, 101, 2)]:
        for ce in [x / 100 for x in range(30, 101, 2)]:
            for oh in [x / 20 for x in range(0, 41)]:
                loss = 0.0
                for p, ref in parts:
                    ms = oh + max(p["memory_ms"] * p["memory_efficiency"] / me, p["compute_ms"] * p["compute_efficiency"] / ce)
                    loss += abs(math.log(ms / ref))
                if best is None or loss < best[0]:
                    best = (loss, me, ce, oh)
    return dict(memory_efficiency=best[1], compute_efficiency=best[2], overhead_ms=best[3],
                mean_abs_log_error=best[0] / len(parts),
                current=dict(memory_efficiency=MEMORY_EFFICIENCY, compute_efficiency=COMPUTE_EFFICIENCY,
                             overhead_ms=OVERHEAD_MS))
