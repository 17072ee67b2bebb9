"""Measured against predicted: build a model's packed cache on a device and compare its bytes.

`measure_cache` predicts the session bytes (`kvlab.layout` for exact storage, `kvlab.engines`
for paged), refuses sizes that would not fit before allocating anything, fills a `KVCache`
inside `kvlab.cache.memory.measure`, and reports measured, predicted and the difference with its cause.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .kvcache import KVCache
from ..engines import EXACT, allocate
from ..layout import check_tokens
from .memory import MemoryRecord, check_fits, measure, resolve_device


@dataclass(frozen=True)
class CacheMeasurement:
    """One model at one length: what the packed cache holds against the byte math."""

    model: str  # catalog name or config stem
    scheme: str  # layout scheme: "storage", "vllm" or "bf16"
    kv_format: str | None  # uniform override format, if any
    engine: str  # "exact" or the paging engine's name
    block_tokens: int | None  # tokens per page (None: exact storage)
    device: str  # where the cache was built
    method: str  # how measured_bytes was obtained (memory.MemoryRecord.method)
    tokens: int  # context length
    measured_bytes: int  # what the cache holds (by `method`)
    measured_growing_bytes: int  # storage of the growing components
    measured_bounded_bytes: int  # storage of windows, tails and per-tensor scales
    predicted_bytes: int  # exact layout bytes (Layout.session(T).total)
    predicted_growing_bytes: int  # Layout.session(T).growing
    predicted_bounded_bytes: int  # Layout.session(T).bounded
    predicted_allocated_bytes: int  # what the engine allocates (Allocation.session(T).total; = predicted when exact)
    difference_bytes: int  # measured - predicted
    predicted_rounding_bytes: int  # predicted_allocated - predicted: the page rounding the engine predicts
    cause: str  # why the difference is what it is
    check_bytes: int | None  # independent check (profiler net bytes on CPU, the tensors' storage on CUDA)
    check_method: str  # "profiler", "storage" or "none"
    peak_bytes: int | None  # peak during the build (see MemoryRecord)
    reserved_bytes: int | None  # CUDA allocator reserve after the build
    block_bytes: int | None  # CUDA: the allocator's blocks for it (rounded up; see MemoryRecord); CPU: None

    @property
    def exact(self) -> bool:
        """Measured equals what the engine predicts, to the byte."""
        return self.difference_bytes == self.predicted_rounding_bytes

    def as_dict(self) -> dict:
        return {**asdict(self), "matches_prediction": self.exact}


def measure_cache(model, tokens: int, scheme: str = "storage", kv_format=None, paged: bool = False,
                  device="auto", seed: int = 0, profile: bool = True) -> CacheMeasurement:
    """Build `model`'s cache at `tokens` tokens on `device` (fast fill) and measure it: the layout of `scheme`
    (kvlab.layout.SCHEMES) or of one uniform `kv_format`, exact storage or the scheme's paged engine."""
    tokens = check_tokens(tokens)
    dev = resolve_device(device)
    a = allocate(model, scheme, kv_format)
    engine = a.engine if paged else EXACT
    alloc = allocate(a.layout, engine=engine)
    exact, pred = a.layout.session(tokens), alloc.session(tokens)
    check_fits(pred.total + _pool_bytes(a.layout), dev, f"{a.layout.model.name} at {tokens:,} tokens")

    _warm_up(a.layout, dev)

    def build():
        c = KVCache(a.layout, engine, dev)
        c.fill(tokens, seed=seed)
        return c

    cache, rec = measure(build, lambda c: c.tensors(), dev, profile=profile)
    grow, bound = cache.held_bytes(True), cache.held_bytes(False)
    diff = rec.held_bytes - exact.total
    rounding = pred.total - exact.total
    cause = _cause(rec, diff, rounding, engine, storage=grow + bound)
    del cache
    return CacheMeasurement(
        a.layout.model.name, a.layout.scheme, a.layout.kv_format, engine.name, engine.block_tokens, rec.device,
        rec.method, tokens, rec.held_bytes, grow, bound, exact.total, exact.growing, exact.bounded, pred.total,
        diff, rounding, cause, rec.check_bytes, rec.check_method, rec.peak_bytes, rec.reserved_bytes,
        rec.block_bytes)


def _warm_up(layout, device) -> None:
    """Pack one vector per part format before measuring, so constants the quantizers build lazily
    on first use (and then keep) are not counted as the cache's bytes by the profiler."""
    from . import quantizer
    seen = set()
    for _, c in layout.components():
        for p in c.entry.parts:
            if (p.fmt.name, p.elements) not in seen:
                seen.add((p.fmt.name, p.elements))
                quantizer.pack(torch.ones(1, p.elements, device=device), p.fmt)


def _pool_bytes(layout) -> int:
    """Headroom for fill()'s temporaries: one 16-entry pool of the largest row, as float32 and index tensors."""
    rows = [c.entry.elements * c.copies for _, c in layout.components()] or [0]
    return 16 * max(rows) * 8 + (1 << 20)


def _cause(rec: MemoryRecord, diff: int, rounding: int, engine, storage: int) -> str:
    if rec.held_bytes != storage:
        why = (f"{rec.method} counts {rec.held_bytes - storage:+,} B beside the cache's {storage:,} B of storage "
               "(an allocation the build left behind)")
    elif diff == 0 and rounding == 0:
        why = "none: exact storage holds exactly the layout's bytes"
    elif diff == rounding:
        why = (f"page rounding of {engine.block_tokens}-token pages"
               + (f" aligned to {engine.page_align} B" if engine.page_align > 1 else "")
               + ", exactly as kvlab.engines predicts")
    else:
        why = (f"measured differs from the engine's prediction by {diff - rounding:,} B: "
               "a compressor tail holds more pending tokens than one page of ceil(block/m) entries "
               "(kvlab.engines counts one page per tail)")
    if rec.block_bytes is not None and rec.block_bytes != rec.held_bytes:
        why += (f"; the CUDA caching allocator's blocks for it take {rec.block_bytes - rec.held_bytes:,} B more "
                "(each rounded up to 512 B; a large block's remainder under 1 MiB is not split off)")
    return why


def sweep(models, kv_formats, lengths, scheme: str = "storage", device="auto", budget_bytes: int | None = None,
          paged: bool = False, profile: bool = True) -> list[dict]:
    """measure_cache over models x formats x lengths; sizes over `budget_bytes` are listed as skipped.

    kv_formats: format names, or None / "" / "default" for the layout's own formats."""
    rows = []
    for model in models:
        for fmt in kv_formats:
            fmt = None if fmt in (None, "", "default") else fmt
            a = allocate(model, scheme, fmt)
            for t in lengths:
                pred = (a if paged else allocate(a.layout, engine=EXACT)).session(t).total
                base = dict(model=a.layout.model.name, kv_format=fmt or "default", tokens=t, predicted_bytes=pred)
                if budget_bytes is not None and pred > budget_bytes:
                    rows.append({**base, "status": f"skipped: {pred:,} B > budget {budget_bytes:,} B"})
                    continue
                m = measure_cache(model, t, scheme, fmt, paged=paged, device=device, profile=profile)
                rows.append({**base, **m.as_dict(), "kv_format": fmt or "default", "status": "measured"})
    return rows
