"""kvpress's own answers on a real model: its KVPressTextGenerationPipeline, greedy, for every press kvlab registers,
on the same samples kvlab evaluates (`make oracle-kvpress-quality` writes tests/fixtures/kvpress_smollm2.json).

    .venv-kvpress/bin/python tests/oracles/kvpress_quality.py MODEL_DIR SAMPLES.jsonl OUT.json \\
        [--n-quarter N] [--n-half N] [--n-eighth N] [--dtype bfloat16] [--shard i/k] [--start N] [--merge SHARD ...]

Runs in .venv-kvpress (kvpress 0.5.5 pins transformers < 5.3) and imports nothing of kvlab's package: the presses and
their kvpress classes come from tests/kvpress_oracle.py (CASES, checked against kvlab's registry by
tests/test_kvpress_quality.py), the samples are read as plain JSONL (kvlab.quality.samples' columns), and the scoring
rule is restated below (kvlab.quality.scoring.is_right; the test re-scores every recorded text with kvlab's own).

Protocol (kvpress/pipeline.py): question-agnostic. preprocess applies the chat template to the context, splits the
question suffix off, and encodes both without special tokens; _forward prefills the context through `model.model`
inside the press's hooks, then generate_answer reads question + suffix + answer prefix with positions continuing from
the context's length and decodes greedily until the generation config's EOS or max_new_tokens (the sample's).
Phase 1: the first --n-quarter samples under no press (the reference) and every press at compression ratio 0.75
(keep 1/4); phase 2: the first --n-half samples at ratio 0.5 (keep 1/2); phase 3: the first --n-eighth at ratio 0.875
(keep 1/8). The output is rewritten after every sample, so an interrupted run leaves what it finished. --merge also
adds a later run's settings to a finished fixture (a run of one phase beside the others).
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

RATIOS = {"0.75": "keep 1/4", "0.5": "keep 1/2", "0.875": "keep 1/8"}  # kvpress compression_ratio -> the kept share
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


class Prefill:
    """One sample's context prefilled once through `model.model` (as the pipeline's _forward does), with each attention
    layer's forward kwargs and output kept, so a press's own `forward_hook` can then run on a copy of the cache exactly
    as it runs inside that prefill: compression happens after each layer's attention, so later layers see the same
    hidden states with or without a press, and replaying the hooks on the kept inputs gives the pipeline's cache."""

    def __init__(self, model, context_ids):
        from transformers import DynamicCache
        self.model, self.length, self.calls = model, context_ids.shape[1], []
        keep = lambda module, args, kwargs, output: self.calls.append((module, dict(kwargs), output))  # noqa: E731
        layers = model.model.layers
        hooks = [layer.self_attn.register_forward_hook(keep, with_kwargs=True) for layer in layers]
        try:
            self.cache = DynamicCache()
            model.model(input_ids=context_ids, past_key_values=self.cache)
        finally:
            for h in hooks:
                h.remove()

    def compressed(self, press):
        """A copy of the context's cache compressed by `press` (None: uncompressed), as `with press(model)` would."""
        import copy
        cache = copy.deepcopy(self.cache)
        for layer in self.model.model.layers:
            layer.self_attn.masked_key_indices = None  # AdaKV's masks of an earlier press (a prefill resets them)
        if press is not None:
            press.post_init_from_model(self.model)
            for layer in self.model.model.layers:
                layer.self_attn.rotary_emb = self.model.model.rotary_emb
            for module, kwargs, output in self.calls:
                press.forward_hook(module, [], {**kwargs, "past_key_values": cache}, output)
        return cache


