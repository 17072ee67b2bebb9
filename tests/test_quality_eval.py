"""The generation-based evaluation (kvlab.quality.evaluate): one prefill of a context shared by every setting, held
exactly as a direct forward would hold it; greedy answers scored as RULER scores them; the CLI and the notebook give
the same accuracy for the same setting, samples and seed."""
import json

import pytest
import torch

from kvlab.cli import main
from kvlab.errors import KvlabError, ParameterError
from kvlab.hf.cache import make_cache
from kvlab.hf.context import prefill
from kvlab.hf.presses import PRESSES
from kvlab.hf.quality import Setting, format_settings, press_settings
from kvlab.models import DATA_DIR

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = DATA_DIR / "checkpoints" / "qwen3-tiny"


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def smol():
    from kvlab.hf.evaluate import load
    from kvlab.hf.pretrained import resolve_model
    return load(str(resolve_model("smollm2-135m")))


def _ids(n, seed):
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("press", sorted(PRESSES))
def test_a_shared_prefill_holds_what_a_direct_forward_holds(tiny, press):
    """load_context of one prefill keeps the same positions as the context's own forward through the press, and the
    question then reads the same logits: zero tolerance."""
    ctx, question = _ids(300, 1), _ids(9, 2)
    direct = make_cache(tiny, press=press, keep=0.25)
    with torch.no_grad():
        tiny(input_ids=ctx, cache=direct, use_cache=True)
        kept = [layer.positions.clone() for layer in direct.layers]
        want = tiny(input_ids=question, cache=direct, use_cache=True).logits
    shared = make_cache(tiny, press=press, keep=0.25).load_context(prefill(tiny, ctx))
    for a, b in zip(kept, shared.layers):
        assert torch.equal(a, b.positions)
    with torch.no_grad():
        got = tiny(input_ids=question, cache=shared, use_cache=True).logits
    assert torch.equal(got, want)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "nvfp4", "mxfp4", "int4", "int2"])
def test_a_loaded_context_holds_the_predicted_bytes(tiny, fmt):
    from kvlab.hf.evaluate import held_bytes
    s = format_settings([fmt], residual=16)[0]
    cache = s.make(tiny, 300).load_context(prefill(tiny, _ids(300, 3), queries=False))
    assert cache.tokens == 300 and held_bytes(cache) == cache.predicted_bytes()


def test_bf16_context_equals_the_plain_forward(tiny):
    """At the model's precision the protocol is no protocol: the question's logits equal one forward of both."""
    ctx, question = _ids(200, 4), _ids(7, 5)
    cache = make_cache(tiny).load_context(prefill(tiny, ctx))
    with torch.no_grad():
        got = tiny(input_ids=question, cache=cache, use_cache=True).logits
        ref = tiny(input_ids=torch.cat([ctx, question], 1)).logits[:, -7:]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_load_context_refuses_what_it_cannot_hold(tiny):
    c = prefill(tiny, _ids(50, 6), queries=False)
    with pytest.raises(ParameterError, match="queries=True"):
        make_cache(tiny, press="snapkv", keep=0.5).load_context(c)
    with pytest.raises(ParameterError, match="mechanism"):
        make_cache(tiny, mechanism="window=16").load_context(c)
    full = make_cache(tiny).load_context(c)
    with pytest.raises(ParameterError, match="empty cache"):
        full.load_context(c)
    with pytest.raises(ParameterError, match="Context"):
        make_cache(tiny).load_context("text")


# --- on the real model ---------------------------------------------------------------------------------------------
def test_real_model_answers_and_settings_share_samples(smol):
    from kvlab.quality.evaluate import evaluate_task
    model, tok = smol
    settings = format_settings(["bf16", "int2"], residual=32) + press_settings(["snapkv keep 1/8"])
    run = evaluate_task(model, tok, "niah_single_2", 1024, settings, samples=3, halfwidth=None, round_size=3,
                        max_new_tokens=12)
    bf16, snap = run.scores["bf16"], run.scores["snapkv keep 1/8"]
    assert [s.n for s in run.scores.values()] == [3, 3, 3]
    assert bf16.right == 3  # SmolLM2 finds a number in repeated noise at 1K tokens (greedy, BF16)
    assert all(s.matches for s in run.scores.values())  # held bytes == kvlab's prediction, on every sample
    assert snap.context_bytes < bf16.context_bytes / 6  # an eighth of the context held
    ch = snap.change(bf16)
    assert ch.n == 3 and -1 <= ch.low <= ch.value <= ch.high <= 1


def test_stopping_when_right_never_changes_a_verdict(smol):
    from kvlab.quality.evaluate import evaluate
    from kvlab.quality.tasks import generate
    model, tok = smol
    samples = generate("niah_multikey_1", tok, 512, 2, seed=3)
    settings = format_settings(["bf16"]) + press_settings(["streaming_llm keep 1/4"])
    early = evaluate(model, tok, samples, settings, max_new_tokens=10)
    full = evaluate(model, tok, samples, settings, max_new_tokens=10, stop_when_right=False)
    for label in early:
        assert [a.right for a in early[label].answers] == [a.right for a in full[label].answers]
        assert all(a.tokens <= b.tokens for a, b in zip(early[label].answers, full[label].answers))


