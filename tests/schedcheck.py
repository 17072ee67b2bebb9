"""kvlab's serving simulator on the streams of tests/fixtures/vllm_scheduler.json (vLLM 0.33.0's own scheduler's
decisions), and the agreement table between the two. Run as a script to print the table:
    PYTHONPATH=$PWD python tests/schedcheck.py
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_scheduler.json"


def load():
    return json.loads(FIXTURE.read_text())["streams"]


def trace_of(s):
    """A kvlab Trace of the stream: timestamps in steps, 16-token hashed blocks (a group's shared prefix blocks share
    ids; a request's other blocks, the partial last one included, are its own)."""
    from kvlab.sim.traces import Trace
    bs = s["config"]["block_size"]
    reqs = s["requests"]
    keys, off, ids = {}, [0], []
    for i, r in enumerate(reqs):
        for j in range(math.ceil(r["prompt_tokens"] / bs)):
            k = (r["group"], j) if r["group"] >= 0 and (j + 1) * bs <= r["prefix_tokens"] else ("own", i, j)
            ids.append(keys.setdefault(k, len(keys)))
        off.append(len(ids))
    return Trace("vllm-oracle-" + s["name"], np.array([r["arrival_step"] for r in reqs], float),
                 np.array([r["prompt_tokens"] for r in reqs], np.int64),
                 np.array([r["max_tokens"] for r in reqs], np.int64), np.array(off, np.int64),
                 np.array(ids, np.int64), block_tokens=bs, source="tests/oracles/vllm_scheduler.py")


def unit_steps():
    from kvlab.serving.stepmodel import AffineStepModel
    return AffineStepModel(1.0, 0.0, 0.0, 0.0, basis="one second per step")


def kvlab_run(s):
    """Per request (rejected, first-token step, finish step, preemptions) from kvlab's simulator: a step that ends at
    time t is the oracle's step t - 1."""
    from kvlab.serving.simulator import ServeConfig, simulate_serving
    c = s["config"]
    tr = trace_of(s)
    cfg = _config(c)
    res = simulate_serving(tr, cfg, unit_steps())
    first = res.arrival_s + res.ttft_s - 1
    fin = res.arrival_s + res.e2e_s - 1
    pre = getattr(res, "request_preemptions", None)
    return res.rejected, first, fin, res.preemptions, pre


def _config(c):
    from kvlab.serving.simulator import ServeConfig
    import dataclasses
    fields = {f.name for f in dataclasses.fields(ServeConfig)}
    kw = dict(pool_tokens=c["num_blocks"] * c["block_size"], page_tokens=c["block_size"],
              max_num_batched_tokens=c["max_num_batched_tokens"], max_num_seqs=c["max_num_seqs"],
              max_model_len=c["max_model_len"],
              cache_blocks=(c["num_blocks"], 0, 0) if c["enable_prefix_caching"] else None, closed_loop=False)
    extra = dict(num_blocks=c["num_blocks"], prefix_caching=c["enable_prefix_caching"],
                 async_scheduling=c["async_scheduling"], chunked_prefill=c["enable_chunked_prefill"],
                 long_prefill_token_threshold=c["long_prefill_token_threshold"], reserve_full_isl=c["reserve_full_isl"])
    kw.update({k: v for k, v in extra.items() if k in fields})
    if "num_blocks" in fields:
        kw.pop("pool_tokens")
    return ServeConfig(**kw)


def agreement(s):
    """One row: requests equal (rejection, first-token and finish step), max / mean step difference over first-token
    and finish steps of requests both served, preemptions on both sides."""
    rej, first, fin, pre, _ = kvlab_run(s)
    pr = s["per_request"]
    equal, diffs = 0, []
    for i, o in enumerate(pr):
        if o["rejected"] or rej[i]:
            equal += bool(o["rejected"]) == bool(rej[i])
            continue
        d1, d2 = abs(first[i] - o["first_token"]), abs(fin[i] - o["finish"])
        diffs += [d1, d2]
        equal += d1 == 0 and d2 == 0
    vpre = sum(o["preemptions"] for o in pr)
    return dict(stream=s["name"], requests=len(pr), equal=equal, max_diff=float(max(diffs, default=0)),
                mean_diff=float(np.mean(diffs)) if diffs else 0.0, kvlab_preemptions=int(pre), vllm_preemptions=vpre)


def table(rows):
    out = ["| stream | requests equal | max step diff | mean step diff | preemptions kvlab / vLLM |",
           "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['stream']} | {r['equal']} / {r['requests']} | {r['max_diff']:.0f} | {r['mean_diff']:.2f} | "
                   f"{r['kvlab_preemptions']} / {r['vllm_preemptions']} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table([agreement(s) for s in load()]))
    sys.exit(0)


def assert_requests_match(res, s):
    """A ServeResult of stream `s` against vLLM's per-request decisions in the fixture: rejection, admission,
    first-token and finish steps (a step that ends at time t is the oracle's step t - 1; admission happens at the
    step's start), preemptions and prefix-hit tokens."""
    pr = s["per_request"]
    rej = np.array([o["rejected"] for o in pr])
    np.testing.assert_array_equal(res.rejected, rej)
    ok = ~rej
    step = lambda key: np.array([np.nan if o[key] is None else o[key] for o in pr], float)  # noqa: E731
    np.testing.assert_array_equal((res.arrival_s + res.ttft_s - 1)[ok], step("first_token")[ok])
    np.testing.assert_array_equal((res.arrival_s + res.e2e_s - 1)[ok], step("finish")[ok])
    np.testing.assert_array_equal((res.arrival_s + res.queue_s)[ok], step("admitted")[ok])
    np.testing.assert_array_equal(res.request_preemptions, [o["preemptions"] for o in pr])
    np.testing.assert_array_equal(res.prefix_hit_tokens[ok], [o["prefix_hit_tokens"] for o in pr if not o["rejected"]])
