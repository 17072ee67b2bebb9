"""vLLM 0.33.0's own v1 Scheduler, driven on seeded request streams: the oracle of kvlab's scheduler (issue 36).

Run it with the vLLM venv's python (`make oracle-vllm` does, then checks kvlab against the result):
    .venv-vllm/bin/python tests/oracles/vllm_scheduler.py tests/fixtures/vllm_scheduler.json
It is not part of kvlab's test run (vllm lives in its own venv); the fixture it writes is what CI compares kvlab's
scheduler with, step for step (tests/test_vllm_scheduler.py).

How it runs (following ../shared/reference/serving.md and vLLM's own tests, tests/v1/core/utils.py and
tests/v1/core/test_scheduler.py): a Scheduler (or AsyncScheduler, vLLM's default) built from configs alone on the CPU
platform, with a KVCacheConfig of `num_blocks` blocks and one full-attention group; the model is a directory holding
only a config.json. Time counts in steps: the requests of step t are added, then batch t is scheduled. Under
synchronous scheduling batch t's output is applied before batch t + 1 is scheduled; under async scheduling (the
engine core's batch queue of two, v1/engine/core.py step_with_batch_queue) batch t + 1 is scheduled first, then batch
t's output is applied. The fake model output samples one token for every scheduled request whose computed tokens
reach the end of its sequence (a partial prefill samples nothing); sampled token ids are unique to the request, so
only prompt blocks are shared between requests. Prompts longer than max_model_len are refused as vLLM's input
processor refuses them (v1/engine/input_processor.py _validate_model_input); outputs are capped by the scheduler.

Recorded per step: tokens scheduled per request ([prefill, decode]: a single token of a request that already has an
output token -- applied or in flight -- counts as decode), requests preempted, free blocks after scheduling, and
prefix-hit tokens of requests taken from the waiting queue; per request: rejected, first admission, first-token and
finish steps (the batch whose sampled token it is), preemptions and prefix-hit tokens at first admission.
"""
from __future__ import annotations

import json
import os
import random
import sys
import tempfile

BLOCK = 16


def stream(name, seed, n, *, arrive_every=1.0, burst=1, prompt=(20, 200), output=(1, 40), groups=0, prefix=0,
           **knobs):
    """One seeded stream: n requests; `burst` arrive together every `arrive_every` steps (on average); with `groups`
    > 0, request i belongs to group i % groups and starts with that group's first `prefix` tokens."""
    rng = random.Random(seed)
    reqs, t = [], 0.0
    for i in range(n):
        if i and i % burst == 0:
            t += rng.expovariate(1.0 / arrive_every) if arrive_every > 0 else 0.0
        p = rng.randint(*prompt)
        g = (i % groups) if groups else -1
        if g >= 0:
            p = max(p, prefix + 1)
        reqs.append(dict(arrival_step=int(t), prompt_tokens=p, max_tokens=rng.randint(*output), group=g,
                         prefix_tokens=prefix if g >= 0 else 0))
    cfg = dict(num_blocks=64, block_size=BLOCK, max_num_seqs=8, max_num_batched_tokens=128, max_model_len=2048,
               enable_prefix_caching=True, async_scheduling=True, enable_chunked_prefill=True,
               long_prefill_token_threshold=0, reserve_full_isl=True)
    cfg.update(knobs)
    return dict(name=name, seed=seed, config=cfg, requests=reqs)