def test_a_context_beyond_the_model_is_refused(smol):
    from kvlab.quality.evaluate import answer_sample
    from kvlab.quality.samples import Sample
    model, tok = smol
    huge = Sample("word " * (model.config.max_position_embeddings + 10), "What?", "", "x", 4)
    with pytest.raises(ParameterError, match="max_position_embeddings"):
        answer_sample(model, tok, huge, format_settings(["bf16"]))


def test_a_task_or_file_beyond_the_model_is_refused_before_anything_runs(smol, monkeypatch, tmp_path, capsys):
    """A task context or a task-file sample the model cannot read, or a press's token budget above a context it
    compresses, is refused before any sample is drawn or answered (a long context takes minutes to generate; the CLI
    refuses it before its perplexity run), naming the sample."""
    from kvlab.quality import evaluate as ev
    from kvlab.quality.samples import Sample
    model, tok = smol
    limit = model.config.max_position_embeddings
    monkeypatch.setattr(ev, "answer_sample", lambda *a, **k: pytest.fail("answered a sample"))
    monkeypatch.setattr("kvlab.quality.tasks.generate", lambda *a, **k: pytest.fail("drew a sample"))
    with pytest.raises(ParameterError, match=f"{limit:,}"):
        ev.evaluate_task(model, tok, "niah_single_2", limit, format_settings(["bf16"]), samples=1, halfwidth=None)
    fine = Sample("word " * 10, "What?", "", "x", 4)
    huge = Sample("word " * (limit + 10), "What?", "", "x", 4)
    with pytest.raises(ParameterError, match="sample #2: .* max_position_embeddings"):
        ev.evaluate(model, tok, [fine, huge], format_settings(["bf16"]))
    monkeypatch.setattr("kvlab.hf.evaluate.evaluate", lambda *a, **k: pytest.fail("ran the perplexity pass"))
    rc, out, err = _cli(capsys, "eval", "smollm2-135m", "--task", "niah_single_2", "--task-tokens", str(limit * 4))
    assert rc == 2 and err.count("\n") == 1 and "max_position_embeddings" in err, err
    f = tmp_path / "long.jsonl"
    f.write_text(json.dumps(dict(context="word " * (limit + 10), question="What?", answer_prefix="",
                                 answer="x", max_new_tokens=4)) + "\n")
    rc, out, err = _cli(capsys, "eval", "smollm2-135m", "--task-file", str(f))
    assert rc == 2 and err.count("\n") == 1 and "sample #1" in err, err
    rc, out, err = _cli(capsys, "eval", "smollm2-135m", "--task", "niah_single_2", "--task-tokens", "256",
                        "--press", "snapkv", "--keep", "300", "--context", "400")
    assert rc == 2 and err.count("\n") == 1, err
    assert "--keep 300 tokens is more than the task's contexts (--task-tokens): 256" in err, err


def _cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


QUICK = ["--windows", "1", "--tokens", "64", "--decode-steps", "2", "--no-progress"]


def test_cli_and_notebook_agree(smol, capsys):
    """`kvlab eval` and notebook 10 run one evaluation: the same setting, samples and seed give the same answers."""
    from kvlab.quality.evaluate import evaluate_task
    model, tok = smol
    rc, out, err = _cli(capsys, "eval", "smollm2-135m", "--press", "snapkv", "--keep", "0.25", "--task",
                        "niah_single_2", "--task-tokens", "512", "--samples", "4", "--max-samples", "4",
                        "--max-new-tokens", "12", "--seed", "5", "--json", *QUICK, "--tokens", "160")
    assert rc == 0, err
    r = json.loads(out)
    run = evaluate_task(model, tok, "niah_single_2", 512, press_settings(["snapkv keep 1/4"]) + format_settings(
        ["bf16"]), seed=5, samples=4, halfwidth=0.1, max_samples=4, max_new_tokens=12)
    assert r["protocol"] == "question_agnostic" and r["samples"] == 4 and r["answers"] == 4
    assert r["accuracy"] == run.scores["snapkv keep 1/4"].accuracy
    assert r["reference_accuracy"] == run.scores["bf16"].accuracy
    assert r["task_bytes_match"] is True and r["task_held_bytes"] == run.scores["snapkv keep 1/4"].context_bytes
    lo, hi = r["accuracy_change_ci"]
    assert lo <= r["accuracy_change"] <= hi


