"""Which CPU attention kernel runs when torch's kernel set is forced below the hardware's.

`ATEN_CPU_CAPABILITY=avx2` (or `default`) makes torch dispatch its vectorised CPU kernels to AVX2 (or scalar)
code, but some of its choices still look at the hardware: torch 2.13's CPU flash attention in BF16 / FP16 asks
oneDNN whether it can pack the operands for AMX / AVX512-BF16 matrix kernels, the hardware says yes, and the
packing routine (`pack_vnni2`), dispatched to AVX2 code, raises "pack_vnni2 is only supported when avx512 is
supported". Plain short SDPA calls never pack, so only longer reduced-precision attention fails, and only on a
CPU with those instructions (Intel Sapphire Rapids and later) under a forced lower kernel set.

`math_attention_if_forced()` is a context manager that, in exactly that situation, limits
`scaled_dot_product_attention` to its math backend (the reference composite of matmul and softmax, which
packs nothing); everywhere else it changes nothing. Every transformers forward kvlab runs for quality
(kvlab.hf.evaluate, kvlab.hf.quality, kvlab.train's evaluations) enters it.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from functools import lru_cache

import torch

FULL_SETS = ("AVX512", "AMX", "ZVECTOR", "SVE256", "SVE")  # torch capabilities that can run the packed path
PACKING_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f")  # CPU flags under which oneDNN may choose to pack


@lru_cache(maxsize=None)
def cpu_flags() -> frozenset:
    """The first CPU's flags from /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def forced_below_hardware(capability: str | None = None, flags: frozenset | None = None,
                          env: dict | None = None) -> bool:
    """True when ATEN_CPU_CAPABILITY forces a kernel set without AVX-512 on a CPU that has AVX-512 / AMX."""
    env = os.environ if env is None else env
    if not env.get("ATEN_CPU_CAPABILITY"):
        return False
    capability = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    flags = cpu_flags() if flags is None else flags
    return capability.upper() not in FULL_SETS and any(f in flags for f in PACKING_FLAGS)


@contextmanager
def math_attention_if_forced():
    """Run the block with SDPA's math backend when the kernel set is forced below the hardware's; else as is."""
    if not forced_below_hardware():
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):
        yield
