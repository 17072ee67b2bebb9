"""kvlab's presses against kvpress's own (issue 21 §4): prefill-with-compression time and decode speed on the same
checkpoint (data/checkpoints/qwen3-tiny, float32, SDPA), the same input, the same bytes and one torch thread each.

kvpress pins transformers < 5.3, so its half runs in .venv-kvpress (`make oracle-kvpress` builds it;
KVLAB_KVPRESS_PYTHON names another interpreter) as a server (benchmarks/kvpress_side.py) this script drives step by
step. The context (TOKENS) is compressed to a quarter in one forward, then STEPS one-token steps are teacher forced,
positions continuing from the context's length; each step is taken three times in turn, in a rotating order:

  kvlab     kvlab's cache with the press (kvlab's transformers);
  dynamic   transformers' DynamicCache after the same context forward, cut to as many tokens, in kvlab's environment
            (the step kvlab's cache is built into: what kvlab's cache adds over it is the kvlab / dynamic ratio);
  kvpress   kvpress's DynamicCache after its press, in its environment (transformers < 5.3).

A shared 2-core machine moves a step's time by 2x within seconds; taking the three steps back to back puts each pair
in the same moment, so per-step ratios cancel what the machine does to both. The report gives each ratio as the
median over steps with its moving-block bootstrap 95% interval (kvlab.stats.median_interval: neighbouring steps move
together), > 1 meaning kvlab faster; dynamic / kvpress is what the two transformers versions differ by, the part of
kvlab / kvpress no cache can change. Prefill: the two presses' compressions alternate `ROUNDS` times (medians, the
per-round ratio's range). Bytes held: measured from each cache's tensors after the steps (kvlab holds the kept FP32
tokens as attention reads them, kvlab.hf.cache.RawStream; kvpress's DynamicCache the same rows). Goal: kvlab at least
as fast, at no more bytes held. Without the kvpress venv it says so and compares kvlab with DynamicCache alone.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
import kvpress_side as side  # noqa: E402

from kvlab.hf.presses import PRESSES as REGISTRY  # noqa: E402

CHECKPOINT = ROOT / "data" / "checkpoints" / "qwen3-tiny"
PYTHON = Path(os.environ.get("KVLAB_KVPRESS_PYTHON", ROOT / ".venv-kvpress" / "bin" / "python"))
TOKENS, STEPS, ROUNDS = 2048, 256, 3  # context tokens, decode steps a round, rounds
BLOCK = 32  # steps resampled together by the bootstrap
# kvlab's registry, in its order, less the presses kvpress_side has no kvpress class for (it runs in kvpress's venv and
# cannot import kvlab: tests/test_press_composed.py checks its names against the registry)
PRESSES = [name for name in REGISTRY if name in side.CLASSES]


class Peer:
    """kvpress's side: a server in its own venv answering one command a line (kvpress_side.serve)."""

    def __init__(self):
        env = {**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([str(PYTHON), str(Path(__file__).parent / "kvpress_side.py"), str(CHECKPOINT)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"kvpress's side ({PYTHON}) stopped; run it by hand to see why")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def compare(ours, sdpa, peer, press: str, order: int) -> dict:
    """One round of one press: both prefills (order alternating), then STEPS steps of each side back to back."""
    from transformers import DynamicCache
    from kvlab.hf import make_cache
    from kvlab.hf.evaluate import held_bytes
    x = side.ids(TOKENS + STEPS)
    kept = int(TOKENS * side.KEEP)
    cache = make_cache(ours, press=press, keep=side.KEEP)
    dyn = DynamicCache(config=sdpa.config)
    out = {}
    with torch.no_grad():  # DynamicCache: the same context forward, then cut to the kept count in storage of its own
        sdpa(x[:, :TOKENS], cache=dyn, use_cache=True)  # (a 512-token prefill instead leaves the allocator in another
        dyn.crop(kept - TOKENS)  # state: its steps ran 4% faster than after this one, measured)
        for layer in dyn.layers:
            layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        sides = [("kvlab", lambda: side.timed(lambda: ours(x[:, :TOKENS], cache=cache, use_cache=True)))]
        if peer:
            sides.append(("kvpress", lambda: peer.ask(op="prefill", press=press, tokens=TOKENS, steps=STEPS)["s"]))
        for name, run in sides[::1 - 2 * (order % 2)]:
            out[f"{name}_prefill_s"] = run()
        steps = {
            "kvlab": lambda i: side.timed(lambda: ours(x[:, i:i + 1], cache=cache, use_cache=True)),
            "dynamic": lambda i: side.timed(lambda: sdpa(x[:, i - TOKENS + kept:i - TOKENS + kept + 1], cache=dyn,
                                                         use_cache=True)),
        }
        if peer:
            steps["kvpress"] = lambda i: peer.ask(op="step", i=i)["s"]
        names = list(steps)
        times = {n: [] for n in names}
        for j, i in enumerate(range(TOKENS, TOKENS + STEPS)):
            for k in range(len(names)):  # a rotating order: no side always goes first
                n = names[(j + k) % len(names)]
                times[n].append(steps[n](i))
    out.update(times=times, held_bytes=int(held_bytes(cache)), predicted_bytes=int(cache.predicted_bytes()),
               dynamic_bytes=sum(l.keys.nbytes + l.values.nbytes for l in dyn.layers))
    if peer:
        out["kvpress_bytes"] = peer.ask(op="bytes")["held_bytes"]
    return out


def main() -> None:
    from transformers import AutoModelForCausalLM
    from kvlab.stats import median_interval
    torch.set_num_threads(1)
    load = lambda: AutoModelForCausalLM.from_pretrained(  # noqa: E731
        CHECKPOINT, dtype=torch.float32, attn_implementation="sdpa").eval()
    ours, sdpa = load(), load()  # make_cache switches `ours` to kvlab's attention; `sdpa` stays as loaded
    peer = Peer() if PYTHON.exists() else None
    if peer is None:
        print(f"  no kvpress venv at {PYTHON} (`make oracle-kvpress` builds it): kvlab against DynamicCache alone")
    runs = {p: [] for p in PRESSES}
    try:
        for r in range(ROUNDS):
            for p in PRESSES:
                runs[p].append(compare(ours, sdpa, peer, p, r))
    finally:
        if peer:
            peer.close()

    def ratio(p, a, b):
        """Median over every step of b's time / a's (> 1: a faster), with its block-bootstrap interval."""
        v = [y / x for run in runs[p] for x, y in zip(run["times"][a], run["times"][b])]
        return median_interval(v, block=BLOCK)

    iv = lambda i: f"{i.value:.3f} [{i.low:.3f}, {i.high:.3f}]"  # noqa: E731
    med = lambda p, k: statistics.median(r[k] for r in runs[p])  # noqa: E731
    rate = lambda p, n: 1 / statistics.median(t for r in runs[p] for t in r["times"][n])  # noqa: E731
    print(f"  qwen3-tiny, {TOKENS} context tokens kept to {side.KEEP:g}, {STEPS} decode steps x {ROUNDS} rounds, 1 "
          f"thread; decode: each step taken by every side back to back, ratios = median over steps of the other's "
          f"step time / kvlab's (> 1: kvlab faster) with a {BLOCK}-step block bootstrap 95% interval")
    if peer:
        v = median_interval([y / x for p in PRESSES for run in runs[p]
                             for x, y in zip(run["times"]["dynamic"], run["times"]["kvpress"])], block=BLOCK)
        print(f"  transformers {__import__('transformers').__version__} (kvlab's) against kvpress's transformers, "
              f"DynamicCache holding the same tokens: dynamic / kvpress {iv(v)} over every press's steps (> 1: "
              "kvlab's version faster)")
    head = f"  {'press':19s} {'prefill s kvlab':>15s}"
    if peer:
        head += f" {'kvpress':>8s} {'speed-up':>12s}"
    head += f"   {'decode tok/s kvlab':>18s} {'dynamic':>8s}"
    if peer:
        head += f" {'kvpress':>8s} {'kvlab vs kvpress':>24s}"
    head += f" {'kvlab vs dynamic':>24s}   {'bytes kvlab':>11s}"
    print(head + (f" {'kvpress':>9s}" if peer else "") + f" {'dynamic':>9s}")
    for p in PRESSES:
        line = f"  {p:19s} {med(p, 'kvlab_prefill_s'):15.3f}"
        if peer:
            up = [r["kvpress_prefill_s"] / r["kvlab_prefill_s"] for r in runs[p]]
            line += f" {med(p, 'kvpress_prefill_s'):8.3f} {min(up):5.2f}-{max(up):<5.2f}x"
        line += f"   {rate(p, 'kvlab'):18.1f} {rate(p, 'dynamic'):8.1f}"
        if peer:
            line += f" {rate(p, 'kvpress'):8.1f} {iv(ratio(p, 'kvlab', 'kvpress')):>24s}"
        run = runs[p][0]
        line += f" {iv(ratio(p, 'kvlab', 'dynamic')):>24s}   {run['held_bytes']:11,d}"
        line += (f" {run['kvpress_bytes']:9,d}" if peer else "") + f" {run['dynamic_bytes']:9,d}"
        if run["held_bytes"] != run["predicted_bytes"]:
            line += "  (kvlab held != predicted)"
        print(line)


if __name__ == "__main__":
    main()
