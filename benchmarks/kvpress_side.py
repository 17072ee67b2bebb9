"""The kvpress half of benchmarks/bench_presses.py, run in kvpress's own venv (.venv-kvpress: kvpress pins
transformers < 5.3) as a server driven step by step over its standard input and output:

    .venv-kvpress/bin/python benchmarks/kvpress_side.py CHECKPOINT

One JSON command a line in, one JSON answer a line out:
  {"op": "prefill", "press": NAME, "tokens": T, "steps": S}  the context (T tokens) compressed by kvpress's own
      press (its forward hooks) into a fresh DynamicCache, timed; answers {"s": seconds};
  {"op": "step", "i": I}  one teacher-forced decode step on token I, positions continuing from the context's length
      as kvpress's pipeline does (the press is not applied while decoding); answers {"s": seconds};
  {"op": "bytes"}  answers {"held_bytes": ...}, the bytes the cache's tensors hold;
  {"op": "quit"}.
Only the model call is timed, so the pipe's latency is not; the driver runs its own step between two of ours, so
both see the same moment of a shared machine. Imports nothing from kvlab: the ids are built here and in the kvlab
half by the same rule (`ids`).
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


def timed(fn) -> float:
    """Seconds one call of fn takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def serve(checkpoint: str, inp=sys.stdin, out=sys.stdout) -> None:
    import torch
    import kvpress
    from transformers import AutoModelForCausalLM, DynamicCache
    from transformers.utils import logging
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="sdpa").eval()
    x, cache = None, None
    for line in inp:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            return
        with torch.no_grad():
            if cmd["op"] == "prefill":
                tokens, name = cmd["tokens"], cmd["press"]
                x, cache = ids(tokens + cmd.get("steps", 4096)), DynamicCache()
                press = getattr(kvpress, CLASSES[name])(compression_ratio=1 - KEEP)

                def prefill():
                    with press(model):
                        model(x[:, :tokens], past_key_values=cache, use_cache=True)
                ans = dict(s=timed(prefill))
            elif cmd["op"] == "step":
                i = cmd["i"]
                pos = torch.tensor([[i]])  # positions continue from the context's length, not from the held count
                ans = dict(s=timed(lambda: model(x[:, i:i + 1], past_key_values=cache, use_cache=True,
                                                 position_ids=pos)))
            elif cmd["op"] == "bytes":
                ans = dict(held_bytes=sum(l.keys.nbytes + l.values.nbytes for l in cache.layers))
            else:
                ans = dict(error=f"unknown op {cmd['op']!r}")
        out.write(json.dumps(ans) + "\n")
        out.flush()


if __name__ == "__main__":
    serve(sys.argv[1])