def merge(paths, out_path):
    """One fixture from shard outputs, or a finished fixture and a later run's (another phase): samples and answers
    joined in the samples file's order, every setting any part ran kept (a setting's error too)."""
    parts = [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    out = dict(parts[0])
    order = [json.loads(line)["id"] for line in
             (HERE.parent / "fixtures" / out["samples_file"]).read_text(encoding="utf-8").splitlines() if line.strip()]
    rank = {i: k for k, i in enumerate(order)}
    samples = {s["id"]: s for p in parts for s in p["samples"]}
    out["samples"] = sorted(samples.values(), key=lambda s: rank.get(s["id"], 1e9))
    labels = list(dict.fromkeys(label for p in parts for label in p["settings"]))
    out["settings"] = {}
    for label in labels:
        had = [p["settings"][label] for p in parts if label in p["settings"]]
        answers = {k: v for st in had for k, v in st["answers"].items()}
        st = out["settings"][label] = dict(had[0], seconds=round(sum(st["seconds"] for st in had), 1))
        for err in (st.get("error") for st in had if st.get("error")):
            st["error"] = err
        st["answers"] = {s["id"]: answers[s["id"]] for s in out["samples"] if s["id"] in answers}
        st["n"], st["right"] = len(st["answers"]), sum(a["right"] for a in st["answers"].values())
    out["shards"] = sum(p.get("shards", 1) for p in parts)
    for k in ("n_quarter", "n_half", "n_eighth"):
        out[k] = max(p.get(k, 0) for p in parts)
    out["start"] = min(p.get("start", 0) for p in parts)
    out["wall_s"] = max(p["wall_s"] for p in parts)
    out["cpu_s"] = round(sum(p.get("cpu_s", p["wall_s"]) for p in parts), 1)
    Path(out_path).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="the model folder (or, with --merge, the merged output)")
    ap.add_argument("samples", nargs="?", help="the samples JSONL (kvlab.quality.samples' columns)")
    ap.add_argument("out", nargs="?", help="the output JSON")
    ap.add_argument("--n-quarter", type=int, default=24, help="samples at ratio 0.75 and for the reference")
    ap.add_argument("--n-half", type=int, default=0, help="samples at ratio 0.5")
    ap.add_argument("--n-eighth", type=int, default=0, help="samples at ratio 0.875")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--presses", default=",".join(oracle.CASES), help="comma-separated kvlab press names")
    ap.add_argument("--shard", default="0/1", help="i/k: this process answers samples i, i+k, i+2k, ...")
    ap.add_argument("--start", type=int, default=0,
                    help="skip the first samples (a later run adding samples to a finished one; --merge joins them)")
    ap.add_argument("--pipeline", action="store_true",
                    help="call the pipeline itself for every answer (one prefill per press) instead of sharing the "
                         "context's prefill: slower, the same answers (the check of the shared prefill)")
    ap.add_argument("--merge", nargs="+", metavar="SHARD", help="merge shard outputs into the first argument")
    a = ap.parse_args(argv)
    if a.merge:
        merge(a.merge, a.model)
        return 0

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
    shard, shards = (int(x) for x in a.shard.split("/"))
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
        "kvpress": __import__("importlib.metadata").metadata.version("kvpress"),
        "transformers": transformers.__version__, "torch": torch.__version__,
        "model": Path(a.model).name, "dtype": a.dtype, "device": "cpu", "threads": torch.get_num_threads(),
        "protocol": "question_agnostic",
        "pipeline": "kvpress KVPressTextGenerationPipeline: preprocess, the prefill of _forward, generate_answer "
                    "(greedy)" + ("" if a.pipeline else "; the context prefilled once per sample and attention, each "
                                  "press's forward_hook replayed on its layers' kept inputs"),
        "samples_file": Path(a.samples).name, "n_quarter": a.n_quarter, "n_half": a.n_half,
        "n_eighth": a.n_eighth, "shard": a.shard,
        "start": a.start,
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

    def answer(row, label, x, prefills):
        p, ratio, impl = settings[label]
        press = None if ratio is None else make_press(p, ratio)
        t = time.perf_counter()
        with torch.no_grad():
            if a.pipeline:
                text = pipes[impl](row["context"], question=row["question"], answer_prefix=row["answer_prefix"],
                                   press=press, max_new_tokens=row["max_new_tokens"])["answer"]
            else:
                if impl not in prefills:
                    prefills[impl] = Prefill(models[impl], x["context_ids"])
                cache = prefills[impl].compressed(press)
                text = pipes[impl].generate_answer(x["questions_ids"][0], cache, x["context_ids"].shape[1],
                                                   row["max_new_tokens"])
        s = out["settings"][label]
        s["seconds"] = round(s["seconds"] + time.perf_counter() - t, 2)
        s["answers"][row["id"]] = dict(text=text, right=is_right(text, row["answer"]))

    phases = [(a.n_quarter, [k for k, v in settings.items() if v[1] in (None, 0.75)]),
              (a.n_half, [k for k, v in settings.items() if v[1] == 0.5]),
              (a.n_eighth, [k for k, v in settings.items() if v[1] == 0.875])]
    for n, labels in phases:
        for k, row in enumerate(rows[:n]):
            if k < a.start or k % shards != shard:
                continue
            t = time.perf_counter()
            x = pipes["sdpa"].preprocess(row["context"], [row["question"]], row["answer_prefix"], 10**10)
            if row["id"] not in [r["id"] for r in out["samples"]]:
                out["samples"].append(dict(id=row["id"], task=row.get("task"), depth=row.get("depth"),
                                           answer=row["answer"], context_tokens=int(x["context_ids"].shape[1])))
            prefills = {}
            for label in labels:
                if "error" in out["settings"][label]:
                    continue
                try:
                    answer(row, label, x, prefills)
                except RuntimeError as e:  # kvpress itself fails on this setting: recorded, the setting left out
                    out["settings"][label]["error"] = f"{row['id']}: {type(e).__name__}: {str(e).splitlines()[0]}"
                    print(f"{label}: kvpress raised {out['settings'][label]['error']}", flush=True)
            del prefills
            save()
            right = sum(out["settings"][lb]["answers"].get(row["id"], {}).get("right", 0) for lb in labels)
            print(f"{row['id']}: {len(labels)} settings, {right} right, {time.perf_counter() - t:.1f} s "
                  f"(total {time.perf_counter() - t_start:.0f} s)", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
