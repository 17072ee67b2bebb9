"""The fewest GPUs that meet a latency SLO on a trace: a search over the replica count R of a deployment, each
candidate run through the serving simulator (kvlab.serving.simulator) on a step-time source, and over the
tensor-parallel size with it (GPUs = TP x PP x R; `search`).

An SLO is a set of limits on the simulator's per-run metrics ('ttft_p99=2,tpot_p99=0.05', seconds; any of ttft /
tpot / e2e at p50 / p99, and queue_mean, ttft_mean). A run meets it when no request was rejected and every limit
holds. The search doubles R until a run meets the SLO, then bisects between the last failing and the first meeting
count; latency falls with R on the traces measured here, but a router can make it non-monotone, so the answer's
neighbour R - 1 is always simulated and reported (`below`). `search` runs that search for each TP (1, 2, 4, 8 by
default) on that TP's own step times and keeps the fewest GPUs; a tie goes to the smaller TP (TIE_RULE), and a TP
is searched only up to the replica count that could still beat the best so far. Every plan keeps the best value each
SLO metric reached over its runs (`reached`), so a search that meets nothing says how close each candidate came.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..checks import need_int, need_list
from ..errors import KvlabError, ParameterError

METRICS = ("ttft_p50", "ttft_p99", "ttft_mean", "tpot_p50", "tpot_p99", "e2e_p99", "queue_mean")  # SLO keys
MAX_REPLICAS = 4096  # the search gives up past this many replicas
TP_CHOICES = (1, 2, 4, 8)  # tensor-parallel sizes `search` tries by default (one 8-GPU node at most)
TIE_RULE = "fewest GPUs; a tie goes to the smaller TP (more, smaller replicas)"


def parse_slo(text: str) -> dict:
    """'ttft_p99=2,tpot_p99=0.05' -> {'ttft_p99': 2.0, 'tpot_p99': 0.05} (seconds, each > 0)."""
    if not isinstance(text, str) or not text.strip():
        raise ParameterError("an SLO is 'metric=seconds[,metric=seconds]', e.g. ttft_p99=2,tpot_p99=0.05")
    out = {}
    for part in text.split(","):
        m = re.fullmatch(r"\s*([a-z0-9_]+)\s*=\s*([0-9.eE+-]+)\s*", part)
        if not m:
            raise ParameterError(f"SLO part {part.strip()!r}: write metric=seconds, e.g. ttft_p99=2")
        key, value = m.group(1), m.group(2)
        if key not in METRICS:
            raise ParameterError(f"SLO metric {key!r} is not one of {', '.join(METRICS)}")
        try:
            v = float(value)
        except ValueError:
            raise ParameterError(f"SLO {key}: {value!r} is not a number of seconds") from None
        if not math.isfinite(v) or v <= 0:
            raise ParameterError(f"SLO {key}: {value} must be a positive, finite number of seconds")
        if key in out:
            raise ParameterError(f"SLO metric {key} is given twice")
        out[key] = v
    return out


def meets(summary: dict, slo: dict) -> bool:
    """Whether a simulator run (ServeResult.summary()) meets every limit: nothing rejected, all requests done."""
    if summary["rejected"] or summary["completed"] < summary["requests"]:
        return False
    for k, limit in slo.items():
        v = summary.get(f"{k}_s")
        if v is not None and v > limit:  # None: no request had that metric (a TPOT with one output token each)
            return False
    return True


@dataclass
class Plan:
    """The fewest replicas meeting an SLO, and the runs that found it."""

    replicas: int | None  # fewest replicas meeting the SLO (None: none up to the search's limit, or a request
    #                       never fits one replica's KV pool)
    gpus: int | None  # replicas x GPUs per replica
    gpus_per_replica: int  # TP x PP
    slo: dict  # metric -> seconds
    metrics: dict | None  # the simulator's summary at `replicas`
    below: dict | None  # the summary at replicas - 1 (None when replicas is 1): it fails the SLO
    tried: dict = field(default_factory=dict)  # replicas -> met (every run of the search)
    why_not: str | None = None  # why no replica count meets the SLO
    reached: dict = field(default_factory=dict)  # SLO metric -> (best value over the runs, s; replicas giving it)
    tp: int = 1  # tensor-parallel size of a replica
    step_time: dict = field(default_factory=dict)  # where the runs' step times come from (stepmodel.describe)

    def to_dict(self) -> dict:
        keep = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p99_s", "queue_mean_s",
                "throughput_tokens_per_s", "goodput_requests_per_s", "token_hit_rate", "completed", "rejected",
                "requests", "gpu_seconds", "busy_gpu_seconds")
        pick = lambda s: None if s is None else {k: s.get(k) for k in keep}  # noqa: E731
        return dict(replicas=self.replicas, gpus=self.gpus, tp=self.tp, gpus_per_replica=self.gpus_per_replica,
                    slo=dict(self.slo), meets=self.replicas is not None, metrics=pick(self.metrics),
                    below=pick(self.below), tried={str(k): v for k, v in sorted(self.tried.items())},
                    why_not=self.why_not, step_time=dict(self.step_time),
                    reached={k: dict(seconds=v, replicas=r) for k, (v, r) in self.reached.items()})

    def reached_line(self) -> str:
        """'ttft_p99 3.412 s (8 replicas), tpot_p99 0.061 s (8 replicas)': the best each SLO metric reached."""
        return ", ".join(f"{k} {v:.4g} s ({r} replica{'s' if r > 1 else ''})" if v is not None else f"{k} -"
                         for k, (v, r) in self.reached.items())


def _improves(before: dict, after: dict, slo: dict, by: float = 0.01) -> bool:
    """Whether `after` (more replicas) is better than `before` by more than `by` on some failing SLO metric."""
    for k, limit in slo.items():
        a, b = before.get(f"{k}_s"), after.get(f"{k}_s")
        if a is not None and b is not None and a > limit and b < a * (1 - by):
            return True
    return False


def fewest_replicas(run, slo: dict, gpus_per_replica: int = 1, start: int = 1,
                    max_replicas: int = MAX_REPLICAS) -> Plan:
    """`run(R)` -> simulator summary for R replicas; the fewest R meeting `slo` (doubling, then bisection)."""
    if not slo:
        raise ParameterError("give at least one SLO limit")
    start = need_int("start", start, 1)
    max_replicas = need_int("max_replicas", max_replicas, start)
    seen: dict[int, dict] = {}

    def ok(r: int) -> bool:
        if r not in seen:
            seen[r] = run(r)
        return meets(seen[r], slo)

    lo, hi = 0, start  # lo fails (0: nothing tried), hi is the candidate
    while not ok(hi):
        why = None
        if seen[hi]["rejected"]:
            why = "a request never fits one replica's KV pool"
        elif hi >= max_replicas:
            why = f"not met within {max_replicas} replicas"
        elif lo and not _improves(seen[lo], seen[hi], slo):
            why = (f"doubling {lo} to {hi} replicas no longer improves {', '.join(slo)}: the step times alone "
                   "exceed the SLO")
        if why:
            return Plan(None, None, gpus_per_replica, slo, None, seen[hi], {r: meets(s, slo) for r, s in seen.items()},
                        why, best_reached(seen, slo), step_time=seen[hi].get("step_time", {}))
        lo = hi
        hi = min(2 * hi, max_replicas)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    below = None
    if hi > 1:
        ok(hi - 1)
        below = seen[hi - 1]
    return Plan(hi, hi * gpus_per_replica, gpus_per_replica, slo, seen[hi], below,
                {r: meets(s, slo) for r, s in seen.items()}, None, best_reached(seen, slo),
                step_time=seen[hi].get("step_time", {}))


def best_reached(runs: dict, slo: dict) -> dict:
    """metric -> (the lowest value it reached over the runs (None: never measured), the fewest replicas giving
    it): how close a search came to each limit."""
    out = {}
    for k in slo:
        vals = [(s.get(f"{k}_s"), r) for r, s in sorted(runs.items()) if s.get(f"{k}_s") is not None]
        out[k] = min(vals, key=lambda vr: vr[0]) if vals else (None, None)
    return out


def goodput_limits(slo: dict | None) -> dict:
    """The simulator's goodput limits (ttft_s, tpot_s) from an SLO's p99 limits."""
    slo = slo or {}
    return {k: v for k, v in (("ttft_s", slo.get("ttft_p99")), ("tpot_s", slo.get("tpot_p99"))) if v}


def plan_config(trace, base, slo: dict, *, step_model, max_replicas: int = MAX_REPLICAS) -> Plan:
    """The fewest replicas of the deployment `base` (a one-replica ServeConfig) meeting `slo` on `trace`."""
    from dataclasses import replace

    from .simulator import simulate_serving
    goodput = goodput_limits(slo)

    def run(r: int) -> dict:
        return simulate_serving(trace, replace(base, replicas=r), step_model, goodput).summary()
    p = fewest_replicas(run, slo, base.gpus_per_replica, max_replicas=max_replicas)
    p.tp = base.target.tp if base.target is not None else base.gpus_per_replica
    return p


@dataclass
class Search:
    """The fewest GPUs over tensor-parallel sizes and replica counts: one Plan per TP tried, and the best."""

    slo: dict  # metric -> seconds
    candidates: list  # [Plan] one per TP searched, in TP order
    skipped: dict  # TP -> why it was not searched (its weights do not fit, it cannot beat the best so far, ...)
    best: Plan | None  # the fewest GPUs (TIE_RULE); None: no candidate meets the SLO
    rule: str = TIE_RULE  # how the best is chosen

    def to_dict(self) -> dict:
        b = self.best
        out = dict(meets=b is not None, gpus=b.gpus if b else None, tp=b.tp if b else None,
                   replicas=b.replicas if b else None, rule=self.rule, slo=dict(self.slo),
                   candidates=[c.to_dict() for c in self.candidates], skipped={str(k): v for k, v in
                                                                              self.skipped.items()})
        if b is not None:
            out.update({k: v for k, v in b.to_dict().items() if k not in out and k != "meets"})
        return out


def search(trace, slo: dict, configure, price, tps=TP_CHOICES, pp: int = 1,
           max_replicas: int = MAX_REPLICAS) -> Search:
    """The fewest GPUs meeting `slo` on `trace` over the tensor-parallel sizes `tps` (each with its replica search):
    `configure(tp)` -> a one-replica ServeConfig of that TP (a KvlabError: the TP cannot be deployed, recorded in
    `skipped`), `price(tp)` -> its step model. A TP is searched only up to the replicas that would still use fewer
    GPUs than the best so far, so a tie keeps the smaller TP (TIE_RULE)."""
    if not slo:
        raise ParameterError("give at least one SLO limit")
    tps = [need_int("tp", t, 1, 1 << 20) for t in need_list("tps", tps, "a list of tensor-parallel sizes")]
    if not tps or len(set(tps)) != len(tps):
        raise ParameterError(f"tps must list distinct tensor-parallel sizes, got {tps!r}")
    pp = need_int("pp", pp, 1)
    max_replicas = need_int("max_replicas", max_replicas, 1)
    best, cands, skipped = None, [], {}
    for tp in sorted(tps):
        limit = max_replicas if best is None else min(max_replicas, (best.gpus - 1) // (tp * pp))
        if limit < 1:
            skipped[tp] = (f"one replica's {tp * pp} GPUs cannot beat {best.gpus} GPU{'s' if best.gpus > 1 else ''} "
                           f"at TP {best.tp}")
            continue
        try:
            base, model = configure(tp), price(tp)
        except KvlabError as e:
            skipped[tp] = str(e)
            continue
        p = plan_config(trace, base, slo, step_model=model, max_replicas=limit)
        p.tp = tp
        cands.append(p)
        if p.replicas is not None and (best is None or p.gpus < best.gpus):
            best = p
    if not cands:
        raise ParameterError("no tensor-parallel size can be deployed: " + "; ".join(f"TP {t}: {w}" for t, w in
                                                                                     skipped.items()))
    return Search(dict(slo), cands, skipped, best)


def plan_trace(trace, model: str, gpu: str, slo: dict, *, step_model, engine: str = "vllm", tp: int = 1, pp: int = 1,
               kv_format=None, hbm_gb=None, dram_gb: float = 0.0, ssd_gb: float = 0.0, ttl_s: float = math.inf,
               max_replicas: int = MAX_REPLICAS, **scheduler) -> Plan:
    """The fewest replicas of (model, gpu, engine, TP x PP, kv_format, tiers) meeting `slo` on `trace`."""
    from .simulator import deployment_config
    base = deployment_config(model, gpu, trace, engine=engine, tp=tp, pp=pp, replicas=1, kv_format=kv_format,
                             hbm_gb=hbm_gb, dram_gb=dram_gb, ssd_gb=ssd_gb, ttl_s=ttl_s, **scheduler)
    return plan_config(trace, base, slo, step_model=step_model, max_replicas=max_replicas)
