"""Measure what a block of code allocates and holds, on CPU or CUDA.

CUDA has the caching allocator's own records: its snapshot lists every block it has handed out with the
size that was asked for (`requested_size`); the blocks a build leaves allocated, asked-for sizes summed, are
the bytes it holds, cross-checked against the storage bytes of the tensors kvlab lists. The blocks themselves
are larger (each rounded up to 512 B, and a large block's remainder under 1 MiB is not split off), so the
`memory_allocated` delta is reported beside it as `block_bytes`, with `max_memory_allocated` the peak and
`memory_reserved` what the allocator keeps from the driver. CPU has none: the exact figure is the storage bytes of the
tensors the block produced (deduplicated by data pointer, as K and V may alias), cross-checked
against torch.profiler's memory events (the net of allocations minus frees inside the block).
Sources: PyTorch documentation (torch.cuda.memory_allocated / max_memory_allocated / memory_reserved /
reset_peak_memory_stats / memory_snapshot; c10/cuda/CUDACachingAllocator.cpp for the rounding and splitting; torch.profiler.profile(profile_memory=True); Tensor.untyped_storage().nbytes()).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..errors import ParameterError, WrongTypeError

DEVICES = ("auto", "cpu", "cuda")


class InsufficientMemoryError(ParameterError):
    """A requested size that would not fit in the device's free memory."""


@dataclass(frozen=True)
class MemoryRecord:
    """What one measured block allocated and holds."""

    device: str  # "cpu" or "cuda:0 (<name>)"
    method: str  # how held_bytes was measured: "storage" (tensor accounting) or "cuda_requested" (allocator)
    held_bytes: int  # bytes the block's result holds (by `method`)
    storage_bytes: int  # storage bytes of the result's tensors, deduplicated by data pointer
    check_bytes: int | None  # the independent figure: profiler net bytes (CPU) / storage bytes (CUDA)
    check_method: str  # "profiler", "storage" or "none"
    peak_bytes: int | None  # CUDA: max_memory_allocated increase during the block; CPU: profiler peak
    reserved_bytes: int | None  # CUDA: memory_reserved after the block (allocator caching); CPU: None
    block_bytes: int | None = None  # CUDA: memory_allocated increase, the allocator's rounded blocks; CPU: None


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cpu', 'cuda' or 'cuda:N' (N below the device count). Anything
    else (a malformed name such as 'cpu:xyz', another device type, a CUDA device this machine lacks) raises."""
    if not isinstance(device, (str, torch.device)):
        raise WrongTypeError(f"device must be a name (auto, cpu, cuda, cuda:N) or a torch.device, got "
                             f"{type(device).__name__} {device!r}")
    name = str(device)
    kind = name.split(":")[0]
    if kind not in DEVICES:
        raise ParameterError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)} (or cuda:N)")
    if kind == "auto":
        if name != "auto":
            raise ParameterError(f"unknown device {name!r}; 'auto' takes no index")
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ParameterError(f"malformed device {name!r}; choose one of {', '.join(DEVICES)} or cuda:N "
                             "(N a GPU index)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ParameterError(f"device {name!r} requested but torch sees no CUDA device (this torch build: "
                                 f"{torch.__version__}); use --device cpu or auto")
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise ParameterError(f"device {name!r} requested but torch sees {n} CUDA device(s) (cuda:0 to "
                                 f"cuda:{n - 1})")
    return dev


def device_name(device: torch.device) -> str:
    """A readable device name (the GPU's model for CUDA)."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return "cpu"


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind `tensors`, each storage counted once (by data pointer)."""
    seen, total = set(), 0
    for t in tensors:
        s = t.untyped_storage()
        key = (t.device, s.data_ptr())
        if key not in seen:
            seen.add(key)
            total += s.nbytes()
    return total


def available_bytes(device: torch.device) -> int:
    """Free memory on the device: CUDA free memory, or MemAvailable from /proc/meminfo on CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(needed: int, device: torch.device, what: str = "the cache", headroom: float = 0.9) -> int:
    """Refuse before allocating when `needed` bytes exceed `headroom` x the free memory."""
    avail = available_bytes(device)
    if needed > headroom * avail:
        raise InsufficientMemoryError(
            f"{what} needs {needed:,} B but {device.type} has {avail:,} B available "
            f"(refusing above {headroom:.0%} of it); use fewer tokens or a smaller format")
    return avail


def measure(fn: Callable[[], object], tensors_of: Callable[[object], Iterable[torch.Tensor]],
            device: torch.device, profile: bool = True) -> tuple[object, MemoryRecord]:
    """Run fn(); return its result and what it holds (tensors_of(result) lists the held tensors)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before, blocks_before = torch.cuda.memory_allocated(device), _cuda_blocks(device)
        result = fn()
        torch.cuda.synchronize(device)
        after, blocks_after = torch.cuda.memory_allocated(device), _cuda_blocks(device)
        new = [blocks_after[a] for a in blocks_after.keys() - blocks_before.keys()]
        held = storage_bytes(tensors_of(result))
        if all(req is not None for _, req in new):
            rec = MemoryRecord(device_name(device), "cuda_requested", sum(req for _, req in new), held, held,
                               "storage", torch.cuda.max_memory_allocated(device) - before,
                               torch.cuda.memory_reserved(device), after - before)
        else:  # a torch whose snapshot lacks requested sizes: the tensors' storage, the blocks beside it
            rec = MemoryRecord(device_name(device), "storage", held, held, None, "none",
                               torch.cuda.max_memory_allocated(device) - before, torch.cuda.memory_reserved(device),
                               after - before)
        return result, rec
    if not profile:
        result = fn()
        held = storage_bytes(tensors_of(result))
        return result, MemoryRecord("cpu", "storage", held, held, None, "none", None, None)
    from torch.profiler import ProfilerActivity, profile as _profile
    prof = _profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():  # kineto prints start / stop lines with timestamps on fd 2
        prof.__enter__()
    try:
        result = fn()
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)
    net, peak = _cpu_allocations(prof)
    held = storage_bytes(tensors_of(result))
    return result, MemoryRecord("cpu", "storage", held, held, net, "profiler", peak, None)


def _cuda_blocks(device: torch.device) -> dict[int, tuple[int, int | None]]:
    """The caching allocator's allocated blocks on `device`: address -> (block size, size asked for)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    out = {}
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device", index) != index:
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                out[b.get("address", addr)] = (b["size"], b.get("requested_size"))
            addr += b["size"]
    return out


def _cpu_allocations(prof) -> tuple[int, int]:
    """(net, peak) CPU bytes of a finished memory profile, read from its allocator records ("[memory]" events:
    + bytes for an allocation, - for a free) in time order. The records are what torch's own op-level
    self_cpu_memory_usage sums, read directly: building the op tree costs seconds per thousand ops."""
    from torch.autograd import DeviceType
    cpu = (DeviceType.CPU, DeviceType.MKLDNN, DeviceType.IDEEP)
    records = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type() in cpu)
    peak = cur = 0  # running sum: the peak at allocation granularity
    for _, nbytes in records:
        cur += nbytes
        peak = max(peak, cur)
    return int(cur), int(peak)


@contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (C++ log lines that Python's sys.stderr cannot catch)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
