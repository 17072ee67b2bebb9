"""Each engine's rules against worked examples from its own source: vLLM, SGLang, TensorRT-LLM."""
import json
from fractions import Fraction

import pytest

from kvlab.cli import main
from kvlab.engines import allocate, engine_format
from kvlab.errors import ParameterError
from kvlab.serving.budget import kv_budget, sglang_mem_fraction
from kvlab.serving.capacity import plan
from kvlab.hardware import get_gpu

QWEN_BF16 = 147_456  # 2 x 36 x 8 x 128 x 2


# --- SGLang -----------------------------------------------------------------------------------------------
def test_sglang_pool_is_token_granular():
    a = allocate("qwen3-8b", engine="sglang")
    assert a.engine.block_tokens == 1 and a.bytes_per_token == QWEN_BF16
    assert a.session(17).total == 17 * QWEN_BF16  # no page rounding at page_size 1
    b = allocate("qwen3-8b", engine="sglang", page_size=64)
    assert b.session(17).total == 64 * QWEN_BF16  # --page-size 64: whole pages


def test_sglang_fp4_is_e2m1_with_an_8_bit_scale_per_16():
    """docs/advanced_features/quantized_kv_cache.md: blocks of 16 with one 8-bit scale; '3.56x more tokens than BF16',
    '1.78x more than FP8'."""
    fp4 = allocate("qwen3-8b", engine="sglang", kv_format="fp4_e2m1")
    assert fp4.layout.kv_format == "mxfp4_b16"
    assert fp4.bytes_per_token == 2 * 36 * 8 * (64 + 8)  # 128 dims: 64 B of codes + 8 B of scales
    assert round(float(QWEN_BF16 / fp4.bytes_per_token), 2) == 3.56
    fp8 = allocate("qwen3-8b", engine="sglang", kv_format="fp8_e4m3")
    assert round(float(fp8.bytes_per_token / fp4.bytes_per_token), 2) == 1.78
    assert fp8.layout.tensor_bytes == 72 * 4  # one FP32 k_scale / v_scale per layer


def test_sglang_int8_is_per_token_and_head():
    a = allocate("qwen3-8b", engine="sglang", kv_format="int8")
    assert a.bytes_per_token == 2 * 36 * 8 * (128 + 2 + 2)  # codes + FP16 scale + FP16 zero point per head


@pytest.mark.parametrize("gpu,tp,dp_attention,expected", [
    ("H200", 1, False, 0.907),  # nvidia-smi's 143,771 MiB: the < 160 GiB class, 8k chunk, CUDA graphs to 256
    ("H200", 8, False, 0.897),  # graphs to 512, + TP x PP / 8 GiB
    ("H200", 8, True, 0.769),  # DP attention pads the graphs per rank
    ("H100", 1, False, 0.835),  # nvidia-smi's 81,559 MiB
    ("B200", 8, False, 0.852),  # 16k chunk class (no nvidia-smi figure known: the datasheet's 192 GB)
])
def test_sglang_derives_mem_fraction_static(gpu, tp, dp_attention, expected):
    """server_args.py _handle_gpu_memory_settings: reserved = 512 + 1.5 x chunk + 2 x graph batch + tp x pp / 8 GiB
    (+ DP attention), at least 10 GiB above 60 GiB; mem_fraction_static = round((mem - reserved) / mem, 3)."""
    g = get_gpu(gpu)
    m = sglang_mem_fraction(g, tp, 1, dp_attention, tp if dp_attention else 1)
    mem = g.smi_memory_mib or g.hbm_bytes / 2**20  # SGLang reads nvidia-smi's memory.total
    assert m.gpu_mem_mib == mem
    bs = m.cuda_graph_max_bs
    reserved = 512 + 1.5 * m.chunked_prefill_size + 2 * bs + tp / 8 * 1024 + (bs * tp * 4.5 if dp_attention else 0)
    assert m.reserved_mib == max(reserved, 10 * 1024)
    assert m.mem_fraction_static == round((mem - m.reserved_mib) / mem, 3) == expected


def test_sglang_budget_takes_mem_fraction_of_the_total():
    g = get_gpu("H200")
    b = kv_budget("sglang", g, weight_share=16_400_000_000, activation_bytes=4_000_000_000)
    assert b.kv_bytes == int(g.hbm_bytes * 0.907) - 16_400_000_000  # activations live in the 1 - fraction
    assert "mem_fraction_static 0.907 derived" in b.rule and "server_args.py" in b.source


