"""aiconfigurator's own answer to "how many GPUs meet this SLO", beside kvlab's simulated one (issue 22 §3).

NVIDIA's aiconfigurator (PyPI `aiconfigurator` 0.12.0, Apache-2.0, over aiconfigurator-core's measured kernel data)
sizes a deployment from one average request: `aiconfigurator.cli.cli_recommend(model, system, target_request_rate=,
isl=, osl=, ttft=, tpot=, prefix=)` sweeps each worker's parallelism and batch size, keeps the configurations whose
average request meets the TTFT / TPOT targets, and divides the target rate by a worker's steady-state rate
(cli/api.py; `replicas_needed`, `total_gpus_needed`). No queue forms, arrivals never bunch, every request has the mean
lengths and the prefix cache hits the same `prefix` tokens of each. kvlab's plan simulates the trace itself
(kvlab.serving.plan): percentiles of queued requests, bursts, each request's own lengths and prefix hits through the
tiers. `recommend` asks aiconfigurator with the trace's mean lengths, the request rate kvlab's planned run served and
the prefix tokens it hit on average, so what remains between the two answers is what the average model leaves out;
`differences` measures those parts on the trace and the run.
"""
from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass

import numpy as np

from ..checks import need_number
from ..models import load_model
from .steptime.aiconfigurator import MODEL_IDS, PINNED, SYSTEMS, quiet

VERSION = PINNED  # the aiconfigurator release whose cli_recommend this calls (the `serving` extra pins it)


def available() -> bool:
    """True when aiconfigurator's CLI package (not only its core) is importable."""
    try:
        return importlib.util.find_spec("aiconfigurator.cli") is not None
    except ModuleNotFoundError:
        return False


@dataclass(frozen=True)
class SteadyAnswer:
    """aiconfigurator's fewest GPUs for an SLO at a steady request rate of average requests."""

    gpus: int | None  # total_gpus_needed, aggregated serving (None: it found no configuration, or it was not asked)
    replicas: int | None  # replicas_needed of its best aggregated worker
    tp: int | None  # that worker's tensor-parallel size
    ttft_s: float | None  # the average request's TTFT there (aiconfigurator's estimate)
    tpot_s: float | None  # and its TPOT
    disagg_gpus: int | None  # its answer with prefill and decode on separate workers
    rate_per_s: float  # target request rate given
    isl: int  # mean input tokens given
    osl: int  # mean output tokens given
    prefix: int  # prefix-cache tokens per request given
    why_not: str | None = None  # why there is no answer (not installed, not covered, no configuration)

    def to_dict(self) -> dict:
        return asdict(self)


def why_not(model, gpu: str, engine: str, kv_format: str | None) -> str | None:
    """None when aiconfigurator's recommend covers the combination, else why not, in one clause."""
    if not available():
        return f"aiconfigurator is not installed (pip install aiconfigurator=={VERSION}, in kvlab[serving])"
    if kv_format not in (None, "bf16"):
        return f"aiconfigurator's recommend prices the model's own KV dtype only, not {kv_format}"
    from .steptime.aiconfigurator import why_not as step_why_not  # its model, GPU and support-matrix coverage
    return step_why_not(model, gpu, engine, 1, None)


