"""kvlab beside kvpress on the same samples: kvlab.quality.evaluate answers tests/fixtures/kvpress_smollm2_samples.jsonl
under every press of the kvpress fixture (tests/fixtures/kvpress_smollm2.json, kvpress's own pipeline) and prints,
per press and ratio, both accuracies and kvlab - kvpress with its paired bootstrap 95% interval. Writes JSON to argv[1]
(default: stdout only). About 6 CPU-minutes for 14 settings x 24 samples."""
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def main(out=None):
    from kvlab.hf.evaluate import load
    from kvlab.hf.pretrained import resolve_model
    from kvlab.hf.quality import Setting
    from kvlab.quality.evaluate import evaluate
    from kvlab.quality.samples import read_samples
    from kvlab.stats import paired_accuracy_change, wilson
    torch.set_num_threads(1)
    ref = json.loads((ROOT / "tests/fixtures/kvpress_smollm2.json").read_text())
    samples = read_samples(ROOT / "tests/fixtures/kvpress_smollm2_samples.jsonl")
    ids = [s.id for s in samples]
    model, tok = load(str(resolve_model("smollm2-135m")))
    settings = {"none": Setting("none", "kvlab", {})}
    for key, s in ref["settings"].items():
        if key != "none":
            settings[key] = Setting(key, "kvlab", dict(press=s["press"], keep=1 - s["compression_ratio"]))
    scores = evaluate(model, tok, samples, list(settings.values()), "question_agnostic", progress=True)
    rows = []
    for key, sc in scores.items():
        theirs = [bool(ref["settings"][key]["answers"][i]["right"]) for i in ids]
        ours = [a.right for a in sc.answers]
        d = paired_accuracy_change(theirs, ours, [1] * len(ids))
        rows.append(dict(setting=key, n=len(ids), kvpress=sum(theirs) / len(ids), kvlab=sum(ours) / len(ids),
                         kvlab_ci=list(wilson(sum(ours), len(ids))), difference=d.value, difference_ci=d.pair(),
                         same_verdicts=sum(a == b for a, b in zip(ours, theirs))))
        print(f"{key:<28} kvpress {rows[-1]['kvpress']:.3f}  kvlab {rows[-1]['kvlab']:.3f}  kvlab-kvpress "
              f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]  same verdicts {rows[-1]['same_verdicts']}/{len(ids)}",
              flush=True)
    if out:
        Path(out).write_text(json.dumps(dict(model="smollm2-135m", dtype=str(model.dtype), rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
