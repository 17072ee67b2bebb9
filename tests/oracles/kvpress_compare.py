"""kvlab beside kvpress on the same samples: kvlab.quality.evaluate answers the samples of a kvpress fixture (kvpress's
own pipeline: tests/fixtures/kvpress_smollm2.json at 1K tokens, kvpress_smollm2_2k.json and _4k.json) under every press
it ran, and prints, per press and ratio, both accuracies and kvlab - kvpress with its paired bootstrap 95% interval.

    .venv/bin/python tests/oracles/kvpress_compare.py [OUT.json] [--tokens 1024|2048|4096] [--ratio 0.75|0.5|0.875]
    .venv/bin/python tests/oracles/kvpress_compare.py OUT.json --tokens T --shard i/k    (then: OUT.json --merge A B)
    .venv/bin/python tests/oracles/kvpress_compare.py --table [--tokens 1024|2048|4096]

Writes JSON to OUT (the committed results: tests/fixtures/kvlab_vs_kvpress_smollm2.json, _2k.json, _4k.json); only the
samples kvpress answered under every setting at keep 1/4 are compared (an interrupted kvpress run leaves a prefix), and
settings on which kvpress itself failed (recorded with an `error`) are listed, not compared. One torch thread; measured
here at 1K: 28 min for 14 settings x 24 samples on 2 cores shared with other jobs."""
import argparse
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def paths(tokens: int = 1024) -> dict:
    """The fixture files at `tokens` context tokens: kvpress's answers, their samples, kvlab's comparison."""
    tag = "" if tokens == 1024 else f"_{tokens // 1024}k"
    return dict(kvpress=FIXTURES / f"kvpress_smollm2{tag}.json",
                samples=FIXTURES / f"kvpress_smollm2{tag}_samples.jsonl",
                comparison=FIXTURES / f"kvlab_vs_kvpress_smollm2{tag}.json")


def compare(model, tok, ref: dict, samples: list, ratios=None, log=print) -> dict:
    """{rows, verdicts, kvpress_errors}: kvlab's answers against kvpress's recorded ones, setting by setting."""
    from kvlab.hf.quality import Setting
    from kvlab.quality.evaluate import evaluate
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
    verdicts = {key: dict(zip(ids, (a.right for a in sc.answers))) for key, sc in scores.items()}
    return dict(rows=rows_of(ref, verdicts, log), verdicts=verdicts, kvpress_errors=errors)


def rows_of(ref: dict, verdicts: dict, log=print) -> list:
    """Per setting, kvlab's verdicts {setting: {sample id: right}} beside kvpress's on the same samples: both
    accuracies with Wilson intervals, the paired difference with its bootstrap interval, the verdicts equal."""
    from kvlab.stats import paired_accuracy_change, wilson
    rows = []
    for key, mine in verdicts.items():
        ids = list(mine)
        theirs = [bool(ref["settings"][key]["answers"][i]["right"]) for i in ids]
        ours = [mine[i] for i in ids]
        d = paired_accuracy_change(theirs, ours, [1] * len(ids))
        rows.append(dict(setting=key, n=len(ids), kvpress=sum(theirs) / len(ids), kvlab=sum(ours) / len(ids),
                         kvlab_ci=list(wilson(sum(ours), len(ids))), kvpress_ci=list(wilson(sum(theirs), len(ids))),
                         difference=d.value, difference_ci=d.pair(),
                         same_verdicts=sum(a == b for a, b in zip(ours, theirs))))
        log(f"{key:<28} kvpress {rows[-1]['kvpress']:.3f}  kvlab {rows[-1]['kvlab']:.3f}  kvlab-kvpress "
            f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]  same verdicts {rows[-1]['same_verdicts']}/{len(ids)}")
    return rows