STREAMS = [
    stream("plenty", 1, 40, num_blocks=4096, max_num_batched_tokens=512, max_num_seqs=16),
    stream("plenty_sync", 2, 40, num_blocks=4096, max_num_batched_tokens=512, max_num_seqs=16, async_scheduling=False),
    stream("pressured", 3, 60, arrive_every=0.5, num_blocks=48),
    stream("pressured_no_full_isl", 3, 60, arrive_every=0.5, num_blocks=48, reserve_full_isl=False),
    stream("pressured_sync", 4, 60, arrive_every=0.5, num_blocks=48, async_scheduling=False),
    stream("shared_prefix", 5, 60, arrive_every=0.7, groups=3, prefix=100, prompt=(110, 220), num_blocks=80),
    stream("shared_prefix_pressured", 6, 60, arrive_every=0.3, groups=2, prefix=160, prompt=(170, 260),
           output=(5, 60), num_blocks=56),
    stream("shared_prefix_no_caching", 6, 60, arrive_every=0.3, groups=2, prefix=160, prompt=(170, 260),
           output=(5, 60), num_blocks=56, enable_prefix_caching=False),
    stream("shared_prefix_sync", 7, 50, arrive_every=0.5, groups=4, prefix=64, prompt=(70, 200), num_blocks=60,
           async_scheduling=False),
    stream("no_chunked_prefill", 8, 40, arrive_every=0.4, prompt=(20, 200), num_blocks=64,
           max_num_batched_tokens=256, max_model_len=256, enable_chunked_prefill=False),
    stream("long_prefill_threshold", 9, 40, arrive_every=0.8, prompt=(40, 300), num_blocks=96,
           long_prefill_token_threshold=48),
    stream("max_model_len", 10, 40, arrive_every=0.8, prompt=(20, 200), output=(10, 120), num_blocks=128,
           max_model_len=160),
    stream("burst", 11, 48, arrive_every=6.0, burst=8, prompt=(16, 100), output=(1, 30), num_blocks=40,
           max_num_seqs=6),
]


def build(cfg, model_dir):
    """A Scheduler on the CPU platform for one stream's knobs (vLLM's own classes, unchanged)."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager
    model = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=cfg["max_model_len"])
    sk = dict(max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["max_num_batched_tokens"],
              max_model_len=cfg["max_model_len"], enable_chunked_prefill=cfg["enable_chunked_prefill"],
              long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
              async_scheduling=cfg["async_scheduling"], is_encoder_decoder=False)
    fields = SchedulerConfig.__dataclass_fields__
    if "scheduler_reserve_full_isl" in fields:
        sk["scheduler_reserve_full_isl"] = cfg["reserve_full_isl"]
    sk = {k: v for k, v in sk.items() if k in fields}
    sched = SchedulerConfig(**sk)
    cache = CacheConfig(block_size=cfg["block_size"], enable_prefix_caching=cfg["enable_prefix_caching"])
    vc = VllmConfig(model_config=model, device_config=DeviceConfig(device="cpu"), scheduler_config=sched,
                    cache_config=cache)
    spec = FullAttentionSpec(block_size=cfg["block_size"], num_kv_heads=1, head_size=8, dtype=torch.float16)
    kvc = KVCacheConfig(num_blocks=cfg["num_blocks"], kv_cache_tensors=[],  # the scheduler allocates no tensor
                        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    vc.cache_config.num_gpu_blocks = cfg["num_blocks"]  # as EngineCore._initialize_kv_caches sets it
    cls = AsyncScheduler if cfg["async_scheduling"] else Scheduler
    return cls(vllm_config=vc, kv_cache_config=kvc, structured_output_manager=StructuredOutputManager(vc),
               block_size=cfg["block_size"], log_stats=True), vc


def tokens_of(i, r, prefixes):
    """Prompt token ids of request i: its group's shared prefix, then tokens unique to it."""
    own = [100_000 + i * 4096 + j for j in range(r["prompt_tokens"] - r["prefix_tokens"])]
    return (prefixes[r["group"]][:r["prefix_tokens"]] if r["group"] >= 0 else []) + own


