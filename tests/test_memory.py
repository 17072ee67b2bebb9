"""Measurement: storage accounting, profiler cross-check, refusals, measured == predicted."""
import pytest
import torch

from kvlab.engines import allocate
from kvlab.errors import KvlabError, ParameterError
from kvlab.cache.measurement import measure_cache
from kvlab.cache.memory import (InsufficientMemoryError, available_bytes, check_fits, measure, resolve_device,
                          storage_bytes)


def test_storage_bytes_counts_aliased_storage_once():
    a = torch.zeros(100, dtype=torch.uint8)
    b = a[10:20]  # a view: same storage
    c = torch.zeros(7, dtype=torch.bfloat16)
    assert storage_bytes([a, b, c]) == 100 + 14


def test_cpu_measure_agrees_with_the_profiler():
    def build():
        tmp = torch.ones(1000)  # a temporary: freed, not held
        return [torch.zeros(12345, dtype=torch.uint8), torch.zeros(3, 5) + tmp[:1]]

    held, rec = measure(build, lambda r: r, torch.device("cpu"))
    assert rec.device == "cpu" and rec.method == "storage" and rec.check_method == "profiler"
    assert rec.held_bytes == 12345 + 60
    assert rec.check_bytes == rec.held_bytes
    assert rec.peak_bytes >= rec.held_bytes + 4000


@pytest.mark.parametrize("name,tokens", [("qwen3-8b", 300), ("deepseek-v3.2", 1000),
                                         ("deepseek-v4-pro", 5_000)])
def test_measure_cache_exact(name, tokens):
    m = measure_cache(name, tokens, device="cpu")
    assert m.measured_bytes == m.predicted_bytes == m.check_bytes
    assert m.measured_growing_bytes == m.predicted_growing_bytes
    assert m.measured_bounded_bytes == m.predicted_bounded_bytes
    assert m.difference_bytes == 0 and m.exact and m.cause.startswith("none")


@pytest.mark.parametrize("name,tokens", [("qwen3-8b", 1001), ("deepseek-v4-flash", 1025)])
def test_measure_cache_paged_difference_is_page_rounding(name, tokens):
    m = measure_cache(name, tokens, scheme="vllm", paged=True, device="cpu")
    a = allocate(name, "vllm")
    assert m.predicted_rounding_bytes == a.session(tokens).total - a.layout.session(tokens).total > 0
    assert m.difference_bytes == m.predicted_rounding_bytes
    assert m.measured_bytes == m.check_bytes and m.exact and "page rounding" in m.cause


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)")


@CUDA
def test_cuda_measure_counts_requested_bytes_not_allocator_blocks():
    """An odd-sized tensor: the allocator's block is rounded up, what it was asked for is the tensor's bytes."""
    dev = torch.device("cuda")
    kept = []
    _, rec = measure(lambda: kept.append(torch.empty(3 * 2**20 + 1000, dtype=torch.uint8, device=dev)) or kept,
                     lambda ts: ts, dev)
    assert rec.method == "cuda_requested" and rec.check_method == "storage"
    assert rec.held_bytes == rec.storage_bytes == rec.check_bytes == 3 * 2**20 + 1000
    assert rec.block_bytes >= rec.held_bytes and rec.block_bytes % 512 == 0


@CUDA
@pytest.mark.parametrize("name,fmt,tokens,paged", [
    ("qwen3-8b", None, 131_072, False), ("qwen3-8b", "nvfp4", 4_097, False),
    ("deepseek-v4.1-flash", None, 1_000_000, False), ("qwen3-8b", None, 4_097, True)])
def test_cuda_measure_cache_equals_prediction(name, fmt, tokens, paged):
    m = measure_cache(name, tokens, scheme="vllm" if paged else "storage", kv_format=fmt, paged=paged,
                      device="cuda")
    assert m.method == "cuda_requested" and m.exact
    assert m.measured_bytes == m.check_bytes == m.predicted_bytes + m.predicted_rounding_bytes
    assert m.block_bytes >= m.measured_bytes


def test_too_large_is_refused_before_allocating():
    avail = available_bytes(torch.device("cpu"))
    assert avail > 0
    with pytest.raises(InsufficientMemoryError, match=r"needs [\d,]+ B but cpu has [\d,]+ B available"):
        measure_cache("llama-3.1-70b", 10_000_000, device="cpu")  # 3.3 TB
    with pytest.raises(InsufficientMemoryError):
        check_fits(avail + 1, torch.device("cpu"))
    assert check_fits(1, torch.device("cpu")) == pytest.approx(avail, rel=0.5)


def test_devices():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    with pytest.raises(ParameterError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ParameterError, match="no CUDA device"):
            resolve_device("cuda")
    with pytest.raises(KvlabError, match="unknown number format"):
        measure_cache("qwen3-8b", 10, kv_format="fp7", device="cpu")
    with pytest.raises(KvlabError, match="tokens must be"):
        measure_cache("qwen3-8b", -1, device="cpu")
