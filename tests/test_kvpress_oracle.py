"""kvlab.hf.presses against kvpress 0.5.5's own presses (NVIDIA/kvpress), on the committed qwen3-tiny checkpoint.

kvpress pins transformers < 5.3, so it runs in a venv of its own (`make oracle-kvpress` builds .venv-kvpress,
about 2.5 min, then runs this file; KVLAB_KVPRESS_PYTHON names another interpreter). tests/kvpress_oracle.py
runs there and reports, per press, budget and text, the positions kvpress kept per layer and KV head and its
scores; here kvlab's cache prefills the same bytes (float32, SDPA) and its `positions` must hold the same sets.
Where they differ, the scores must tie at the cutoff within float noise (possible across transformers
versions): the test checks that and says so."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import kvpress_oracle as oracle  # noqa: E402

CHECKPOINT = ROOT / "data" / "checkpoints" / "qwen3-tiny"
PYTHON = Path(os.environ.get("KVLAB_KVPRESS_PYTHON", ROOT / ".venv-kvpress" / "bin" / "python"))
needs_kvpress = pytest.mark.skipif(not PYTHON.exists(), reason=f"no kvpress venv at {PYTHON}: `make oracle-kvpress` "
                                                                 "builds it (about 2.5 min) and runs this comparison")
RTOL = 1e-4  # scores agree within float noise when kvlab's and kvpress's differ by at most this, relatively


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("kvpress") / "kvpress.json"
    subprocess.run([str(PYTHON), str(ROOT / "tests" / "kvpress_oracle.py"), str(CHECKPOINT), str(out)], check=True,
                   env={**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1"})
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32, attn_implementation="sdpa").eval()


def kvlab_run(model, case):
    """kvlab's kept positions [layer][B][H] and its scores per layer for one case."""
    from kvlab.hf import make_cache
    cache = make_cache(model, press=case["press"], keep=case["keep"], press_options=case["options"])
    press = cache.press.press
    scorer = getattr(press, "inner", press)
    scores, score = [], scorer.score
    scorer.score = lambda x: scores.append(score(x)) or scores[-1]
    with torch.no_grad():
        model(oracle.ids(oracle.TEXTS[case["text"]]), cache=cache, use_cache=True)
    assert cache.nbytes == cache.predicted_bytes()
    kept = []
    for layer in cache.layers:  # the positions each head reads (AdaKV holds more slots than some heads read)
        pos, read = layer.positions, layer.readable
        kept.append([[[p for p, r in zip(ph, rh) if r] for ph, rh in zip(pb, rb)]
                     for pb, rb in zip(pos.tolist(), (read if read is not None else pos >= 0).tolist())])
    return kept, [s.tolist() for s in scores]


def tie(ref_scores, our_scores, a: set, b: set) -> bool:
    """The sets differ only where kvpress's scores tie at the cutoff, and kvlab scored the same within RTOL."""
    s, o = torch.tensor(ref_scores), torch.tensor(our_scores)
    if s.shape != o.shape or not torch.allclose(s, o, rtol=RTOL, atol=RTOL * float(s.abs().max())):
        return False
    diff = sorted(a ^ b)
    lo, hi = min(s[sorted(a)]), max(s[diff])  # the cutoff: kvpress's lowest kept score
    return bool(abs(hi - lo) <= RTOL * float(s.abs().max()) + 1e-12) and all(
        abs(float(s[p]) - float(lo)) <= RTOL * float(s.abs().max()) + 1e-12 for p in diff)


def test_tie_rule():
    """Sets that differ only where scores tie at the cutoff are explained; a real difference is not."""
    s = [0.9, 0.5, 0.5, 0.1]
    assert tie(s, s, {0, 1}, {0, 2})
    assert not tie(s, s, {0, 1}, {0, 3})
    assert not tie(s, [0.9, 0.6, 0.5, 0.1], {0, 1}, {0, 2})  # kvlab scored differently


@needs_kvpress
def test_kvpress_agrees(reference, model):
    rows, bad = [], []
    for case in reference["cases"]:
        ours, our_scores = kvlab_run(model, case)
        for layer, (theirs, mine) in enumerate(zip(case["kept"], ours)):
            verdict = "equal"
            for h, (a, b) in enumerate(zip(theirs[0], mine[0])):
                a, b = set(a), set(b)
                if a == b:
                    continue
                ok = (case["press"] not in ("chunkkv", "adakv") and layer < len(case["scores"])
                      and tie(case["scores"][layer][0][h], our_scores[layer][0][h], a, b))
                verdict = "tie-explained" if ok and verdict != "differs" else "differs"
            rows.append((case["press"], case["keep"], case["text"], layer, verdict))
            if verdict == "differs":
                bad.append(rows[-1])
    print("\nkvpress", reference["kvpress"], "transformers", reference["transformers"], "| press keep text layer")
    for r in rows:
        print(*r)
    assert not bad, f"kept sets differ from kvpress's: {bad}"
