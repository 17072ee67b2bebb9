"""The kvpress half of benchmarks/bench_presses.py, run in kvpress's own venv (.venv-kvpress: kvpress pins
transformers < 5.3):

    .venv-kvpress/bin/python benchmarks/kvpress_side.py CHECKPOINT OUT.json TOKENS STEPS PRESS[,PRESS...]

Per press: the context compressed by kvpress's own press (its forward hooks) into a DynamicCache, timed; then STEPS
one-token decode steps teacher forced on the same bytes, positions continuing from the context's length as kvpress's
pipeline does (the press is not applied while decoding), timed; and the bytes the cache's tensors hold. "dynamic":
no press, a DynamicCache holding as many tokens, the same decode steps (this transformers version's own step). Imports
nothing from kvlab: the ids are built here and in the kvlab half by the same rule (`ids`).
"""
from __future__ import annotations

import json
import sys
import time

# kvlab press name -> kvpress class (the ones both implement with the same budget rule; tests/kvpress_oracle.py)
CLASSES = {"streaming_llm": "StreamingLLMPress", "knorm": "KnormPress", "snapkv": "SnapKVPress",
           "tova": "TOVAPress", "expected_attention": "ExpectedAttentionPress", "keydiff": "KeyDiffPress",
           "cur": "CURPress"}
KEEP = 0.25  # share of the context kept


def ids(tokens: int):
    """[1, tokens] byte ids of a fixed text, repeated (the checkpoint is byte-level)."""
    import torch
    text = ("The keeper opens the east cabinet on Thursdays, the west one on Fridays, never both at once. "
            "def merge(a, b):\n    out = []\n    while a and b:\n        out.append((a if a[0] <= b[0] else b).pop(0))\n"
            "    return out + a + b\n").encode()
    b = list(text) * (tokens // len(text) + 1)
    return torch.tensor(b[:tokens])[None]


def timed_steps(step, positions) -> dict:
    """Run step(i) for each position and time each: the decode rate as steps / total time, and as one over the
    median step (`decode_tokens_per_s`, the one compared: a shared machine's stalls move a mean, not a median)."""
    times = []
    for i in positions:
        t0 = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - t0)
    return dict(decode_tokens_per_s=1 / sorted(times)[len(times) // 2],
                decode_mean_tokens_per_s=len(times) / sum(times))


def run(checkpoint: str, tokens: int, steps: int, presses: list[str]) -> dict:
    import torch
    import kvpress
    from transformers import AutoModelForCausalLM, DynamicCache
    from transformers.utils import logging
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="sdpa").eval()
    x = ids(tokens + steps)
    ctx = x[:, :tokens]
    out = {}
    for name in presses:
        cache = DynamicCache()
        if name == "dynamic":  # no press: the kept quarter prefilled uncompressed, the same decode steps
            kept = int(tokens * KEEP)
            with torch.no_grad():
                model(x[:, :kept], past_key_values=cache, use_cache=True)
                out[name] = timed_steps(lambda i: model(x[:, i:i + 1], past_key_values=cache, use_cache=True),
                                        range(kept, kept + steps))
            continue
        press = getattr(kvpress, CLASSES[name])(compression_ratio=1 - KEEP)
        with torch.no_grad():
            t0 = time.perf_counter()
            with press(model):
                model(ctx, past_key_values=cache, use_cache=True)
            prefill = time.perf_counter() - t0
            rate = timed_steps(lambda i: model(x[:, i:i + 1], past_key_values=cache, use_cache=True,
                                               position_ids=torch.tensor([[i]])), range(tokens, tokens + steps))
        held = sum(l.keys.numel() * l.keys.element_size() + l.values.numel() * l.values.element_size()
                   for l in cache.layers)
        out[name] = dict(prefill_s=prefill, held_bytes=int(held), **rate)
    return out


if __name__ == "__main__":
    checkpoint, path, tokens, steps, presses = sys.argv[1:6]
    json.dump(run(checkpoint, int(tokens), int(steps), presses.split(",")), open(path, "w"))
