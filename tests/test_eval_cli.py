"""`kvlab eval` on a model saved with save_pretrained (a tiny random Qwen3 with kvlab's byte tokenizer), and
its one-line errors: a Hub id offline with an empty cache, a missing directory, bad formats and mechanisms."""
import json
import os
import subprocess
import sys

import pytest
import torch

from kvlab.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import AutoModelForCausalLM, Qwen3Config
    from kvlab.toy.data import save_tokenizer
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny-qwen3")
    AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    save_tokenizer(d)
    return str(d)


def run_json(capsys, *args):
    assert main(["eval", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_eval_json(model_dir, capsys):
    r = run_json(capsys, model_dir, "--kv-format", "nvfp4", "--tokens", "96", "--decode-steps", "4", "--task", "mqar",
                 "--samples", "2")
    for k in ("model", "kv_format", "tokens", "perplexity", "reference_perplexity", "held_bytes", "predicted_bytes",
              "decode_tokens_per_s", "reference_decode_tokens_per_s", "accuracy", "reference_accuracy"):
        assert k in r
    assert (r["model"], r["kv_format"], r["tokens"], r["mechanism"]) == (model_dir, "nvfp4", 96, "dense")
    # 2 layers x (K + V) x 2 heads x 96 tokens x NVFP4 entry of 32 (16 B codes + 2 E4M3 scales)
    assert r["held_bytes"] == r["predicted_bytes"] == 2 * 2 * 2 * 96 * 18
    assert r["reference_bytes"] == 2 * 2 * 2 * 96 * 32 * 2  # BF16 DynamicCache
    assert 1 < r["perplexity"] < 1e4 and 1 < r["reference_perplexity"] < 1e4
    assert r["decode_tokens_per_s"] > 0 and 0 <= r["accuracy"] <= 1


def test_eval_task_samples_narrow_the_interval_by_default(model_dir, capsys):
    """Issue 33 item 3: a checkpoint task draws samples in rounds until its Wilson interval is at most 0.1 wide on
    each side (or --max-samples are drawn), as notebook 08 does."""
    r = run_json(capsys, model_dir, "--tokens", "96", "--windows", "1", "--decode-steps", "2", "--task", "needle",
                 "--samples", "4", "--batch", "8", "--max-samples", "40")
    lo, hi = r["accuracy_ci"]
    assert r["samples"] == 40 or max(r["accuracy"] - lo, hi - r["accuracy"]) <= 0.1
    assert r["samples"] > 4


def test_eval_json_intervals_and_counts(model_dir, capsys):
    """Intervals around every figure, with the counts they rest on; a BF16 cache's change is exactly zero."""
    r = run_json(capsys, model_dir, "--kv-format", "int2", "--tokens", "96", "--windows", "5", "--decode-steps", "2",
                 "--task", "needle", "--samples", "6", "--halfwidth", "0")
    assert (r["windows"], r["samples"], r["answers"]) == (5, 6, 6)
    lo, hi = r["perplexity_ci"]
    assert lo <= r["perplexity"] <= hi and lo < hi
    clo, chi = r["perplexity_change_ci"]
    assert clo <= r["perplexity_change"] <= chi
    assert r["within_noise"] == (clo <= 0 <= chi)
    for key in ("accuracy", "reference_accuracy"):
        a, b = r[key + "_ci"]
        assert 0 <= a <= r[key] <= b <= 1 and b - a > 0.1  # six answers leave a wide interval
    assert r["held_equals_predicted"] is True
    same = run_json(capsys, model_dir, "--tokens", "48", "--windows", "3", "--decode-steps", "2")
    assert same["perplexity_change"] == 0 and same["perplexity_change_ci"] == [0, 0] and same["within_noise"]


@pytest.mark.slow
def test_eval_v41_checkpoint(capsys):
    """The V4.1-like checkpoint evaluates through its own Stack (it has no transformers cache)."""
    from kvlab.train import checkpoint_dir
    r = run_json(capsys, str(checkpoint_dir("kvlab-v41-tiny")), "--kv-format", "nvfp4", "--tokens", "64",
                 "--windows", "2", "--decode-steps", "2", "--chunk", "64")
    assert r["kv_format"] == "nvfp4" and r["mechanism"].startswith("v41")
    assert r["held_bytes"] == r["predicted_bytes"] < r["reference_bytes"]
    assert len(r["perplexity_change_ci"]) == 2
    assert main(["eval", str(checkpoint_dir("kvlab-v41-tiny")), "--mechanism", "window=16", "--tokens", "32"]) == 2
    assert "its own trained modules" in capsys.readouterr().err


def test_eval_split_formats_residual_mechanism(model_dir, capsys):
    r = run_json(capsys, model_dir, "--k-format", "int4", "--v-format", "int2", "--residual", "8", "--tokens", "80",
                 "--decode-steps", "2", "--mechanism", "window=32")
    assert r["kv_format"] == "k=int4 v=int2 residual=8" and r["mechanism"] == "window=32"
    assert r["held_bytes"] == r["predicted_bytes"]


def test_eval_mechanism_as_a_fraction(model_dir, capsys):
    """'window=1/4', as notebook 10 and the sweeps write it: a quarter of each context (here --tokens)."""
    r = run_json(capsys, model_dir, "--tokens", "80", "--decode-steps", "2", "--mechanism", "window=1/4")
    assert r["mechanism"] == "window=20" and r["held_bytes"] == r["predicted_bytes"]


def test_bf16_matches_reference(model_dir, capsys):
    r = run_json(capsys, model_dir, "--tokens", "64", "--decode-steps", "2")
    assert r["perplexity"] == r["reference_perplexity"]
    assert r["held_bytes"] == r["reference_bytes"]


@pytest.mark.parametrize("args,message", [
    (["--kv-format", "fp5"], "unknown number format 'fp5'"),
    (["--kv-format", "nvfp4", "--k-format", "int4"], "not both"),
    (["--mechanism", "windw=4"], "is not one of"),
    (["--mechanism", "window=5/4"], "is not a fraction of the context in (0, 1]"),
    (["--mechanism", "window=1/0"], "is not a fraction of the context in (0, 1]"),
    (["--task", "sudoku"], "task must be one of"),
    (["--tokens", "1"], "tokens must be an integer >= 2"),
])
def test_bad_arguments_exit_2_before_loading(model_dir, capsys, args, message):
    assert main(["eval", model_dir, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_missing_directory(capsys, tmp_path):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "no such model directory" in capsys.readouterr().err


def test_hub_id_offline_with_empty_cache(tmp_path):
    """HF_HUB_OFFLINE is read when huggingface_hub is imported: a fresh interpreter, as a user runs it."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path), PYTHONPATH=os.getcwd())
    p = subprocess.run([sys.executable, "-m", "kvlab", "eval", "kvlab-test/no-such-model"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("kvlab:")]
    assert len(lines) == 1 and "offline" in lines[0] and "kvlab-test/no-such-model" in lines[0]
    assert p.stdout == ""