def merge(out_path, parts: list, tokens: int) -> None:
    """One comparison from shards (`--shard`), or a committed comparison and a later run at other ratios (`--ratio`):
    their verdicts joined in the samples file's order, every setting any part answered, rows recomputed."""
    from kvlab.quality.samples import read_samples
    files = paths(tokens)
    ref = json.loads(files["kvpress"].read_text())
    got = [json.loads(Path(p).read_text()) for p in parts]
    order = [s.id for s in read_samples(files["samples"])]
    keys = dict.fromkeys(key for g in got for key in g["verdicts"])
    verdicts = {key: {i: v for g in got for i, v in g["verdicts"].get(key, {}).items()} for key in keys}
    verdicts = {key: {i: v[i] for i in order if i in v} for key, v in verdicts.items()}
    out = {k: v for k, v in got[0].items() if k not in ("rows", "verdicts", "shard")}
    out["kvpress_errors"] = {k: v for g in got for k, v in g.get("kvpress_errors", {}).items()}
    out.update(rows=rows_of(ref, verdicts, log=lambda *a: None), verdicts=verdicts,
               shards=sum(g.get("shards", 1) for g in got))
    Path(out_path).write_text(json.dumps(out, indent=1) + "\n")


def table(tokens: int = 1024) -> str:
    """The committed comparison at `tokens` as docs/quality.md's Markdown table (kvpress's failures as rows)."""
    files = paths(tokens)
    cmp, ref = (json.loads(files[k].read_text()) for k in ("comparison", "kvpress"))
    keep = {None: "all", 0.75: "1/4", 0.5: "1/2", 0.875: "1/8"}
    cell = lambda acc, n, ci: f"{round(acc * n)}/{n} {acc:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"  # noqa: E731
    lines = ["| setting | keep | kvpress [Wilson 95%] | kvlab [Wilson 95%] | kvlab - kvpress [paired 95%] | "
             "same verdicts |", "|---|---|---|---|---|---|"]
    rows = {r["setting"]: r for r in cmp["rows"]}
    for key, s in ref["settings"].items():
        name, ratio = s["press"], s["compression_ratio"]
        if "error" in s:
            lines.append(f"| {name} | {keep[ratio]} | kvpress fails ({s['error'].split(': ')[1]} in its own pipeline) "
                         "| - | - | - |")
        elif key in rows:
            r = rows[key]
            lo, hi = r["difference_ci"]
            lines.append(f"| {name} | {keep[ratio]} | {cell(r['kvpress'], r['n'], r['kvpress_ci'])} | "
                         f"{cell(r['kvlab'], r['n'], r['kvlab_ci'])} | {r['difference']:+.2f} [{lo:+.2f}, {hi:+.2f}] | "
                         f"{r['same_verdicts']}/{r['n']} |")
    return "\n".join(lines)


def main(argv=None):
    from kvlab.hf.evaluate import load
    from kvlab.hf.pretrained import resolve_model
    from kvlab.quality.samples import read_samples
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="the output JSON")
    ap.add_argument("--tokens", type=int, default=1024, choices=(1024, 2048, 4096), help="the fixtures' context")
    ap.add_argument("--ratio", type=float, action="append", help="compare only these compression ratios (repeat)")
    ap.add_argument("--table", action="store_true", help="print the committed comparison as a Markdown table")
    ap.add_argument("--shard", default="0/1", help="i/k: answer samples i, i+k, i+2k, ... (two processes on 2 cores)")
    ap.add_argument("--merge", nargs="+", metavar="SHARD", help="join shard outputs into OUT (rows recomputed)")
    a = ap.parse_args(argv)
    if a.table:
        print(table(a.tokens))
        return
    if a.merge:
        merge(a.out, a.merge, a.tokens)
        return
    torch.set_num_threads(1)
    files = paths(a.tokens)
    ref = json.loads(files["kvpress"].read_text())
    done = [set(s["answers"]) for s in ref["settings"].values() if s["compression_ratio"] in (None, 0.75)
            and "error" not in s]
    shard, shards = (int(x) for x in a.shard.split("/"))
    samples = [s for s in read_samples(files["samples"]) if all(s.id in d for d in done)][shard::shards]
    model, tok = load(str(resolve_model("smollm2-135m")))
    ratios = None if not a.ratio else set(a.ratio) | {None}
    out = dict(model="smollm2-135m", dtype=str(model.dtype), kvpress=ref["kvpress"], tokens=a.tokens,
               shard=a.shard, **compare(model, tok, ref, samples, ratios))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