def recommend(model, gpu: str, engine: str, slo: dict, rate_per_s: float, isl: float, osl: float,
              prefix: float = 0.0, kv_format: str | None = None) -> SteadyAnswer:
    """aiconfigurator's fewest GPUs meeting `slo` (its ttft / tpot limits, seconds; any percentile is read as its
    average request's) at `rate_per_s` requests of `isl` / `osl` mean tokens, `prefix` of them prefix-cache hits."""
    need_number("steady request rate (requests/s)", rate_per_s, 0.0, lo_open=True)
    isl_i, osl_i = max(1, round(isl)), max(1, round(osl))
    prefix_i = min(max(0, round(prefix)), isl_i - 1)
    base = dict(rate_per_s=float(rate_per_s), isl=isl_i, osl=osl_i, prefix=prefix_i)
    empty = dict(gpus=None, replicas=None, tp=None, ttft_s=None, tpot_s=None, disagg_gpus=None)
    reason = why_not(model, gpu, engine, kv_format)
    ttft = next((v for k, v in slo.items() if k.startswith("ttft")), None)
    tpot = next((v for k, v in slo.items() if k.startswith("tpot")), None)
    if reason is None and (ttft is None or tpot is None):
        reason = "aiconfigurator's recommend needs both a TTFT and a TPOT limit"
    if reason:
        return SteadyAnswer(**empty, **base, why_not=reason)
    with quiet():  # its loaders' logs, its stdout and its deprecation notices (sweep_agg -> aisimulate) kept away
        from aiconfigurator.cli import cli_recommend
        r = cli_recommend(model_path=MODEL_IDS[load_model(model).name], system=SYSTEMS[str(gpu).upper()],
                          backend=engine, target_request_rate=float(rate_per_s), isl=isl_i, osl=osl_i,
                          prefix=prefix_i, ttft=ttft * 1e3, tpot=tpot * 1e3, top_n=1)
    agg = (r.best_latencies or {}).get("agg") or {}
    dis = (r.best_latencies or {}).get("disagg") or {}
    rows = (r.best_configs or {}).get("agg")
    tp = int(rows.iloc[0]["tp"]) if rows is not None and len(rows) and "tp" in rows.columns else None
    seconds = lambda k: None if agg.get(k) is None else float(agg[k]) / 1e3  # noqa: E731  (it reports ms)
    if not agg.get("total_gpus_needed"):
        return SteadyAnswer(**empty, **base, why_not="aiconfigurator found no aggregated configuration meeting the SLO")
    return SteadyAnswer(gpus=int(agg["total_gpus_needed"]), replicas=int(agg["replicas_needed"]), tp=tp,
                        ttft_s=seconds("ttft"), tpot_s=seconds("tpot"),
                        disagg_gpus=int(dis["total_gpus_needed"]) if dis.get("total_gpus_needed") else None, **base)


def trace_means(trace) -> dict:
    """The average request aiconfigurator sizes for: mean input and output tokens of the trace's requests."""
    return dict(isl=float(np.mean(trace.input_tokens)), osl=float(np.mean(trace.output_tokens)))


def differences(trace, metrics: dict, window_s: float = 60.0) -> dict:
    """What the average-request model leaves out, measured on the trace and on kvlab's planned run: the busiest
    `window_s` against the mean arrival rate (bursts), the input lengths' p99 against their mean (spread), the
    run's TTFT and TPOT p99 against their means (queueing tails), and the share of input tokens its prefix cache
    hit (each request differently; aiconfigurator is given the mean)."""
    t = np.asarray(trace.timestamps, dtype=np.float64)
    span = _span(t)
    peak = None
    if span > window_s:
        ends = np.searchsorted(t, t + window_s, side="left")
        peak = float((ends - np.arange(len(t))).max() / window_s / (len(t) / span))
    inp = np.asarray(trace.input_tokens, dtype=np.float64)
    ratio = lambda a, b: None if a is None or not b else a / b  # noqa: E731
    m = metrics or {}
    return dict(burst_peak_to_mean=peak, burst_window_s=window_s,
                input_p99_to_mean=float(np.percentile(inp, 99) / inp.mean()) if inp.mean() else None,
                ttft_p99_to_mean=ratio(m.get("ttft_p99_s"), m.get("ttft_mean_s")),
                token_hit_rate=m.get("token_hit_rate"))


def _span(t: np.ndarray) -> float:
    """Seconds from the first arrival to the last (0 for fewer than two)."""
    return float(t.max() - t.min()) if len(t) > 1 else 0.0


def arrival_rate(trace) -> float:
    """Requests per second over the trace's arrival span (0 for a trace of one instant)."""
    t = np.asarray(trace.timestamps, dtype=np.float64)
    span = _span(t)
    return len(t) / span if span > 0 else 0.0


def beside_plan(trace, plan, model, gpu: str, engine: str, kv_format: str | None = None) -> dict:
    """aiconfigurator's answer for the trace's mean request at the rate kvlab's planned run served, with the
    prefix tokens it hit on average, and the measured differences (no SLO met: at the trace's arrival rate, with
    no prefix hits); {'why_not': ...} when it cannot be asked."""
    m = plan.metrics
    means = trace_means(trace)
    rate = (m or {}).get("throughput_requests_per_s") or arrival_rate(trace)
    if rate <= 0:
        return dict(why_not="neither kvlab's run nor the trace gives a request rate to size for")
    hits = (m or {}).get("token_hit_rate") or 0.0
    a = recommend(model, gpu, engine, plan.slo, rate, means["isl"], means["osl"], prefix=hits * means["isl"],
                  kv_format=kv_format)
    return dict(a.to_dict(), kvlab_gpus=plan.gpus, rate_from="kvlab's planned run" if m else "the trace's arrivals",
                differences=differences(trace, m or (plan.below or {})))