# --- TensorRT-LLM ---------------------------------------------------------------------------------------------
def test_trtllm_pages_32_token_blocks():
    a = allocate("qwen3-8b", engine="trtllm")
    assert a.engine.block_tokens == 32
    assert a.session(33).total == 64 * QWEN_BF16


def test_trtllm_nvfp4_matches_get_cache_size_per_token():
    """resource_manager.py get_cache_size_per_token: ceil(n / 2) + ceil(n / 16) bytes for n FP4 values."""
    n = 2 * 36 * 8 * 128  # K and V values per token
    a = allocate("qwen3-8b", engine="trtllm", kv_format="nvfp4")
    assert a.layout.kv_format == "nvfp4_2level"
    assert a.bytes_per_token == -(-n // 2) + -(-n // 16)


def test_trtllm_mla_is_one_latent_not_split():
    """get_cache_size_per_token: MLA head_dim = kv_lora_rank + qk_rope_head_dim, kv_factor 1, no TP division."""
    assert allocate("deepseek-v3", engine="trtllm").bytes_per_token == 61 * (512 + 64) * 2


def test_trtllm_fraction_is_of_free_memory():
    """_util.py KvCacheCreator._cal_max_memory: (total - peak) x free_gpu_memory_fraction."""
    g = get_gpu("H200")
    b = kv_budget("trtllm", g, weight_share=16_400_000_000, activation_bytes=4_000_000_000)
    assert b.kv_bytes == int((g.hbm_bytes - 16_400_000_000 - 4_000_000_000) * 0.9)
    v = kv_budget("vllm", g, weight_share=16_400_000_000, activation_bytes=4_000_000_000)
    assert b.kv_bytes > v.kv_bytes  # 0.9 of the free memory leaves more than 0.9 of the total minus the same


# --- vLLM and what is refused -------------------------------------------------------------------------------
def test_vllm_stays_the_default_engine_rule():
    assert allocate("qwen3-8b", engine="vllm").engine.block_tokens == 16
    assert allocate("deepseek-v4-flash", engine="vllm").bytes_per_token == 3915
    assert allocate("qwen3-8b", "vllm").engine == allocate("qwen3-8b", engine="vllm").engine


def test_vllm_mla_block_follows_the_sm90_backend():
    """SM90 runs a BF16 latent on FLASH_ATTN_MLA (16-token blocks) and an FP8 one on FLASHMLA (64), which the
    oracle's DeepSeek-V3 cases confirm (tests/fixtures/vllm_capacity.json); V3.2's sparse MLA keeps 64."""
    assert allocate("deepseek-v3", engine="vllm").engine.block_tokens == 16
    assert allocate("deepseek-v3", engine="vllm", kv_format="fp8").engine.block_tokens == 64
    assert allocate("deepseek-v3.2", engine="vllm").engine.block_tokens == 64


@pytest.mark.parametrize("call,words", [
    (lambda: allocate("qwen3-8b", engine="sglang", kv_format="nvfp4"), ["sglang does not store KV as nvfp4",
                                                                         "fp4_e2m1"]),
    (lambda: allocate("qwen3-8b", engine="trtllm", kv_format="mxfp4"), ["trtllm does not store KV as mxfp4"]),
    (lambda: allocate("deepseek-v4-flash", engine="sglang"), ["no published sglang layout", "dsv4"]),
    (lambda: allocate("deepseek-v4.1-flash", engine="vllm"), ["no published 'vllm' layout"]),
    (lambda: engine_format("trtllm", "int4"), ["trtllm has no KV dtype 'int4'", "nvfp4"]),
])
def test_engine_refusals_name_the_rule(call, words):
    with pytest.raises(ParameterError) as e:
        call()
    for w in words:
        assert w in str(e.value)


def test_capacity_reports_the_engine_rule_it_used():
    for engine in ("vllm", "sglang", "trtllm"):
        c = plan("qwen3-8b", "H200", 131_072, engine=engine)
        assert c.budget.engine == engine and c.engine == engine
        assert c.as_dict()["memory_rule"]["engine"] == engine
    legacy = plan("qwen3-8b", "H200", 131_072)
    assert legacy.engine == "exact" and legacy.budget.engine == "vllm"


def test_cli_engine_options(capsys):
    assert main(["bytes", "qwen3-8b", "--engine", "sglang", "--kv-format", "fp4_e2m1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "sglang" and out["kv_format"] == "mxfp4_b16" and out["bytes_per_token"] == 41_472
    assert main(["sessions", "qwen3-8b", "--gpu", "H200", "--context", "32768", "--engine", "trtllm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "trtllm" and "free_gpu_memory_fraction" in out["memory_rule"]["source"]
    assert Fraction(out["bytes_per_token"]) == QWEN_BF16
