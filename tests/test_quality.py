"""kvlab.hf.quality: budgets as fractions of the context, presses as settings, batched passes that score each row
as a pass of its own would, Wilson-sized sampling, paired changes; on the committed dense checkpoint."""
import math

import pytest
import torch

from kvlab.errors import KvlabError, ParameterError
from kvlab.hf import quality as Q
from kvlab.hf.evaluate import text_windows

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def dense():
    torch.set_num_threads(1)
    (name, pair), = Q.load_models([Q.resolve_model("qwen3-tiny")], torch.float32).items()
    return {name: pair}


@pytest.mark.parametrize("text, tokens, want", [
    ("window=1/8", 1024, "window=128"), ("window=1/4", 256, "window=64"), ("hca=8,window=1/16", 2048, "hca=8,window=128"),
    ("capped=1/64x8,topk=1/16", 1024, "capped=16x8,topk=64"), ("window=1/8", 8, "window=2"), ("topk=32", 99, "topk=32"),
])
def test_fractions_of_the_context(text, tokens, want):
    assert Q.at_context(text, tokens) == want


@pytest.mark.parametrize("call, match", [
    (lambda: Q.at_context("window=3/2", 64), "not a fraction of the context"),
    (lambda: Q.at_context("window=1/0", 64), "not a fraction of the context"),
    (lambda: Q.mechanism_settings(["windw=1/4"]), "windw"),
    (lambda: Q.mechanism_settings([4]), "mechanism must be a string"),
    (lambda: Q.press_settings(["snapkv"]), r"write it as 'name keep budget \[format\]'"),
    (lambda: Q.press_settings(["snapkv keep x"]), "not a number or fraction"),
    (lambda: Q.press_settings(["snapkv keep 0"]), "keep"),
    (lambda: Q.press_settings(["nopress keep 1/4"]), "unknown press"),
    (lambda: Q.press_settings(["snapkv keep 1/4 nvfp5"]), "press setting 'snapkv keep 1/4 nvfp5': .*nvfp5"),
    (lambda: Q.press_settings(["snapkv keep 1/4 nvfp4 x"]), r"'name keep budget \[format\]'"),
    (lambda: Q.mechanism_settings(["window=1/4"])[0].make(torch.nn.Linear(1, 1)), "give the context"),
])
def test_bad_settings(call, match):
    with pytest.raises(ParameterError, match=match):
        call()


def test_labels_and_forms():
    assert [s.label for s in Q.press_settings(["snapkv keep 1/4", "knorm 0.5", "tova=64"])] == \
        ["snapkv keep 1/4", "knorm keep 0.5", "tova keep 64"]
    assert Q.press_settings(["snapkv keep 1/4"])[0].options["keep"] == 0.25
    assert Q.press_settings(["tova keep 64"])[0].options["keep"] == 64
    composed = Q.press_settings(["snapkv keep 1/4 nvfp4", "knorm keep 1/2 int4"], residual=16)
    assert [s.label for s in composed] == ["snapkv keep 1/4 nvfp4", "knorm keep 1/2 int4"]
    assert [(s.options["kv_format"], s.options["residual"]) for s in composed] == [("nvfp4", 0), ("int4", 16)]
    assert Q.family(composed[0].label) == "snapkv"  # one method on the frontier, whatever its format
    assert Q.mechanism_label("window:1/4") == "window=1/4" and Q.mechanism_label("window:64") == "window=64"
    assert Q.same_label("hca:8,window:1/16", "hca=8,window=1/16") and not Q.same_label("window=1/4", "window=1/8")


def test_a_batch_scores_each_row_as_a_pass_of_its_own(dense):
    """Per-window NLL from one batched pass == each window through a fresh cache alone (float32)."""
    (model, encode), = dense.values()
    win = text_windows(encode, 96, 4, 0)
    s = Q.format_settings(["bf16"], 0, torch.bfloat16)[0]
    together = Q.measure(model, s, win, None, 0, encode, 32, batch=4)
    alone = [Q.measure(model, s, win[i:i + 1], None, 0, encode, 32, batch=1).window_nll[0] for i in range(4)]
    assert together.window_nll == pytest.approx(alone, rel=1e-5)
    assert together.window_tokens == [95] * 4 and together.matches
    assert together.held_bytes == 96 * 1024  # bytes held after one window (mean over the batch's rows)


@pytest.mark.parametrize("setting", ["window:1/4", "snapkv keep 1/4", "streaming_llm keep 40", "nvfp4",
                                     "snapkv keep 1/4 nvfp4", "knorm keep 1/4 int4"])
def test_settings_hold_what_kvlab_predicts(dense, setting):
    (model, encode), = dense.values()
    s = (Q.press_settings([setting]) if "keep" in setting else
         Q.mechanism_settings([setting]) if "window" in setting else Q.format_settings([setting]))[0]
    win = text_windows(encode, 160, 2, 1)
    m = Q.measure(model, s, win, "niah", 1, encode, 32, samples=6, batch=3)
    assert m.matches is True and m.answers == m.samples == 6 and len(m.sample_right) == 6
    assert m.right == sum(m.sample_right) and m.accuracy == m.right / 6
    assert m.sample_held_bytes <= 160 * 1024
    if "keep" in setting:  # the press holds its budget of each sample's context, not the whole sample
        assert m.sample_held_bytes < 160 * 1024 * 0.7


