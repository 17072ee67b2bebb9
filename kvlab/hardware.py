"""Accelerator catalog: device memory, its bandwidth, dense tensor FLOPs, host link, host DRAM and SSD bandwidth.

Figures live in data/hardware.json with a source for each; `get_gpu(name, **overrides)`
returns a `Gpu` whose every field can be replaced, and `load_catalog(path)` reads another
file of the same shape. Units are decimal (GB = 1e9 B) because vendors quote them so.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from .checks import need_number
from .errors import ParameterError
from .models import DATA_DIR

HARDWARE_FILE = DATA_DIR / "hardware.json"
FIELDS = ("hbm_gb", "hbm_tb_s", "host_link_gb_s", "host_dram_gb", "ssd_gb_s")
OPTIONAL = ("bf16_tflops", "fp8_tflops")  # compute peaks (kvlab.serving.steptime's roofline); 0 = not given
FIELD_MAX = 1e6  # no device comes near a million GB or TB/s; a bound keeps GB -> bytes within int range


@dataclass(frozen=True)
class Gpu:
    """One accelerator and the tiers around it."""

    name: str  # catalog key, e.g. "H100"
    description: str  # product name
    hbm_gb: float  # device memory, GB (1e9 B)
    hbm_tb_s: float  # device memory bandwidth, TB/s
    host_link_gb_s: float  # GPU <-> host bandwidth per direction, GB/s
    host_dram_gb: float  # host DRAM per GPU available to a KV tier, GB
    ssd_gb_s: float  # SSD read bandwidth per GPU, GB/s
    bf16_tflops: float = 0.0  # dense BF16 tensor-core peak, TFLOPS (1e12 FLOP/s; without sparsity); 0: unknown
    fp8_tflops: float = 0.0  # dense FP8 tensor-core peak, TFLOPS; 0: unknown
    sources: dict = field(default_factory=dict, compare=False)  # field -> where its figure comes from

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gb * 1e9)

    @property
    def host_dram_bytes(self) -> int:
        return int(self.host_dram_gb * 1e9)

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_s * 1e12

    @property
    def host_link_bytes_per_s(self) -> float:
        return self.host_link_gb_s * 1e9

    @property
    def ssd_bytes_per_s(self) -> float:
        return self.ssd_gb_s * 1e9

    def flops_per_s(self, dtype: str = "bf16") -> float:
        """Dense tensor peak for "bf16" or "fp8" matmuls, FLOP/s (a ParameterError when the catalog lacks it)."""
        tf = getattr(self, f"{dtype}_tflops", None)
        if not tf:
            raise ParameterError(f"GPU {self.name}: no {dtype}_tflops figure; pass {dtype}_tflops= (TFLOPS) to get_gpu")
        return tf * 1e12


def load_catalog(path: str | Path = HARDWARE_FILE) -> dict[str, Gpu]:
    """Every GPU in a hardware JSON file, by upper-case name."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ParameterError(f"{path}: not a readable hardware catalog ({e})") from None
    raw = raw.get("gpus") if isinstance(raw, dict) else None
    if not isinstance(raw, dict):
        raise ParameterError(f"{path}: a hardware catalog is a JSON object whose 'gpus' maps names to their fields")
    out = {}
    for name, d in raw.items():
        if not isinstance(d, dict):
            raise ParameterError(f"{path}: GPU {name!r} must be a JSON object of {', '.join(FIELDS)}, got {d!r}")
        missing = [f for f in FIELDS if f not in d]
        if missing:
            raise ParameterError(f"{path}: GPU {name!r} lacks {', '.join(missing)}")
        out[name.upper()] = _checked(Gpu(name, d.get("description", name), *(d[f] for f in FIELDS),
                                         **{f: d[f] for f in OPTIONAL if f in d},
                                         sources=dict(d.get("sources", {}))))
    return out


def _checked(g: Gpu) -> Gpu:
    for f in FIELDS + OPTIONAL:
        need_number(f"GPU {g.name}: {f}", getattr(g, f), 0.0, FIELD_MAX, lo_open=f == "hbm_gb")
    return g


def gpu_names(path: str | Path = HARDWARE_FILE) -> list[str]:
    return list(load_catalog(path))


def get_gpu(name: str | Gpu, path: str | Path = HARDWARE_FILE, **overrides) -> Gpu:
    """A catalog GPU by name (case-insensitive), with any field overridden (e.g. hbm_gb=180)."""
    if isinstance(name, Gpu):
        g = name
    else:
        cat = load_catalog(path)
        key = name.upper() if isinstance(name, str) else None
        if key not in cat:
            raise ParameterError(f"unknown GPU {name!r}; choose one of {', '.join(cat)}")
        g = cat[key]
    bad = [k for k in overrides if k not in FIELDS + OPTIONAL]
    if bad:
        raise ParameterError(f"unknown GPU field {bad[0]!r}; fields are {', '.join(FIELDS + OPTIONAL)}")
    if overrides:
        src = dict(g.sources)
        src.update({k: "override" for k in overrides})
        g = replace(g, sources=src, **overrides)
    return _checked(g)
