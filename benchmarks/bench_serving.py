"""The serving simulator at scale: the synthetic million-request stream through one deployment, and `kvlab plan`
on Mooncake's conversation trace, each beside the step-by-step event loop it fast-forwards.

  stream      bench_policies' synthetic million-request stream (kvlab's seeded agent workload, about 1,000,000
              block accesses in 28,789 requests), Qwen3-8B on one H200 replica under vLLM's rules, closed loop
  fast        kvlab.serving.simulator.simulate_serving as it runs by default: decode-only stretches applied up to
              the next event at once, their step times priced in one vectorized call
  step loop   the same run with fast_forward=False (one event per engine step), on the stream's first
              STEP_LOOP_REQUESTS requests (the whole stream takes it about ten minutes); both runs' figures are
              asserted equal there
  plan        `kvlab plan mooncake-conversation --model qwen3-8b --gpu h200 --slo ttft_p99=2,tpot_p99=0.05`'s search
              (plan_config, without aiconfigurator's steady-state answer beside it), when the trace is present
Step times: aiconfigurator's data where installed (step_time source "auto"), and the roofline.
Goals (issue 22): the stream in < 60 s on 2 cores; the Mooncake plan in < 5 minutes.
"""
from __future__ import annotations

import os
import time

import numpy as np

STEP_LOOP_REQUESTS = int(os.environ.get("KVLAB_BENCH_STEP_LOOP_REQUESTS", "3000"))
MODEL, GPU, ENGINE = "qwen3-8b", "h200", "vllm"


def _run(tr, source: str, fast: bool):
    from kvlab.serving.simulator import deployment_config, simulate_serving
    from kvlab.serving.steptime import step_time
    cfg = deployment_config(MODEL, GPU, tr, engine=ENGINE)
    model = step_time(MODEL, GPU, ENGINE, source=source)
    t = time.perf_counter()
    r = simulate_serving(tr, cfg, model, fast_forward=fast)
    return time.perf_counter() - t, r, getattr(model, "name", source)


def main() -> None:
    from benchmarks.bench_policies import million_request_trace
    from kvlab.serving.plan import parse_slo, plan_config
    from kvlab.serving.simulator import deployment_config
    from kvlab.serving.steptime import step_time
    from kvlab.sim.traces import have_trace, load_trace

    t = time.perf_counter()
    stream = million_request_trace()
    print(f"synthetic million-request stream: {len(stream):,} requests, {int(stream.block_offsets[-1]):,} block "
          f"accesses, generated in {time.perf_counter() - t:.1f} s (not timed below)")
    head = stream.head(STEP_LOOP_REQUESTS)
    for source in ("auto", "roofline"):
        s_fast, r_fast, name = _run(head, source, True)
        s_loop, r_loop, _ = _run(head, source, False)
        assert r_fast.summary() == r_loop.summary(), "fast-forward and step loop differ"
        for f in ("ttft_s", "tpot_s", "e2e_s"):
            assert np.array_equal(getattr(r_fast, f), getattr(r_loop, f), equal_nan=True), f
        s_all, r_all, _ = _run(stream, source, True)
        sm = r_all.summary()
        print(f"{name:>14}: first {len(head):,} requests ({r_fast.steps:,} steps) fast {s_fast:.2f} s, step loop "
              f"{s_loop:.2f} s ({s_loop / s_fast:.1f}x, same figures); whole stream {len(stream):,} requests, "
              f"{r_all.steps:,} steps in {s_all:.1f} s (goal < 60 s), TTFT p99 {sm['ttft_p99_s']:.3f} s")
    if not have_trace("mooncake-conversation"):
        print("plan: Mooncake's conversation trace is not here (kvlab traces fetch mooncake-conversation): skipped")
        return
    tr = load_trace("mooncake-conversation")
    cfg = deployment_config(MODEL, GPU, tr, engine=ENGINE)
    model = step_time(MODEL, GPU, ENGINE, source="auto")
    t = time.perf_counter()
    p = plan_config(tr, cfg, parse_slo("ttft_p99=2,tpot_p99=0.05"), step_model=model)
    d = p.to_dict()
    print(f"plan on {tr.name} ({len(tr):,} requests, {getattr(model, 'name', 'auto')} step times): "
          f"{time.perf_counter() - t:.1f} s (goal < 300 s); replicas {d['replicas']}, tried {d['tried']}")


if __name__ == "__main__":
    main()
