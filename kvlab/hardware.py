"""Accelerator catalog: device memory, its bandwidth, dense tensor FLOPs, the element types computed natively, host
link, host DRAM and SSD bandwidth.

Figures live in data/hardware.json with a source for each; `get_gpu(name, **overrides)` returns a `Gpu` whose every
field can be replaced, and `load_catalog(path)` reads another file of the same shape. Units are decimal (GB = 1e9 B)
because vendors quote them so. Device memory is what the device reports where that is known (CUDA's total memory,
the figure vLLM's gpu_memory_utilization multiplies: 150,109,880,320 B on an H200), the datasheet's otherwise; the
datasheet figure is kept beside it (`datasheet_hbm_gb`) and `memory_from` says which one is used.
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from .checks import need_int, need_number
from .errors import ParameterError
from .models import DATA_DIR

HARDWARE_FILE = DATA_DIR / "hardware.json"
FIELDS = ("hbm_tb_s", "host_link_gb_s", "host_dram_gb", "ssd_gb_s")  # required beside a memory figure
MEMORY_KEYS = ("device_memory_bytes", "datasheet_hbm_gb", "hbm_gb")  # a catalog entry's memory, first found wins
OPTIONAL = ("bf16_tflops", "fp8_tflops")  # compute peaks (kvlab.serving.steptime's roofline); 0 = not given
OVERRIDABLE = ("hbm_gb",) + FIELDS + OPTIONAL  # fields get_gpu(**overrides) replaces
FIELD_MAX = 1e6  # no device comes near a million GB or TB/s; a bound keeps GB -> bytes within int range
MEMORY_FROM = ("device", "datasheet", "override")


@dataclass(frozen=True)
class Gpu:
    """One accelerator and the tiers around it."""

    name: str  # catalog key, e.g. "H100"
    description: str  # product name
    hbm_gb: float  # device memory used for planning, GB (1e9 B): the device's own report where known (memory_from)
    hbm_tb_s: float  # device memory bandwidth, TB/s
    host_link_gb_s: float  # GPU <-> host bandwidth per direction, GB/s
    host_dram_gb: float  # host DRAM per GPU available to a KV tier, GB
    ssd_gb_s: float  # SSD read bandwidth per GPU, GB/s
    bf16_tflops: float = 0.0  # dense BF16 tensor-core peak, TFLOPS (1e12 FLOP/s; without sparsity); 0: unknown
    fp8_tflops: float = 0.0  # dense FP8 tensor-core peak, TFLOPS; 0: unknown (or none)
    datasheet_hbm_gb: float = 0.0  # the vendor datasheet's memory, GB (0: not given)
    memory_bytes: int | None = None  # device memory as the device reports it, exact bytes (None: hbm_gb x 1e9)
    memory_from: str = "datasheet"  # where hbm_gb comes from: "device", "datasheet" or "override"
    smi_memory_mib: float | None = None  # nvidia-smi's memory.total, MiB (the driver's reserve included; SGLang
    #                                      sizes its memory class from it); None: not known
    architecture: str = ""  # e.g. "Hopper"
    native_types: tuple = ()  # element types (kvlab.formats names) it computes natively; (): not stated
    sources: dict = field(default_factory=dict, compare=False)  # field -> where its figure comes from

    @property
    def hbm_bytes(self) -> int:
        return self.memory_bytes if self.memory_bytes is not None else round(self.hbm_gb * 1e9)

    @property
    def host_dram_bytes(self) -> int:
        return round(self.host_dram_gb * 1e9)

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

    def runs_natively(self, element: str) -> bool:
        """Whether the GPU computes `element` (a kvlab.formats element name: bf16, e4m3, e2m1, int4, ...) natively;
        True when the catalog does not say."""
        return not self.native_types or element in self.native_types

    @property
    def memory_source(self) -> str:
        """Where the memory figure in use comes from (its catalog source, or "override")."""
        key = {"device": "device_memory_bytes", "datasheet": "datasheet_hbm_gb"}.get(self.memory_from)
        return self.sources.get(key, self.sources.get("hbm_gb", "")) if key else "override"

    def memory_label(self) -> str:
        """'150.1 GB as the device reports it (datasheet: 141 GB)': the memory figure and where it comes from."""
        how = {"device": "as the device reports it", "datasheet": "from the datasheet",
               "override": "as given"}[self.memory_from]
        out = f"{self.hbm_bytes / 1e9:,.4g} GB {how}"
        if self.memory_from != "datasheet" and self.datasheet_hbm_gb:
            out += f" (datasheet: {self.datasheet_hbm_gb:g} GB)"
        return out


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
        missing = [f for f in FIELDS if f not in d] + ([] if any(k in d for k in MEMORY_KEYS) else
                                                       ["a memory figure (datasheet_hbm_gb or device_memory_bytes)"])
        if missing:
            raise ParameterError(f"{path}: GPU {name!r} lacks {', '.join(missing)}")
        out[name.upper()] = _entry(path, name, d)
    return out


def _entry(path, name: str, d: dict) -> Gpu:
    datasheet = d.get("datasheet_hbm_gb", d.get("hbm_gb", 0.0))
    need_number(f"GPU {name}: datasheet_hbm_gb", datasheet, 0.0, FIELD_MAX)
    exact = d.get("device_memory_bytes")
    if exact is not None:
        exact = need_int(f"GPU {name}: device_memory_bytes", exact, 1, int(FIELD_MAX * 1e9))
    smi = d.get("nvidia_smi_memory_mib")
    if smi is not None:
        smi = need_number(f"GPU {name}: nvidia_smi_memory_mib", smi, 0.0, FIELD_MAX * 1e3, lo_open=True)
    types = d.get("native_types", [])
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ParameterError(f"{path}: GPU {name!r}: native_types must be a list of element names, got {types!r}")
    return _checked(Gpu(name, d.get("description", name), exact / 1e9 if exact is not None else datasheet,
                        *(d[f] for f in FIELDS), **{f: d[f] for f in OPTIONAL if f in d},
                        datasheet_hbm_gb=datasheet, memory_bytes=exact, smi_memory_mib=smi,
                        memory_from="device" if exact is not None else "datasheet",
                        architecture=str(d.get("architecture", "")), native_types=tuple(types),
                        sources=dict(d.get("sources", {}))))


def _checked(g: Gpu) -> Gpu:
    for f in ("hbm_gb",) + FIELDS + OPTIONAL:
        need_number(f"GPU {g.name}: {f}", getattr(g, f), 0.0, FIELD_MAX, lo_open=f == "hbm_gb")
    return g


def gpu_names(path: str | Path = HARDWARE_FILE) -> list[str]:
    return list(load_catalog(path))


def suggest(name: str, names) -> str:
    """'; did you mean A100-40GB or A100-80GB?' for a near miss (prefix or close spelling), else ''."""
    key = str(name).upper()
    near = [n for n in names if key and (n.startswith(key) or key.startswith(n))]
    near = near or difflib.get_close_matches(key, list(names), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(near[:3])}?" if near else ""


def get_gpu(name: str | Gpu, path: str | Path = HARDWARE_FILE, **overrides) -> Gpu:
    """A catalog GPU by name (case-insensitive), with any field overridden (e.g. hbm_gb=180: the memory to plan
    with, GB; it replaces the device's and the datasheet's figure, and `memory_from` becomes "override")."""
    if isinstance(name, Gpu):
        g = name
    else:
        cat = load_catalog(path)
        key = name.upper() if isinstance(name, str) else None
        if key not in cat:
            raise ParameterError(f"unknown GPU {name!r}{suggest(name, cat) if key else ''} "
                                 f"(the catalog: {', '.join(cat)})")
        g = cat[key]
    bad = [k for k in overrides if k not in OVERRIDABLE]
    if bad:
        raise ParameterError(f"unknown GPU field {bad[0]!r}; fields are {', '.join(OVERRIDABLE)}")
    if overrides:
        src = dict(g.sources)
        src.update({k: "override" for k in overrides})
        extra = dict(memory_bytes=None, smi_memory_mib=None, memory_from="override") if "hbm_gb" in overrides else {}
        g = replace(g, sources=src, **overrides, **extra)
    return _checked(g)
