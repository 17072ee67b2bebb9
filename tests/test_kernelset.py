"""kvlab.hf.kernelset: SDPA's math backend exactly when torch's CPU kernel set is forced below the hardware's."""
import os
import subprocess
import sys

import pytest
import torch

from kvlab.hf import kernelset
from kvlab.hf.kernelset import forced_below_hardware, math_attention_if_forced

AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
AVX2_ONLY = frozenset({"avx2", "fma"})


@pytest.mark.parametrize("env, capability, flags, forced", [
    ({}, "AVX2", AMX, False),  # nothing forced: torch picked AVX2 itself
    ({"ATEN_CPU_CAPABILITY": "avx2"}, "AVX2", AMX, True),  # the failing case: AMX hardware, AVX2 dispatch
    ({"ATEN_CPU_CAPABILITY": "default"}, "DEFAULT", AMX, True),
    ({"ATEN_CPU_CAPABILITY": "avx512"}, "AVX512", AMX, False),  # the packed path can run
    ({"ATEN_CPU_CAPABILITY": "avx2"}, "AVX2", AVX2_ONLY, False),  # nothing to pack for on this CPU
    ({"ATEN_CPU_CAPABILITY": "default"}, "DEFAULT", frozenset(), False),
])
def test_forced_below_hardware(env, capability, flags, forced):
    assert forced_below_hardware(capability, flags, env) is forced


def test_math_backend_only_when_forced(monkeypatch):
    flash = torch.backends.cuda.flash_sdp_enabled
    monkeypatch.setattr(kernelset, "forced_below_hardware", lambda: False)
    with math_attention_if_forced():
        assert flash()
    monkeypatch.setattr(kernelset, "forced_below_hardware", lambda: True)
    with math_attention_if_forced():
        assert not flash() and torch.backends.cuda.math_sdp_enabled()
    assert flash()  # restored


@pytest.mark.slow
@pytest.mark.parametrize("cap", ["avx2", "default"])
def test_bf16_passes_run_under_a_forced_kernel_set(cap):
    """A BF16 transformers model through kvlab's pass at 600 tokens, in a process with the kernel set forced."""
    code = ("import torch; from transformers import AutoConfig, AutoModelForCausalLM; "
            "from kvlab.hf import make_cache; from kvlab.hf.evaluate import run_pass; torch.manual_seed(0); "
            "cfg = AutoConfig.for_model('qwen3', vocab_size=256, hidden_size=64, intermediate_size=128, "
            "num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32); "
            "m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation='sdpa').eval(); "
            "ids = torch.randint(0, 256, (2, 600)); p = run_pass(m, ids, make_cache(m), 600); "
            "print(torch.backends.cpu.get_cpu_capability(), p.scored)")
    env = dict(os.environ, ATEN_CPU_CAPABILITY=cap, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == str(2 * 599)
