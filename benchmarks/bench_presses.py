"""kvlab's presses against kvpress's own (issue 21 §4): prefill-with-compression time and decode tokens/s on the
same checkpoint (data/checkpoints/qwen3-tiny, float32, SDPA), the same bytes and one torch thread each.

kvpress pins transformers < 5.3, so its half runs in .venv-kvpress (`make oracle-kvpress` builds it;
KVLAB_KVPRESS_PYTHON names another interpreter) through benchmarks/kvpress_side.py; the two sides alternate over
`ROUNDS` rounds (kvlab, then kvpress, per round), so each pair sees the same machine state, and the report gives the
medians, the per-round ratios and the ratio of the best rounds (a shared 2-core machine swings a round by 2x). A
decode rate is one over a run's median step (kvpress_side.timed_steps: a stall moves a mean, not a median). The
context (TOKENS) is compressed to a quarter in one forward, then STEPS one-token steps are teacher forced, positions
continuing from the context's length. Bytes held: measured from each cache's tensors after the run (kvlab holds the
kept FP32 tokens as attention reads them, kvlab.hf.cache.RawStream; kvpress's DynamicCache the same rows, so they
should match). Beside them, transformers' DynamicCache holding as many tokens, in each environment: the step without
any press in each transformers version, so a decode ratio splits into what the versions differ by (kvpress's
transformers < 5.3 against kvlab's) and what kvlab's cache adds over DynamicCache in the same version (the last
column). Goal: kvlab at least as fast, at no more bytes held.
Without the kvpress venv it says so and times kvlab alone.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
import kvpress_side as side  # noqa: E402

CHECKPOINT = ROOT / "data" / "checkpoints" / "qwen3-tiny"
PYTHON = Path(os.environ.get("KVLAB_KVPRESS_PYTHON", ROOT / ".venv-kvpress" / "bin" / "python"))
TOKENS, STEPS, ROUNDS = 2048, 512, 7  # context tokens, decode steps, alternating rounds
PRESSES = list(side.CLASSES)


def kvlab_run(model, name: str) -> dict:
    from kvlab.hf import make_cache
    from kvlab.hf.evaluate import held_bytes
    x = side.ids(TOKENS + STEPS)
    cache = make_cache(model, press=name, keep=side.KEEP)
    with torch.no_grad():
        t0 = time.perf_counter()
        model(x[:, :TOKENS], cache=cache, use_cache=True)
        prefill = time.perf_counter() - t0
        rate = side.timed_steps(lambda i: model(x[:, i:i + 1], cache=cache, use_cache=True),
                                range(TOKENS, TOKENS + STEPS))
    return dict(prefill_s=prefill, held_bytes=int(held_bytes(cache)), predicted_bytes=int(cache.predicted_bytes()),
                **rate)


def dynamic_run(model) -> dict:
    """transformers' own DynamicCache in kvlab's environment, holding as many tokens as a press keeps (the context's
    kept quarter, prefilled uncompressed), then the same decode steps: the step kvlab's cache is built into, with
    this transformers version (kvpress's side runs transformers < 5.3, whose per-step overhead differs)."""
    from transformers import DynamicCache
    x = side.ids(TOKENS + STEPS)
    kept = int(TOKENS * side.KEEP)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(x[:, :kept], cache=cache, use_cache=True)
        return side.timed_steps(lambda i: model(x[:, i:i + 1], cache=cache, use_cache=True),
                                range(kept, kept + STEPS))


def kvpress_run() -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "kvpress.json"
        subprocess.run([str(PYTHON), str(Path(__file__).parent / "kvpress_side.py"), str(CHECKPOINT), str(out),
                        str(TOKENS), str(STEPS), ",".join(PRESSES + ["dynamic"])], check=True,
                       env={**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
        return json.loads(out.read_text())


def main() -> None:
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32, attn_implementation="sdpa").eval()
    have = PYTHON.exists()
    if not have:
        print(f"  no kvpress venv at {PYTHON} (`make oracle-kvpress` builds it): kvlab alone")
    ours = {p: [] for p in PRESSES}
    theirs = {p: [] for p in PRESSES}
    plain, their_plain = [], []
    for _ in range(ROUNDS):
        for p in PRESSES:
            ours[p].append(kvlab_run(model, p))
        plain.append(dynamic_run(model))
        if have:
            runs = kvpress_run()
            their_plain.append(runs.pop("dynamic"))
            for p, r in runs.items():
                theirs[p].append(r)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    best = lambda rows: max(r["decode_tokens_per_s"] for r in rows)  # noqa: E731  (the least disturbed round)
    print(f"  qwen3-tiny, {TOKENS} context tokens kept to {side.KEEP:g}, {STEPS} decode steps, 1 thread, "
          f"{ROUNDS} alternating rounds (medians; ratio kvlab / kvpress per round: min-max; best: the fastest round "
          "of each, the estimate least moved by a shared machine's noise)")
    print(f"  transformers {__import__('transformers').__version__}'s DynamicCache holding the kept tokens, same "
          f"steps: {med(plain, 'decode_tokens_per_s'):.1f} tok/s median, {best(plain):.1f} best")
    if their_plain:
        tr = [x["decode_tokens_per_s"] / y["decode_tokens_per_s"] for x, y in zip(plain, their_plain)]
        print(f"  the same in kvpress's venv (its transformers): {med(their_plain, 'decode_tokens_per_s'):.1f} tok/s "
              f"median, {best(their_plain):.1f} best; kvlab's transformers / kvpress's per round "
              f"{min(tr):.2f}-{max(tr):.2f}x, best {best(plain) / best(their_plain):.2f}x: the part of any decode "
              "ratio below that no cache can change")
    print(f"  {'press':20s} {'prefill s kvlab':>15s} {'kvpress':>8s} {'speed-up':>12s}   "
          f"{'decode tok/s kvlab':>18s} {'kvpress':>8s} {'ratio':>12s} {'best ratio':>10s}  "
          f"{'bytes kvlab':>11s} {'kvpress':>9s}  {'kvlab / DynamicCache':>20s}")
    for p in PRESSES:
        a = ours[p]
        line = f"  {p:20s} {med(a, 'prefill_s'):15.3f}"
        if theirs[p]:
            b = theirs[p]
            up = [y["prefill_s"] / x["prefill_s"] for x, y in zip(a, b)]
            dr = [x["decode_tokens_per_s"] / y["decode_tokens_per_s"] for x, y in zip(a, b)]
            line += (f" {med(b, 'prefill_s'):8.3f} {min(up):5.2f}-{max(up):<5.2f}x   "
                     f"{med(a, 'decode_tokens_per_s'):18.1f} {med(b, 'decode_tokens_per_s'):8.1f} "
                     f"{min(dr):5.2f}-{max(dr):<5.2f}x {best(a) / best(b):9.2f}x  "
                     f"{a[0]['held_bytes']:11,d} {b[0]['held_bytes']:9,d}")
        else:
            line += f" {'-':>8s} {'-':>12s}   {med(a, 'decode_tokens_per_s'):18.1f}"
        same = [x["decode_tokens_per_s"] / y["decode_tokens_per_s"] for x, y in zip(a, plain)]
        line += f"  {statistics.median(same):8.2f}x median"
        if a[0]["held_bytes"] != a[0]["predicted_bytes"]:
            line += "  (kvlab held != predicted)"
        print(line)


if __name__ == "__main__":
    main()
