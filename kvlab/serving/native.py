"""Whether a GPU and an engine run a KV format natively: the one-line caveat every planning output carries when not.

A GPU runs a format natively when it computes the format's element type (data/hardware.json `native_types`, from
each datasheet's tensor-core precisions): NVFP4 KV (E2M1 elements) on a Hopper GPU, or FP8 KV on an A100, is held in
the bytes kvlab counts but dequantized in software before attention. An engine runs it when it offers it as a KV
cache dtype (kvlab.engines.ENGINE_FORMATS, with its sources): vLLM offers no NVFP4 or INT4 KV cache, so a plan that
prices one under vLLM describes a cache vLLM does not build.
"""
from __future__ import annotations

from ..engines import ENGINE_FORMATS
from ..formats import dtype_format, get_format
from ..hardware import Gpu, get_gpu
from ..layout import build_layout
from ..models import load_model


ELEMENT_NAMES = {"e2m1": "FP4 (E2M1)", "e4m3": "FP8 E4M3", "e5m2": "FP8 E5M2", "bf16": "BF16", "fp16": "FP16",
                 "fp32": "FP32", "int8": "INT8", "int4": "INT4", "int2": "INT2"}  # element -> how datasheets say it


def foreign_elements(model, gpu: Gpu | str, kv_format=None, k_format=None, v_format=None) -> list[str]:
    """Element types of the model's cached KV entries (this format choice) that `gpu` does not compute natively."""
    g = get_gpu(gpu)
    layout = build_layout(model, "storage", kv_format, k_format=k_format, v_format=v_format)
    seen = dict.fromkeys(p.fmt.element.name for _, c in layout.components() if not c.state for p in c.entry.parts)
    return [e for e in seen if not g.runs_natively(e)]


def engine_lacks(model, engine: str | None, kv_format=None, k_format=None, v_format=None) -> list[str]:
    """The formats asked for (kv / k / v, kvlab or the engine's own names) that `engine` offers no KV cache in."""
    if engine not in ENGINE_FORMATS:
        return []
    offered = {f for f in ENGINE_FORMATS[engine].values() if f is not None}
    own = dtype_format(load_model(model).torch_dtype).name  # the model's dtype is the engine's "auto"
    out = []
    for f in (kv_format, k_format, v_format):
        if f is None or f in ENGINE_FORMATS[engine]:
            continue
        name = get_format(f).name
        if name != own and name not in offered and name not in out:
            out.append(name)
    return out


def kv_caveat(model, gpu: Gpu | str, engine: str | None = None, kv_format=None, k_format=None,
              v_format=None) -> str | None:
    """One line saying which of the KV's element types the GPU does not compute natively and which asked-for
    format the engine does not offer; None when both run it natively."""
    g = get_gpu(gpu)
    parts = []
    foreign = foreign_elements(model, g, kv_format, k_format, v_format)
    if foreign:
        arch = f" ({g.architecture})" if g.architecture else ""
        name = lambda e: ELEMENT_NAMES.get(e, e)  # noqa: E731
        parts.append(f"{g.name}{arch} has no {' / '.join(map(name, foreign))} arithmetic (it computes "
                     f"{', '.join(name(t) for t in g.native_types if t != 'fp32')}): the KV is held in the bytes "
                     "counted but dequantized in software for attention")
    lacks = engine_lacks(model, engine, kv_format, k_format, v_format)
    if lacks:
        parts.append(f"{engine} offers no {' / '.join(lacks)} KV cache (its KV dtypes: "
                     f"{', '.join(ENGINE_FORMATS[engine])})")
    return "; ".join(parts) or None