def test_cli_scores_a_task_file(tmp_path, capsys):
    f = tmp_path / "mine.jsonl"
    rows = [dict(context="The secret code is 4817. " + "The sky is blue. " * 40, question="What is the secret code?",
                 answer_prefix="The secret code is", answer="4817", max_new_tokens=8),
            dict(context="Alice has 3 cats and 12 dogs. " + "Grass is green. " * 40, question="How many dogs?",
                 answer_prefix="", answer=["12"], max_new_tokens=8)]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rc, out, err = _cli(capsys, "eval", "smollm2-135m", "--kv-format", "int4", "--residual", "16", "--task-file",
                        str(f), "--json", *QUICK)
    assert rc == 0, err
    r = json.loads(out)
    assert r["task"] == str(f) and r["answers"] == 2 and r["protocol"] == "question_agnostic"
    assert 0 <= r["accuracy"] <= 1 and r["reference_accuracy"] is not None


@pytest.mark.parametrize("argv, words", [
    (["--task", "nope"], ["task must be one of", "niah_single_1", "mqar", "got 'nope'"]),
    (["--task", "vt", "--task-file", "x.jsonl"], ["--task or --task-file"]),
    (["--task-file", "{d}/missing.jsonl"], ["missing.jsonl"]),
    (["--task-file", "{d}/bad.jsonl"], ["missing column", "answer"]),
    (["--task-file", "{d}/empty_answer.jsonl"], ["answer"]),
    (["--kv-format", "int9", "--task", "vt"], ["int9"]),
    (["--press", "snapkv", "--keep", "2000000", "--task", "vt"], []),
], ids=["unknown task", "both", "missing file", "missing column", "empty answer", "bad format", "budget"])
def test_cli_bad_input_is_one_line(argv, words, tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text(json.dumps(dict(context="c", question="q", answer_prefix="")) + "\n")
    (tmp_path / "empty_answer.jsonl").write_text(json.dumps(dict(context="c", question="q", answer_prefix="",
                                                                 answer="", max_new_tokens=4)) + "\n")
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    rc, out, err = _cli(capsys, "eval", "smollm2-135m", *argv, *QUICK)
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("kvlab: error:"), err
    for w in words:
        assert w in err


def test_a_checkpoint_without_tokenizer_takes_its_own_tasks(capsys):
    rc, out, err = _cli(capsys, "eval", "qwen3-tiny", "--task", "niah_single_2", *QUICK)
    assert rc == 2 and "no tokenizer of words" in err and "mqar" in err


def test_cli_press_on_a_checkpoint_compresses_all_before_the_question(capsys):
    """Issue 33 item 2: the CLI compressed the first half of each sample (SnapKV 1/4 scored niah 0.875) where notebook
    08 compresses everything before the question (about 0.2); both now compress up to the question."""
    rc, out, err = _cli(capsys, "eval", "qwen3-tiny", "--press", "snapkv", "--keep", "0.25", "--task", "niah",
                        "--tokens", "1024", "--samples", "16", "--windows", "1", "--decode-steps", "2", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["reference_accuracy"] >= 0.9 and r["accuracy"] <= 0.5


@pytest.mark.parametrize("press, halfwidth", [("snapkv", 0.0), ("streaming_llm", 0.2)])
def test_cli_and_notebook_08_agree_on_a_checkpoint(capsys, press, halfwidth):
    """Issue 33 item 2: `kvlab eval` on a checkpoint and notebook 08's measure draw the same samples, batch them the
    same way and compress the same context, so one setting, sample count and seed give one accuracy."""
    import torch

    from kvlab.hf.evaluate import text_windows
    from kvlab.hf.quality import load_models, measure, press_settings, resolve_model
    (_, (model, encode)), = load_models([resolve_model("qwen3-tiny")], torch.float32).items()
    s, = press_settings([f"{press} keep 1/4"])
    m = measure(model, s, text_windows(encode, 512, 1, 3), "niah", 3, encode, 128, samples=8, halfwidth=halfwidth,
                max_samples=24, batch=4)
    rc, out, err = _cli(capsys, "eval", "qwen3-tiny", "--press", press, "--keep", "0.25", "--task", "niah",
                        "--tokens", "512", "--samples", "8", "--halfwidth", str(halfwidth), "--max-samples", "24",
                        "--batch", "4", "--chunk", "128", "--seed", "3", "--windows", "1", "--decode-steps", "2",
                        "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert (r["accuracy"], r["samples"], r["answers"]) == (m.accuracy, m.samples, m.answers)
    assert r["protocol"] == "teacher_forced" and r["compute_dtype"] == "float32" and r["kv_format"] == "bf16"
    assert r["accuracy_change_ci"][0] <= r["accuracy_change"] <= r["accuracy_change_ci"][1]


def test_an_unreachable_hub_fails_at_once(monkeypatch):
    """Issue 33 item 6: a Hub id with no network reads only the local cache (no retries) and says so in one line."""
    from kvlab.hf import evaluate as ev
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(ev, "hub_reachable", lambda *a, **k: False)
    with pytest.raises(ev.ModelLoadError, match="did not answer within 3 s, and not in the local cache"):
        ev.load("nobody/no-such-model-kvlab")
