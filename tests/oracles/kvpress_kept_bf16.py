"""Why kvlab and kvpress answer one sample differently: both presses' kept positions per layer and KV head on that
sample's context, prefilled in bfloat16 as each side's answer run does it (kvpress: tests/kvpress_oracle.py in its venv,
the model and its cache in bfloat16; kvlab: kvlab.hf.context.prefill then the setting's cache's load_context, as
kvlab.quality.evaluate does), with, where the sets differ, both sides' scores at the differing positions.

    .venv/bin/python tests/oracles/kvpress_kept_bf16.py SAMPLE_ID PRESS[,PRESS] [--keep 0.5] [--tokens 1024]
        [--out OUT.json]

Prints per press: the layers and heads whose sets differ, how many positions, and for each the scores (kvpress's in
bfloat16 as its scorer returned them, kvlab's in float32) against the cutoff (the n-th best score per head)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(os.environ.get("KVLAB_KVPRESS_PYTHON", ROOT / ".venv-kvpress" / "bin" / "python"))


def kvpress_kept(folder, ids, presses, keep, dtype="bfloat16") -> dict:
    """tests/kvpress_oracle.py's report for one context, in the kvpress venv."""
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        inp.write_text(json.dumps(dict(ids=[ids], keeps=[keep], dtype=dtype, presses=presses)))
        subprocess.run([str(PYTHON), str(ROOT / "tests" / "kvpress_oracle.py"), str(folder), str(out), str(inp)],
                       check=True, env={**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1"})
        return json.loads(out.read_text())


def kvlab_kept(model, ids, press, keep) -> tuple[list, list]:
    """kvlab's kept positions [layer][H] and its scores [layer][H][T], through the evaluation's path."""
    from kvlab.hf.context import prefill
    from kvlab.hf.quality import Setting
    cache = Setting("x", "kvlab", dict(press=press, keep=keep)).make(model, len(ids))
    scorer = getattr(cache.press.press, "inner", cache.press.press)
    scores, score = [], scorer.score
    scorer.score = lambda x: scores.append(score(x)) or scores[-1]
    cache.load_context(prefill(model, torch.tensor([ids]), queries=True))
    kept = [[sorted(p for p in ph if p >= 0) for ph in layer.positions[0].tolist()] for layer in cache.layers]
    return kept, [s[0].float().tolist() for s in scores]


def differences(theirs, ours, their_scores, our_scores, n_of) -> list[dict]:
    """Per layer and head whose sets differ: the positions each side keeps alone, and both sides' scores there
    against each side's cutoff (its n-th best score) and score scale (its largest score outside the always-kept)."""
    rows = []
    for layer, (a_l, b_l) in enumerate(zip(theirs, ours)):
        for h, (a, b) in enumerate(zip(a_l[0], b_l)):
            a, b = set(a), set(b)
            if a == b:
                continue
            st, so = torch.tensor(their_scores[layer][0][h]), torch.tensor(our_scores[layer][h])
            n = len(a)
            ct, co = float(st.sort(descending=True).values[n - 1]), float(so.sort(descending=True).values[n - 1])
            rows.append(dict(layer=layer, head=h, kept=n, only_kvpress=sorted(a - b), only_kvlab=sorted(b - a),
                             kvpress_cutoff=ct, kvlab_cutoff=co,
                             kvpress_scores={p: float(st[p]) for p in sorted(a ^ b)},
                             kvlab_scores={p: float(so[p]) for p in sorted(a ^ b)},
                             kvlab_gap=max(abs(float(so[p]) - co) for p in a ^ b),
                             kvpress_gap=max(abs(float(st[p]) - ct) for p in a ^ b),
                             kvpress_ties_at_cutoff=int((st == ct).sum())))
    return rows


def main(argv=None):
    from kvlab.hf.evaluate import load
    from kvlab.hf.pretrained import resolve_model
    from kvlab.quality.prompt import sample_prompt
    from kvlab.quality.samples import read_samples
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sample")
    ap.add_argument("presses")
    ap.add_argument("--keep", type=float, default=0.5)
    ap.add_argument("--tokens", type=int, default=1024, choices=(1024, 2048, 4096), help="the samples file's context")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    folder = resolve_model("smollm2-135m")
    model, tok = load(str(folder))
    sys.path.insert(0, str(ROOT / "tests" / "oracles"))
    from kvpress_compare import paths
    sample = next(s for s in read_samples(paths(a.tokens)["samples"]) if s.id == a.sample)
    ids = list(sample_prompt(tok, sample).context_ids)
    presses = a.presses.split(",")
    ref = kvpress_kept(folder, ids, presses, a.keep)
    out = dict(sample=a.sample, keep=a.keep, model_dtype=str(model.dtype), kvpress_dtype=ref["dtype"],
               tokens=len(ids), presses={})
    for case in ref["cases"]:
        ours, our_scores = kvlab_kept(model, ids, case["press"], a.keep)
        rows = differences(case["kept"], ours, case["scores"], our_scores, None)
        out["presses"][case["press"]] = rows
        print(f"{case['press']}: {len(rows)} (layer, head) sets differ of {len(ours) * len(ours[0])}; "
              f"match distance {case['match_distance']:.3g}")
        for r in rows:
            print(f"  layer {r['layer']} head {r['head']}: only kvpress {r['only_kvpress']} only kvlab "
                  f"{r['only_kvlab']}; kvpress cutoff {r['kvpress_cutoff']:.6g} gap {r['kvpress_gap']:.3g} "
                  f"(ties {r['kvpress_ties_at_cutoff']}); kvlab cutoff {r['kvlab_cutoff']:.6g} gap "
                  f"{r['kvlab_gap']:.3g}")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