def run(s, model_dir):
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    cfg = s["config"]
    sched, vc = build(cfg, model_dir)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(cfg["block_size"], sha256)
    rng = random.Random(s["seed"] + 1000)
    prefixes = {g: [rng.randint(1, 30_000) for _ in range(4096)] for g in range(8)}
    R = len(s["requests"])
    out_req = [dict(rejected=False, admitted=None, first_token=None, finish=None, preemptions=0,
                    prefix_hit_tokens=None) for _ in range(R)]
    reqs = {}
    pending = sorted(range(R), key=lambda i: (s["requests"][i]["arrival_step"], i))
    steps, inflight = [], None
    step = 0
    done = 0
    def apply(so, sample, at):
        nonlocal done
        ids = list(so.num_scheduled_tokens)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)},
                                sampled_token_ids=[[7 + int(rid)] if sample[rid] else [] for rid in ids],
                                logprobs=None, prompt_logprobs_dict={}, pooler_output=[])
        before_out = {rid: reqs[rid].num_output_tokens for rid in ids}
        eco = sched.update_from_output(so, mro)
        for rid in ids:
            rq, i = reqs[rid], int(rid)
            if rq.num_output_tokens > before_out[rid] and out_req[i]["first_token"] is None:
                out_req[i]["first_token"] = at
            if rq.is_finished() and out_req[i]["finish"] is None:
                out_req[i]["finish"] = at
                done += 1
        return eco

    while done < R:
        while pending and s["requests"][pending[0]]["arrival_step"] <= step:
            i = pending.pop(0)
            r = s["requests"][i]
            if r["prompt_tokens"] > cfg["max_model_len"]:  # the input processor refuses it (no scheduler sees it)
                out_req[i]["rejected"] = True
                done += 1
                continue
            sp = SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True)
            req = Request(request_id=str(i), prompt_token_ids=tokens_of(i, r, prefixes), sampling_params=sp,
                          pooling_params=None, block_hasher=hasher)
            reqs[str(i)] = req
            sched.add_request(req)
        had_out = {rq.request_id: rq.num_output_tokens + rq.num_output_placeholders > 0 for rq in sched.running}
        waiting_before = {rq.request_id for rq in sched.waiting}
        so = sched.schedule()
        if cfg["async_scheduling"] and not so.num_scheduled_tokens and inflight is not None:
            # the engine core's batch queue: nothing to add, so it waits for the batch in flight, applies it and
            # schedules again at once (v1/engine/core.py step_with_batch_queue)
            apply(*inflight)
            inflight = None
            had_out = {rq.request_id: rq.num_output_tokens + rq.num_output_placeholders > 0 for rq in sched.running}
            waiting_before = {rq.request_id for rq in sched.waiting}
            so = sched.schedule()
        rec = dict(step=step, tokens={}, preempted=sorted(int(x) for x in (so.preempted_req_ids or ())),
                   free_blocks=sched.kv_cache_manager.block_pool.get_num_free_blocks(), prefix_hit={})
        sample = {}
        for rid, n in so.num_scheduled_tokens.items():
            rq = reqs[rid]
            i = int(rid)
            decode = n == 1 and rid not in waiting_before and had_out.get(rid, False)
            rec["tokens"][rid] = [0, 1] if decode else [n, 0]
            if rid in waiting_before:
                hit = rq.num_computed_tokens - n
                rec["prefix_hit"][rid] = hit
                if out_req[i]["admitted"] is None:
                    out_req[i]["admitted"] = step
                    out_req[i]["prefix_hit_tokens"] = hit
            sample[rid] = not rq.is_prefill_chunk
        for rid in rec["preempted"]:
            out_req[rid]["preemptions"] += 1
        steps.append(rec)

        if cfg["async_scheduling"]:
            if inflight is not None:
                apply(*inflight)
            inflight = (so, sample, step) if so.num_scheduled_tokens else None
        elif so.num_scheduled_tokens:
            apply(so, sample, step)
        step += 1
        if step > 100_000:
            raise RuntimeError(f"stream {s['name']} does not finish")
        if cfg["async_scheduling"] and done == R and inflight is not None:
            apply(*inflight)
    while steps and not steps[-1]["tokens"]:
        steps.pop()
    for st in steps:
        st["tokens"] = {k: v for k, v in sorted(st["tokens"].items(), key=lambda kv: int(kv[0]))}
    return dict(name=s["name"], seed=s["seed"], config=cfg, requests=s["requests"], per_request=out_req,
                steps=[[st["step"], st["tokens"], st["preempted"], st["free_blocks"], st["prefix_hit"]]
                       for st in steps if st["tokens"] or st["preempted"]])


def main(path):
    import vllm
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
                           intermediate_size=128, num_attention_heads=4, num_key_value_heads=1,
                           num_hidden_layers=1, vocab_size=200_000, max_position_embeddings=4096,
                           torch_dtype="float16"), f)
        out = [run(s, d) for s in STREAMS]
    doc = dict(vllm=vllm.__version__, step_fields=["step", "tokens {request: [prefill, decode]}", "preempted",
                                                    "free_blocks", "prefix_hit {request: tokens}"],
               streams=out)
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(f"{path}: {len(out)} streams from vLLM {vllm.__version__}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/vllm_scheduler.json")
