"""Notebook 08 end to end with small parameters (papermill), on the committed trained checkpoints."""
import pytest

from nbutil import run_notebook

SMALL = dict(formats=["bf16", "nvfp4", "int4"], residual=32, mechanisms=["window=32", "hca=8,window=32"],
             peers=["quanto4"], contexts=[128], samples=1, windows=1, chunk=64, decode_steps=4, decode_rounds=1)


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
    assert b["qwen3-tiny|window=32"] < b["qwen3-tiny|bf16"] and b["qwen3-tiny|hca=8,window=32"] < 1024
    assert 0 < b["kvlab-v41-tiny|bf16"] < b["deepseek-v3-tiny|bf16"]
    ppl = r["perplexity"]
    for m in ("qwen3-tiny", "deepseek-v3-tiny", "kvlab-v41-tiny"):
        ref = ppl[f"{m}|bf16|128"]
        assert 1 < ref < 256  # bytes: better than uniform
        assert abs(ppl[f"{m}|nvfp4|128"] / ref - 1) < 0.1  # 4-bit floats cost little on these models
    peers = r["peer_held_bytes"]
    assert peers["kvlab bf16"] == peers["DynamicCache"] == 128 * 1024
    assert peers["kvlab int4_g64"] <= peers["QuantizedCache quanto4"]


@pytest.mark.slow
def test_nb_08_bad_parameter(tmp_path):
    import papermill as pm
    with pytest.raises(pm.PapermillExecutionError, match="parameter mechanisms"):
        run_notebook("08", tmp_path, **dict(SMALL, mechanisms=["windw=4"]))
