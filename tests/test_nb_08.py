"""Notebook 08 end to end with small parameters (papermill), on the committed trained checkpoints."""
import pytest

from nbutil import run_notebook

SMALL = dict(formats=["bf16", "nvfp4", "int4"], residual=32, mechanisms=["window:1/4", "hca:8,window:32"],
             presses=["snapkv keep 1/4", "streaming_llm keep 64"], others=["bf16", "nvfp4"], peers=["quanto4"],
             contexts=[160, 256], samples=8, halfwidth=0, longer=["*"], windows=4, heatmap=["bf16", "window:1/4"], heatmap_contexts=[128, 256],
             depth_samples=2, chunk=64, batch=8, decode_steps=4, decode_rounds=1)


@pytest.mark.slow
def test_nb_08_small(tmp_path):
    r = run_notebook("08", tmp_path, **SMALL)
    assert r["held_equals_predicted"] is True
    b = r["bytes_per_token"]
    # Qwen3 tiny: 4 layers x (K + V) x 2 KV heads x 32 dims; BF16 2 B, NVFP4 16 B of codes + 2 E4M3 scales per 32
    assert b["qwen3-tiny|bf16"] == 4 * 2 * 2 * 32 * 2 == 1024
    assert b["qwen3-tiny|nvfp4"] == 4 * 2 * 2 * (16 + 2) == 288
    # DeepSeek-V3 tiny: 4 layers x one 48 + 16 latent entry
    assert b["deepseek-v3-tiny|bf16"] == 4 * 64 * 2 == 512
    assert b["deepseek-v3-tiny|nvfp4"] == 4 * (32 + 4) == 144
    assert b["qwen3-tiny|window=1/4"] == 0 and b["qwen3-tiny|hca=8,window=32"] < 1024
    assert 0 < b["kvlab-v41-tiny|bf16"] < b["deepseek-v3-tiny|bf16"]
    held = r["held_bytes"]
    # window=1/4 at 256 tokens: W = 64, so 63 tokens held per layer; the press keeps its budget of the context
    assert held["qwen3-tiny|window=1/4|256"] == 63 * 1024
    assert held["qwen3-tiny|streaming_llm keep 64|256"] < held["qwen3-tiny|bf16|256"] == 256 * 1024
    # the other models take the `others` at the first context (160: SnapKV's 64-token window fits in half of it);
    # presses do not apply to the MLA latent
    assert "deepseek-v3-tiny|nvfp4|160" in held and "deepseek-v3-tiny|nvfp4|256" not in held
    assert not any(k.startswith("deepseek-v3-tiny|snapkv") for k in held)
    assert set(r["samples"].values()) == {8}  # niah: one answer per sample
    for k, (lo, hi) in r["accuracy_ci"].items():
        assert 0 <= lo <= r["accuracy"][k] <= hi <= 1
    for k, (lo, hi) in r["ppl_change_ci"].items():
        assert lo <= hi
        if k.split("|")[1] == "bf16":
            assert lo == hi == 0
    assert r["heatmap_samples_per_cell"] == 2
    assert set(r["heatmap_mean_accuracy"]) == {f"qwen3-tiny|{s}|{t}" for s in ("bf16", "window=1/4") for t in (128, 256)}
    peers = r["peer_held_bytes"]
    assert peers["kvlab bf16"] == peers["DynamicCache"] == 160 * 1024
    assert peers["kvlab int4_g64"] <= peers["QuantizedCache quanto4"]


@pytest.mark.slow
@pytest.mark.parametrize("bad, match", [
    (dict(mechanisms=["windw:4"]), "parameter mechanisms"),
    (dict(presses=["snapk keep 1/4"]), "unknown press"),
])
def test_nb_08_bad_parameter(tmp_path, bad, match):
    import papermill as pm
    with pytest.raises(pm.PapermillExecutionError, match=match):
        run_notebook("08", tmp_path, **dict(SMALL, **bad))
