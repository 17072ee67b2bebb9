"""How much of a GPU each engine gives its KV pool, by the engine's own rule.

  vLLM     gpu_memory_utilization (0.9) x total memory - weights - peak activations and non-torch memory
           (vllm/v1/worker/gpu_worker.py determine_available_memory)
  SGLang   mem_fraction_static x total memory - weights: mem_fraction_static is (weights + KV pool) / total, the
           rest left to activations and CUDA graphs (python/sglang/srt/model_executor/model_runner.py
           profile_max_num_token); unset, it is derived at start-up from the GPU's memory, the chunked-prefill
           size, the CUDA-graph batch, TP x PP and DP attention (python/sglang/srt/server_args.py
           _handle_gpu_memory_settings), so it differs per GPU and deployment (sgl-project/sglang issue #29092)
  TRT-LLM  free_gpu_memory_fraction (0.9) of the memory *free* after weights and a profiling run's peak
           activations, not of the total (tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator._cal_max_memory:
           (total - peak + allocated) x fraction)
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import need_choice, need_int, need_number
from ..hardware import Gpu

VLLM_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization (vLLM engine arguments)
TRTLLM_FREE_FRACTION = 0.9  # KvCacheConfig.free_gpu_memory_fraction default (tensorrt_llm/llmapi/llm_args.py)
MIB = 2**20
BUDGET_ENGINES = ("vllm", "sglang", "trtllm")
MAX_KV_BYTES = 2**60  # bound on a KV pool anyone types


@dataclass(frozen=True)
class KvBudget:
    """The KV pool one GPU gets, and the rule that gave it."""

    engine: str  # whose rule
    kv_bytes: int  # bytes for the KV pool on one GPU
    fraction: float  # the engine's memory fraction as applied (utilization / mem_fraction_static / free fraction)
    rule: str  # the arithmetic, with the numbers in it
    source: str  # where the rule comes from


@dataclass(frozen=True)
class SglangMemory:
    """SGLang's start-up derivation of mem_fraction_static."""

    gpu_mem_mib: float  # device memory in MiB, as SGLang reads it
    chunked_prefill_size: int  # tokens per prefill chunk (by memory class)
    cuda_graph_max_bs: int  # largest CUDA-graph batch (by memory class and TP)
    reserved_mib: float  # activations + CUDA graphs + constant metadata reserve
    mem_fraction_static: float  # round((gpu_mem - reserved) / gpu_mem, 3)


def sglang_mem_fraction(gpu: Gpu, tp: int = 1, pp: int = 1, dp_attention: bool = False, dp: int = 1) -> SglangMemory:
    """mem_fraction_static as SGLang derives it when unset (server_args.py _handle_gpu_memory_settings; no
    speculative decoding, no piecewise CUDA graphs, text-only). SGLang reads the GPU's memory from nvidia-smi's
    memory.total (python/sglang/srt/utils get_nvgpu_memory_capacity), the driver's reserve included: the catalog's
    `smi_memory_mib` where known (an H200: 143,771 MiB), else the memory planned with."""
    tp, pp, dp = need_int("tp", tp, 1), need_int("pp", pp, 1), need_int("dp", dp, 1)
    mem = gpu.smi_memory_mib or gpu.hbm_bytes / MIB
    if mem < 20 * 1024:
        chunk, bs = 2048, 8
    elif mem < 35 * 1024:
        chunk, bs = 2048, 24 if tp < 4 else 80
    elif mem < 60 * 1024:
        chunk, bs = 4096, 32 if tp < 4 else 160
    elif mem < 160 * 1024:
        chunk, bs = 8192, 256 if tp < 4 else 512
    else:
        chunk, bs = 16384, 512
    reserved = 512 + max(chunk, 2048) * 1.5 + bs * 2 + tp * pp / 8 * 1024
    if dp_attention:
        reserved += bs * dp * 3
        if bs > 300:
            reserved += bs * dp * 1.5
    if mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return SglangMemory(mem, chunk, bs, reserved, round((mem - reserved) / mem, 3))


def kv_budget(engine: str, gpu: Gpu, weight_share: int, activation_bytes: int, *, fraction: float | None = None,
              tp: int = 1, pp: int = 1, dp_attention: bool = False) -> KvBudget:
    """The KV pool of one GPU holding `weight_share` bytes of weights under `engine`'s rule; `fraction` overrides
    the engine's (gpu_memory_utilization, mem_fraction_static, free_gpu_memory_fraction)."""
    engine = need_choice("engine", engine, BUDGET_ENGINES)
    weight_share = need_int("weight_share", weight_share)
    activation_bytes = need_int("activation_bytes", activation_bytes)
    tp, pp = need_int("tp", tp, 1), need_int("pp", pp, 1)
    if fraction is not None:
        fraction = need_number("memory fraction", fraction, 0.0, 1.0, lo_open=True)
    total = gpu.hbm_bytes
    if engine == "vllm":
        u = VLLM_UTILIZATION if fraction is None else fraction
        kv = int(total * u) - weight_share - activation_bytes
        return KvBudget("vllm", kv, u, f"{total:,} B x {u:g} - {weight_share:,} B weights - {activation_bytes:,} B "
                                       f"activations = {kv:,} B",
                        "vllm/v1/worker/gpu_worker.py determine_available_memory (gpu_memory_utilization)")
    if engine == "sglang":
        if fraction is None:
            m = sglang_mem_fraction(gpu, tp, pp, dp_attention, tp if dp_attention else 1)
            fraction = m.mem_fraction_static
            how = (f"mem_fraction_static {fraction:g} derived: ({m.gpu_mem_mib:,.0f} MiB - {m.reserved_mib:,.0f} MiB "
                   f"reserved for a {m.chunked_prefill_size}-token prefill chunk and CUDA graphs up to batch "
                   f"{m.cuda_graph_max_bs}) / {m.gpu_mem_mib:,.0f} MiB")
        else:
            how = f"mem_fraction_static {fraction:g} given"
        kv = int(total * fraction) - weight_share
        return KvBudget("sglang", kv, fraction, f"{how}; {total:,} B x {fraction:g} - {weight_share:,} B weights = "
                                                f"{kv:,} B",
                        "python/sglang/srt/server_args.py _handle_gpu_memory_settings; "
                        "python/sglang/srt/model_executor/model_runner.py profile_max_num_token")
    f = TRTLLM_FREE_FRACTION if fraction is None else fraction
    free = total - weight_share - activation_bytes
    kv = int(free * f)
    return KvBudget("trtllm", kv, f, f"({total:,} B - {weight_share:,} B weights - {activation_bytes:,} B "
                                     f"activations) = {free:,} B free x {f:g} = {kv:,} B",
                    "tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator._cal_max_memory "
                    "(free_gpu_memory_fraction of free memory)")


def given_budget(engine: str, kv_bytes: int) -> KvBudget:
    """A KV pool given outright, as vLLM's --kv-cache-memory-bytes gives it (vllm/v1/worker/gpu_worker.py
    determine_available_memory: kv_cache_memory_bytes replaces the profiled figure)."""
    engine = need_choice("engine", engine, BUDGET_ENGINES)
    kv = need_int("kv_cache_memory_bytes", kv_bytes, 1, MAX_KV_BYTES)
    return KvBudget(engine, kv, 1.0, f"{kv:,} B of KV memory given (kv_cache_memory_bytes)",
                    "vLLM --kv-cache-memory-bytes (vllm/v1/worker/gpu_worker.py determine_available_memory)")
