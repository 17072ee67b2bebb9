"""Answering throughput on the real model: kvlab's evaluation against plain transformers and kvpress's pipeline.

The same N samples (niah_single_2 at 1,024 tokens, kvlab.quality.tasks, seed 0; SmolLM2-135M-Instruct in BF16, one
torch thread) are answered greedily three ways, each until the end-of-sequence token or the sample's max_new_tokens
(no early stop, so all do the same decoding):
- uncompressed: kvlab.quality.evaluate with its BF16 cache against transformers' `generate` with DynamicCache on
  the whole prompt (context, then question) — samples per second and their ratio;
- under presses (keep 1/4): kvlab.quality.evaluate, which prefills each sample once and compresses that one
  context per press, against kvpress 0.5.5's own KVPressTextGenerationPipeline, which prefills per press (run in
  .venv-kvpress by tests/oracles/kvpress_quality.py --pipeline; skipped with one line when that venv is missing).
Answers right are counted on each side, so a speed-up that changes answers shows. Wall times are one run on the
machine as it is (a shared CI core is noisy): ratios measured side by side, never thresholds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
N = int(os.environ.get("KVLAB_BENCH_EVAL_SAMPLES", "4"))
PRESSES = ("snapkv", "streaming_llm", "knorm")  # keep 1/4 each
KVPRESS_PY = ROOT / ".venv-kvpress" / "bin" / "python"


def _generate_peer(model, tok, samples) -> tuple[float, int]:
    """transformers' generate with its DynamicCache on the whole prompt: (seconds, answers right)."""
    from transformers import DynamicCache

    from kvlab.quality.evaluate import _end_ids
    from kvlab.quality.prompt import sample_prompt
    from kvlab.quality.scoring import is_right
    right, t0 = 0, time.perf_counter()
    for s in samples:
        p = sample_prompt(tok, s, "question_agnostic")
        ids = torch.tensor([p.context_ids + p.question_ids])  # [1, T + Q]
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=DynamicCache(),
                                 max_new_tokens=s.max_new_tokens, do_sample=False,
                                 eos_token_id=list(_end_ids(tok, model)),
                                 pad_token_id=tok.pad_token_id or tok.eos_token_id)
        right += is_right(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True), s.answer)
    return time.perf_counter() - t0, right


def _kvlab(model, tok, samples, settings) -> tuple[float, dict]:
    from kvlab.quality.evaluate import evaluate
    t0 = time.perf_counter()
    scores = evaluate(model, tok, samples, settings, stop_when_right=False)
    return time.perf_counter() - t0, {k: v.right for k, v in scores.items()}


def _kvpress(folder, samples_file: Path, n: int) -> dict | None:
    if not KVPRESS_PY.exists():
        print(f"  kvpress: {KVPRESS_PY} missing (make .venv-kvpress/.kvpress-installed); its side skipped")
        return None
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "kvpress.json"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH="", HF_HUB_OFFLINE="1")
        subprocess.run([str(KVPRESS_PY), str(ROOT / "tests/oracles/kvpress_quality.py"), str(folder),
                        str(samples_file), str(out), "--n-quarter", str(n), "--presses", ",".join(PRESSES),
                        "--pipeline"], check=True, env=env, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main(n: int = N, threads: int = 1) -> dict | None:
    import importlib.util
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvlab.hf import pretrained
    from kvlab.hf.quality import Setting
    from kvlab.quality.samples import write_samples
    from kvlab.quality.tasks import generate
    entry = pretrained.REGISTRY["smollm2-135m"]
    if importlib.util.find_spec(entry.module) is None:
        print(f"smollm2-135m: not installed ({entry.install}); skipped")
        return None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        folder = pretrained.resolve_model("smollm2-135m")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, local_files_only=True).eval()
            tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
            samples = generate("niah_single_2", tok, 1024, n, 0)
            none = Setting("none", "kvlab", {})
            presses = [Setting(f"{p}@0.75", "kvlab", dict(press=p, keep=0.25)) for p in PRESSES]
            peer_s, peer_right = _generate_peer(model, tok, samples)
            mine_s, mine_right = _kvlab(model, tok, samples, [none])
            all_s, all_right = _kvlab(model, tok, samples, [none, *presses])
        r = dict(samples=n, threads=threads, generate_s=peer_s, generate_right=peer_right, kvlab_s=mine_s,
                 kvlab_right=mine_right["none"], kvlab_all_s=all_s, kvlab_all_right=all_right)
        print(f"smollm2-135m, {n} niah_single_2 samples at 1,024 tokens, BF16, {threads} torch thread(s)")
        print(f"  uncompressed: kvlab {n / mine_s:.3f} samples/s ({mine_right['none']}/{n} right), transformers "
              f"generate + DynamicCache {n / peer_s:.3f} ({peer_right}/{n}); kvlab / generate "
              f"{peer_s / mine_s:.2f}x")
        with tempfile.TemporaryDirectory() as d:
            f = write_samples(Path(d) / "samples.jsonl", samples)
            kp = _kvpress(folder, f, n)
        k = len(presses) + 1
        line = (f"  none + {len(presses)} presses keep 1/4 ({', '.join(PRESSES)}): kvlab {n * k / all_s:.3f} "
                f"answers/s (" + ", ".join(f"{lb} {v}/{n}" for lb, v in all_right.items()) + ")")
        if kp is not None:
            kp_s = sum(s["seconds"] for s in kp["settings"].values())
            r.update(kvpress_s=kp_s, kvpress_right={
                lb: sum(a["right"] for a in s["answers"].values()) for lb, s in kp["settings"].items()
                if s["compression_ratio"] in (None, 0.75)})
            line += (f"; kvpress pipeline {n * k / kp_s:.3f} answers/s ("
                     + ", ".join(f"{lb} {v}/{n}" for lb, v in r["kvpress_right"].items())
                     + f"); kvlab / kvpress {kp_s / all_s:.2f}x")
        print(line)
        return r
    finally:
        torch.set_num_threads(before)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else N)
