from fractions import Fraction

import pytest

from kvlab.engines import allocate, paged
from kvlab.errors import ParameterError
from kvlab.layout import build_layout

# Exact values derived from the public configs (Hugging Face config.json of each model), the DeepSeek LLM paper
# (arXiv:2401.02954, Table 2), DeepSeek-V4 / V4.1 model cards, deepseek-ai/FlashMLA and vLLM's allocation rules.
EXPECTED = [
    ("qwen3-8b", "storage", None, 147_456),
    ("qwen3-8b", "storage", "fp8_e4m3", 73_728),
    ("qwen3-8b", "storage", "nvfp4", 41_472),
    ("deepseek-llm-7b", "storage", None, 491_520),
    ("deepseek-llm-67b", "storage", None, 389_120),
    ("deepseek-v2", "storage", None, 69_120),
    ("deepseek-v3", "storage", None, 70_272),
    ("deepseek-v3", "storage", "fp8_e4m3", 35_136),
    ("deepseek-v3.2", "bf16", None, 85_888),
    ("deepseek-v3.2", "vllm", None, 48_068),
    ("deepseek-v4-flash", "bf16", None, 6_880),
    ("deepseek-v4-flash", "storage", None, Fraction(351425, 100)),
    ("deepseek-v4-flash", "vllm", None, Fraction(385025, 100)),
    ("deepseek-v4-pro", "bf16", None, 9_848),
    ("deepseek-v4.1-flash", "storage", None, 890),
]


@pytest.mark.parametrize("model,scheme,fmt,expected", EXPECTED)
def test_bytes_per_token(model, scheme, fmt, expected):
    assert build_layout(model, scheme, fmt).bytes_per_token == expected


def test_v4_flash_vllm_page_padding():
    a = allocate("deepseek-v4-flash", "vllm")
    assert a.layout.bytes_per_token == Fraction(385025, 100)
    assert a.bytes_per_token == 3915


def test_v41_million_token_session():
    s = build_layout("deepseek-v4.1-flash").session(1_000_000)
    assert s.growing == 890_000_000
    assert 0 < s.bounded <= build_layout("deepseek-v4.1-flash").bounded_bytes


def test_v41_roles():
    L = build_layout("deepseek-v4.1-flash")
    storing = [l.index for l in L.layers if any(c.grows for c in l.components)]
    assert storing == [2, 8, 14, 20]
    assert L.entries_per_token == Fraction(5, 2)
    assert {l.mode for l in L.layers} == {"swa", "full", "reuse", "reindex"}
    assert all(l.source is not None for l in L.layers if l.mode in ("reuse", "reindex"))


@pytest.mark.parametrize("tokens", [0, 1, 2, 3, 127, 128, 129, 1000, 4097])
def test_session_ceil_for_compressed(tokens):
    L = build_layout("deepseek-v4-flash")
    expect = 0
    for layer in L.layers:
        for c in layer.components:
            if c.grows:
                expect += c.entry_bytes * -(-tokens // c.ratio)
    assert L.session(tokens).growing == expect


def test_dense_session_is_linear():
    L = build_layout("qwen3-8b")
    assert L.session(4096).total == 4096 * 147_456
    assert L.bounded_bytes == 0


def test_sliding_window_is_bounded():
    L = build_layout("gpt-oss-120b")
    # 18 full layers grow; 18 sliding layers of window 128 hold at most 127 tokens between steps
    assert L.bytes_per_token == 18 * 2 * 8 * 64 * 2
    assert L.bounded_bytes == 18 * 2 * 8 * 64 * 2 * 127
    assert L.session(100).bounded == 18 * 2 * 8 * 64 * 2 * 100


def test_explanations():
    assert "2 (K,V) x 36 layers x 8 KV heads x 128 dims x 2 B = 147,456 B per token" in build_layout("qwen3-8b").explain()
    lines = build_layout("deepseek-v4.1-flash").explain()
    assert "2.5 x (288 + 68) = 890 B per token" in lines
    assert any("= 288 B" in l for l in lines) and any("= 68 B" in l for l in lines)
    assert any("3,915 B per token" in l for l in allocate("deepseek-v4-flash", "vllm").explain())


def test_paged_session_rounds_up():
    a = allocate("qwen3-8b", engine=paged(16))
    assert a.session(17).growing == 32 * 147_456
    assert a.session(16).growing == 16 * 147_456


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, None])
def test_bad_tokens(bad):
    with pytest.raises(ParameterError, match="tokens"):
        build_layout("qwen3-8b").session(bad)


def test_bad_scheme_and_unavailable_layout():
    with pytest.raises(ParameterError, match="unknown layout"):
        build_layout("qwen3-8b", "sglang")
    with pytest.raises(ParameterError, match="no published 'vllm' layout"):
        build_layout("deepseek-v4.1-flash", "vllm")


# --- keys and values in their own formats ----------------------------------------------------------------------
def test_k_and_v_formats_apart():
    L = build_layout("qwen3-8b", k_format="fp8_e4m3", v_format="nvfp4")
    assert L.kv_format == "k=fp8_e4m3 v=nvfp4"
    assert L.bytes_per_token == 36 * 8 * (128 + 72)  # K: 128 B FP8 per head; V: 64 + 8 B NVFP4 per head
    assert L.bytes_per_token == (build_layout("qwen3-8b", kv_format="fp8_e4m3").bytes_per_token
                                 + build_layout("qwen3-8b", kv_format="nvfp4").bytes_per_token) / 2
    only_k = build_layout("qwen3-8b", k_format="fp8_e4m3")  # values keep the checkpoint's BF16
    assert only_k.bytes_per_token == 36 * 8 * (128 + 256) and only_k.kv_format == "k=fp8_e4m3 v=default"
    assert build_layout("qwen3-8b", k_format="nvfp4", v_format="nvfp4").kv_format == "nvfp4"  # same = uniform


def test_mla_latent_and_rope_key_apart():
    L = build_layout("deepseek-v3", k_format="fp8_e4m3_b128", v_format="bf16")  # fp8_ds_mla's latent / RoPE split
    assert L.bytes_per_token == 61 * (512 + 16 + 128)


def test_split_formats_are_refused_where_keys_and_values_are_one_vector():
    with pytest.raises(ParameterError, match="one kv_format"):
        build_layout("deepseek-v4-flash", k_format="fp8_e4m3", v_format="nvfp4")
    with pytest.raises(ParameterError, match="not both"):
        build_layout("qwen3-8b", kv_format="fp8_e4m3", k_format="nvfp4")


def test_cli_k_and_v_formats(capsys):
    import json
    from kvlab.cli import main
    assert main(["bytes", "qwen3-8b", "--k-format", "fp8_e4m3", "--v-format", "nvfp4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_format"] == "k=fp8_e4m3 v=nvfp4" and out["bytes_per_token"] == 36 * 8 * 200
    assert main(["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--k-format", "fp8_e4m3",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_per_token"] == 36 * 8 * (128 + 256)
