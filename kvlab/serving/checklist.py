"""The 1M-token article's checklist, redone for one model on one deployment (TP, TP + DCP, DP attention ...).

Each row: the bytes the busiest GPU holds per token and per session (after prefix hits and the expected replay),
how long its uncached tail takes to restore from host DRAM against re-prefilling it, sessions per GPU and per
deployment, and the request rate those sessions allow. A deployment the engines refuse (DCP beyond TP / KV heads,
heads that do not split) is a row that says why, not a number.
"""
from __future__ import annotations

from ..checks import need_int, need_list
from ..errors import KvlabError
from .capacity import plan, request_rate
from ..hardware import get_gpu
from .parallel import Parallelism


def checklist_row(model: str, gpu: str, parallel: Parallelism, tokens: int, prefix_hit_rate: float,
                  replay_probability: float, prefill_tokens_per_s: float, decode_tokens_per_s: float,
                  tokens_per_request: int, tokens_per_s_per_session: float, **plan_kw) -> dict:
    """One model on one deployment, the checklist's steps as columns."""
    need_int("tokens", tokens, 1)  # a bad argument is raised, not reported as a deployment that does not fit
    row = {"model": model, "deployment": parallel.label(), "gpus": parallel.gpus}
    try:
        c = plan(model, gpu, tokens, prefix_hit_rate, parallel=parallel, replay_probability=replay_probability,
                 **plan_kw)
    except KvlabError as e:
        return {**row, "note": str(e).split(" (")[0]}
    s, g = c.session, get_gpu(gpu)
    tail = s.growing_bytes - s.prefix_hit_bytes  # this GPU's share of the uncached tail
    rate = request_rate(decode_tokens_per_s * c.gpus, tokens_per_request, c.sessions_per_deployment,
                        tokens_per_s_per_session)
    return {**row,
            "per_gpu_bytes_per_token": float(s.bytes_per_token),
            "whole_bytes_per_token": float(c.whole_session.bytes_per_token),
            "session_bytes_per_gpu": s.total,
            "tail_restore_s": tail / g.host_link_bytes_per_s,
            "tail_reprefill_s": (tokens - s.prefix_hit_tokens) / prefill_tokens_per_s,
            "weight_share_bytes": c.weight_share,
            "usable_kv_bytes": c.usable_kv_bytes,
            "sessions_per_deployment": c.sessions_per_deployment,
            "sessions_per_gpu": c.sessions_per_gpu,
            "requests_per_s": rate["requests_per_s"],
            "note": c.layout_note}


def deployment_table(models: list[str], gpu: str, deployments: list[Parallelism], tokens: int,
                     prefix_hit_rate: float, replay_probability: float, prefill_tokens_per_s: float,
                     decode_tokens_per_s: float, tokens_per_request: int, tokens_per_s_per_session: float,
                     **plan_kw) -> list[dict]:
    """checklist_row for every model on every deployment."""
    return [checklist_row(m, gpu, p, tokens, prefix_hit_rate, replay_probability, prefill_tokens_per_s,
                          decode_tokens_per_s, tokens_per_request, tokens_per_s_per_session, **plan_kw)
            for m in need_list("models", models, "a list of model names")
            for p in need_list("deployments", deployments, "a list of Parallelism")]