def test_samples_sized_by_the_interval(dense):
    """With halfwidth, samples are drawn in rounds until the Wilson interval is that narrow, or max_samples."""
    (model, encode), = dense.values()
    s = Q.format_settings(["bf16"], 0, torch.bfloat16)[0]
    win = text_windows(encode, 128, 1, 0)
    m = Q.measure(model, s, win, "niah", 2, encode, 64, samples=8, halfwidth=0.2, max_samples=64, batch=8)
    lo, hi = m.accuracy_ci
    assert max(m.accuracy - lo, hi - m.accuracy) <= 0.2 and m.samples % 8 == 0 and m.samples <= 64
    capped = Q.measure(model, s, win, "niah", 2, encode, 64, samples=8, halfwidth=0.01, max_samples=24, batch=8)
    assert capped.samples == 24  # 0.01 needs thousands: stopped at the cap
    again = Q.measure(model, s, win, "niah", 2, encode, 64, samples=8, halfwidth=0.2, max_samples=64, batch=8)
    assert (again.samples, again.right) == (m.samples, m.right)  # seeded: the same run twice


def test_sweep_pairs_settings_on_the_same_samples(dense):
    sets = Q.format_settings(["bf16", "int2"], 16, torch.bfloat16) + Q.mechanism_settings(["window:1/8"])
    rows = Q.sweep(dense, sets, [128], "niah", 8, 4, 32, seed=0, progress=False, batch=8)
    acc = Q.accuracy_changes(rows)
    ppl = Q.changes(rows)
    ref = next(r for r in rows if r.setting == "bf16")
    for r in rows:
        assert r.sample_answers == ref.sample_answers  # the same questions
        a = acc["qwen3-tiny", r.setting, 128]
        assert a.value == pytest.approx(r.accuracy - ref.accuracy)
        assert a.low <= a.value <= a.high
        assert ppl["qwen3-tiny", r.setting, 128].perplexity == pytest.approx(r.perplexity)
    assert acc["qwen3-tiny", "bf16", 128].pair() == [0.0, 0.0]
    win = next(r for r in rows if r.setting == "window=1/8")
    assert win.held_bytes == 15 * 1024  # 1/8 of 128 tokens: W = 16, 15 held
    assert math.isfinite(win.perplexity)


def test_sweep_longer_limits_the_later_contexts(dense):
    """`longer`: every setting at the first context, only those at the later ones, on windows nested across both."""
    sets = Q.format_settings(["bf16", "nvfp4"], 0, torch.bfloat16) + Q.mechanism_settings(["window:1/8"])
    rows = Q.sweep(dense, sets, [64, 128], None, 1, 2, 32, seed=0, progress=False, batch=2, longer=sets[:1])
    assert [(r.setting, r.context) for r in rows] == [("bf16", 64), ("nvfp4", 64), ("window=1/8", 64), ("bf16", 128)]
    whole = Q.sweep(dense, sets[:1], [64, 128], None, 1, 2, 32, seed=0, progress=False, batch=2)
    assert [r.window_nll for r in whole] == [rows[0].window_nll, rows[-1].window_nll]  # the same nested windows


def test_presses_apply_to_dense_heads_only():
    from kvlab.train.models import make_config

    class M:
        def __init__(self, arch):
            self.config = make_config(arch)
    snap = Q.press_settings(["snapkv keep 1/4"])[0]
    assert Q.applies(M("dense"), snap) and not Q.applies(M("mla"), snap) and not Q.applies(M("v41"), snap)
    assert Q.applies(M("v41"), Q.format_settings(["nvfp4"])[0])
    with pytest.raises(KvlabError):
        Q.sweep({}, [], [128], None, 1, 1, 32, halfwidth=0.7)


def test_fewest_bytes_for_a_target_by_hand():
    """Per model and method, the cheapest budget whose accuracy reaches the target; None when none does."""
    def row(setting, acc, held, context=1024):
        return Q.Row(perplexity=2.0, accuracy=acc, held_bytes=held * 2, predicted_bytes=held * 2, matches=True,
                     bytes_per_token=None, right=round(acc * 64), answers=64, sample_held_bytes=held, model="m",
                     setting=setting, kind="kvlab", context=context)
    rows = [row("bf16", 0.95, 1000), row("snapkv keep 1/8", 0.5, 150), row("snapkv keep 1/4", 0.92, 260),
            row("snapkv keep 1/2", 0.97, 510), row("window=1/4", 0.2, 250), row("int4 (KIVI, r=32)", 0.91, 330),
            row("snapkv keep 1/8", 1.0, 10, context=2048)]
    need = Q.fewest_bytes(rows, 0.9, 1024)
    assert need["m", "snapkv"].setting == "snapkv keep 1/4"  # 1/8 misses, 1/2 holds more
    assert need["m", "window"] is None and need["m", "int4"].sample_held_bytes == 330
    assert need["m", "bf16"].setting == "bf16"
    assert [Q.family(x) for x in ("snapkv keep 1/4", "window=1/8", "hca=8,window=1/16", "int4 (KIVI, r=32)", "nvfp4")] \
        == ["snapkv", "window", "hca", "int4", "nvfp4"]
