"""kvpress's own answers on a real model: its KVPressTextGenerationPipeline, greedy, for every press kvlab registers,
on the same samples kvlab evaluates (`make oracle-kvpress-quality` writes tests/fixtures/kvpress_smollm2.json).

    .venv-kvpress/bin/python tests/oracles/kvpress_quality.py MODEL_DIR SAMPLES.jsonl OUT.json \\
        [--n-quarter N] [--n-half N] [--dtype bfloat16] [--time-one]

Runs in .venv-kvpress (kvpress 0.5.5 pins transformers < 5.3) and imports nothing of kvlab's package: the presses and
their kvpress classes come from tests/kvpress_oracle.py (CASES, checked against kvlab's registry by
tests/test_kvpress_quality.py), the samples are read as plain JSONL (kvlab.quality.samples' columns), and the scoring
rule is restated below (kvlab.quality.scoring.is_right; the test re-scores every recorded text with kvlab's own).

Protocol (kvpress/pipeline.py): question-agnostic. preprocess applies the chat template to the context, splits the
question suffix off, and encodes both without special tokens; _forward prefills the context through `model.model`
inside the press's hooks, then generate_answer reads question + suffix + answer prefix with positions continuing from
the context's length and decodes greedily until the generation config's EOS or max_new_tokens (the sample's).
Phase 1: the first --n-quarter samples under no press (the reference) and every press at compression ratio 0.75
(keep 1/4); phase 2: the first --n-half samples at ratio 0.5 (keep 1/2). The output is rewritten after every sample,
so an interrupted run leaves what it finished.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import kvpress_oracle as oracle  # noqa: E402  (tests/kvpress_oracle.py: press names -> kvpress classes)

RATIOS = {"0.75": "keep 1/4", "0.5": "keep 1/2"}  # kvpress compression_ratio -> the kept share
OPTIONS = {"random": {"seed": 0}}  # press options for the quality run (else kvpress's defaults, as kvlab's)
_CONTROL = re.compile(r"[\x00-\x1f]")


def is_right(text: str, answer) -> bool:
    """kvlab.quality.scoring.is_right restated: every reference, lower-cased, inside the text stripped, with control
    characters as newlines, stripped again and lower-cased (RULER's postprocess_pred and string_match_all)."""
    pred = _CONTROL.sub("\n", text.strip()).strip().lower()
    refs = [answer] if isinstance(answer, str) else answer
    return all(r.lower() in pred for r in refs)


def make_press(name: str, ratio: float):
    """kvpress's press for kvlab's press `name` at `ratio` (wrappers over SnapKV, as tests/kvpress_oracle.py)."""
    import kvpress
    cls, _, _ = oracle.CASES[name]
    opts = dict(OPTIONS.get(name, {}))
    if name in oracle.WRAPPED:
        return getattr(kvpress, cls)(press=kvpress.SnapKVPress(compression_ratio=ratio), **opts)
    return getattr(kvpress, cls)(compression_ratio=ratio, **opts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("samples")
    ap.add_argument("out")
    ap.add_argument("--n-quarter", type=int, default=24, help="samples at ratio 0.75 and for the reference")
    ap.add_argument("--n-half", type=int, default=24, help="samples at ratio 0.5")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--presses", default=",".join(oracle.CASES), help="comma-separated kvlab press names")
    ap.add_argument("--time-one", action="store_true", help="time one sample under each setting and stop")
    a = ap.parse_args(argv)

    import torch
    import transformers
    import kvpress
    from kvpress import KVPressTextGenerationPipeline
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    torch.manual_seed(0)

    t_start = time.perf_counter()
    presses = [p for p in a.presses.split(",") if p]
    dtype = getattr(torch, a.dtype)
    tok = AutoTokenizer.from_pretrained(a.model)
    impls = {"sdpa"} | {oracle.CASES[p][2] for p in presses}
    models = {i: AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation=i).eval()
              for i in sorted(impls)}
    pipes = {i: KVPressTextGenerationPipeline(model=m, tokenizer=tok) for i, m in models.items()}
    rows = [json.loads(line) for line in Path(a.samples).read_text(encoding="utf-8").splitlines() if line.strip()]

    settings = {"none": ("none", None, "sdpa")}  # label -> (press, ratio, attention)
    for ratio in RATIOS:
        for p in presses:
            settings[f"{p}@{ratio}"] = (p, float(ratio), oracle.CASES[p][2])
    out = {
        "kvpress": getattr(kvpress, "__version__", None) or __import__("importlib.metadata").metadata.version("kvpress"),
        "transformers": transformers.__version__, "torch": torch.__version__,
        "model": Path(a.model).name, "dtype": a.dtype, "device": "cpu", "threads": torch.get_num_threads(),
        "protocol": "question_agnostic", "pipeline": "kvpress KVPressTextGenerationPipeline (greedy)",
        "samples_file": Path(a.samples).name, "n_quarter": a.n_quarter, "n_half": a.n_half,
        "options": {p: OPTIONS.get(p, {}) for p in presses},
        "classes": {p: oracle.CASES[p][0] + ("(SnapKVPress)" if p in oracle.WRAPPED else "") for p in presses},
        "attention": {p: oracle.CASES[p][2] for p in presses},
        "samples": [], "settings": {}, "wall_s": None,
    }
    for label, (p, ratio, impl) in settings.items():
        out["settings"][label] = dict(press=p, compression_ratio=ratio, attention=impl, answers={}, seconds=0.0)

    def save():
        out["wall_s"] = round(time.perf_counter() - t_start, 1)
        tmp = Path(a.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(a.out)

    def answer(row, label):
        p, ratio, impl = settings[label]
        press = None if ratio is None else make_press(p, ratio)
        t = time.perf_counter()
        with torch.no_grad():
            text = pipes[impl](row["context"], question=row["question"], answer_prefix=row["answer_prefix"],
                               press=press, max_new_tokens=row["max_new_tokens"])["answer"]
        s = out["settings"][label]
        s["seconds"] = round(s["seconds"] + time.perf_counter() - t, 2)
        s["answers"][row["id"]] = dict(text=text, right=is_right(text, row["answer"]))
        return time.perf_counter() - t

    phases = [(a.n_quarter, [k for k, v in settings.items() if v[1] in (None, 0.75)]),
              (a.n_half, [k for k, v in settings.items() if v[1] == 0.5])]
    if a.time_one:
        phases = [(1, list(settings))]
    for n, labels in phases:
        for row in rows[:n]:
            if row["id"] not in [r["id"] for r in out["samples"]]:
                ctx = len(pipes["sdpa"].preprocess(row["context"], [row["question"]], row["answer_prefix"],
                                                   10**10)["context_ids"][0])
                out["samples"].append(dict(id=row["id"], task=row.get("task"), depth=row.get("depth"),
                                           answer=row["answer"], context_tokens=ctx))
            t = time.perf_counter()
            for label in labels:
                dt = answer(row, label)
                if a.time_one:
                    print(f"{label:28s} {dt:6.2f} s {out['settings'][label]['answers'][row['id']]}", flush=True)
            save()
            print(f"{row['id']}: {len(labels)} settings in {time.perf_counter() - t:.1f} s "
                  f"(total {time.perf_counter() - t_start:.0f} s)", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
