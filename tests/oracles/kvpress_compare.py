"""kvlab beside kvpress on the same samples: kvlab.quality.evaluate answers tests/fixtures/kvpress_smollm2_samples.jsonl
under every press of the kvpress fixture (tests/fixtures/kvpress_smollm2.json, kvpress's own pipeline) and prints,
per press and ratio, both accuracies and kvlab - kvpress with its paired bootstrap 95% interval.

    .venv/bin/python tests/oracles/kvpress_compare.py [OUT.json] [--ratio 0.75|0.5]

Writes JSON to OUT (the committed result: tests/fixtures/kvlab_vs_kvpress_smollm2.json); settings on which kvpress
itself failed (recorded with an `error`) are listed, not compared. One torch thread; measured here: 28 min for 14
settings x 24 samples on 2 cores shared with other jobs."""
import argparse
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def compare(model, tok, ref: dict, samples: list, ratios=None, log=print) -> dict:
    """{rows, verdicts, kvpress_errors}: kvlab's answers against kvpress's recorded ones, setting by setting."""
    from kvlab.hf.quality import Setting
    from kvlab.quality.evaluate import evaluate
    from kvlab.stats import paired_accuracy_change, wilson
    ids = [s.id for s in samples]
    settings, errors = {}, {}
    for key, s in ref["settings"].items():
        if ratios is not None and s["compression_ratio"] not in ratios:
            continue
        if "error" in s:
            errors[key] = s["error"]
            continue
        if not all(i in s["answers"] for i in ids):
            continue
        settings[key] = Setting(key, "kvlab", {} if s["compression_ratio"] is None else
                                dict(press=s["press"], keep=1 - s["compression_ratio"]))
    scores = evaluate(model, tok, samples, list(settings.values()), "question_agnostic", progress=log is print)
    rows, verdicts = [], {}
    for key, sc in scores.items():
        theirs = [bool(ref["settings"][key]["answers"][i]["right"]) for i in ids]
        ours = [a.right for a in sc.answers]
        verdicts[key] = dict(zip(ids, ours))
        d = paired_accuracy_change(theirs, ours, [1] * len(ids))
        rows.append(dict(setting=key, n=len(ids), kvpress=sum(theirs) / len(ids), kvlab=sum(ours) / len(ids),
                         kvlab_ci=list(wilson(sum(ours), len(ids))), kvpress_ci=list(wilson(sum(theirs), len(ids))),
                         difference=d.value, difference_ci=d.pair(),
                         same_verdicts=sum(a == b for a, b in zip(ours, theirs))))
        log(f"{key:<28} kvpress {rows[-1]['kvpress']:.3f}  kvlab {rows[-1]['kvlab']:.3f}  kvlab-kvpress "
            f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]  same verdicts {rows[-1]['same_verdicts']}/{len(ids)}")
    return dict(rows=rows, verdicts=verdicts, kvpress_errors=errors)


def main(argv=None):
    from kvlab.hf.evaluate import load
    from kvlab.hf.pretrained import resolve_model
    from kvlab.quality.samples import read_samples
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="the output JSON")
    ap.add_argument("--ratio", type=float, action="append", help="compare only these compression ratios (repeat)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    ref = json.loads((ROOT / "tests/fixtures/kvpress_smollm2.json").read_text())
    samples = read_samples(ROOT / "tests/fixtures/kvpress_smollm2_samples.jsonl")
    model, tok = load(str(resolve_model("smollm2-135m")))
    ratios = None if not a.ratio else set(a.ratio) | {None}
    out = dict(model="smollm2-135m", dtype=str(model.dtype), kvpress=ref["kvpress"], **compare(model, tok, ref,
                                                                                             samples, ratios))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
