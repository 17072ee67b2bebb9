"""Model configs: load a Hugging Face config.json (catalog name, path or Hub id) into a validated `ModelSpec`.

The catalog lives in data/models/<name>.json: the published config.json fields plus a `_source`
key naming where they come from. Any other config.json given by path (transformers'
`save_pretrained` output included) is read the same way, and an `ORG/NAME` that is neither reads
the model's config.json from the Hugging Face Hub through its local cache (kvlab.hub).

Which family a config belongs to, and how its fields are checked, is the family's own knowledge
(kvlab.families: detection, then parsing, looked up through kvlab.registry); this module holds what every
family shares: the spec, reading a config, and the field readers.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .checks import need_int, need_type
from .errors import ConfigError, UnknownModelError
from .registry import detect, get_family
from .resources import package_dir

DATA_DIR = package_dir("data")  # data/ at the repository top, package data in a wheel
CATALOG_DIR = DATA_DIR / "models"

MAX_LAYERS = 100_000  # far beyond any published model (hundreds); a layout holds one entry per layer
MAX_DIM = 2**31 - 1  # head counts, widths, windows: int32 in every engine


@dataclass(frozen=True)
class ModelSpec:
    """The fields of a config that decide what its KV cache holds."""

    name: str  # catalog name, the config file's stem, or the Hub id
    family: str  # a registered family (kvlab.registry; kvlab.families.FAMILIES)
    num_layers: int  # decoder layers (MTP / draft layers excluded)
    num_heads: int | None  # query heads
    num_kv_heads: int  # KV heads (1 = MQA; V4's shared K=V head)
    head_dim: int  # dims per KV head (V4: the 512-dim entry, NoPE + RoPE)
    torch_dtype: str  # the checkpoint's dtype: the default KV storage of dense models
    layer_windows: tuple[int | None, ...] = ()  # per layer: sliding window, or None for global
    kv_lora_rank: int | None = None  # MLA latent width
    qk_rope_head_dim: int | None = None  # MLA decoupled RoPE key / V4 RoPE part
    index_head_dim: int | None = None  # indexer key width (DSA / CSA)
    index_n_heads: int | None = None  # indexer query heads
    index_topk: int | None = None  # entries each query selects
    compress_ratios: tuple[int, ...] = ()  # V4: per layer 0 (SWA only) or tokens per compressed entry
    sliding_window: int | None = None  # window of the SWA buffer (every V4 layer keeps one)
    kv_source_layers: tuple[int, ...] = ()  # V4.1: layers that store entries (Full)
    index_source_layers: tuple[int, ...] = ()  # V4.1: layers that score with their own indexer
    candidate_blocks: int | None = None  # V4.1: candidate blocks kept by the capped indexer
    candidate_block_size: int | None = None  # V4.1: positions per candidate block
    hidden_size: int | None = None  # model width (for FLOPs and the attention prototype)
    layer_kinds: tuple[str, ...] = ()  # hybrids, per layer: "attention", "linear", "hybrid" (both) or "none"
    linear: object | None = None  # hybrids: the dimensions of their linear-attention / SSM state (family dataclass)
    source: str = ""  # where the fields come from
    config: dict = field(default_factory=dict, repr=False, compare=False)  # the text config as read

    @property
    def description(self) -> str:
        return get_family(self.family).description


def catalog_names() -> list[str]:
    """Catalog model names, sorted."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.json"))


def read_config(name_or_path: str | Path) -> tuple[str, dict]:
    """Read a catalog entry, a config.json path (a directory holding one works too) or a Hub id's config.json."""
    need_type("model", name_or_path, (str, os.PathLike), "a catalog name, a config.json path or a ModelSpec")
    key = os.fspath(name_or_path)
    if not key.strip():
        raise UnknownModelError(f"model name is empty; choose one of {', '.join(catalog_names())} or a config.json path")
    if is_hub_id(key) and not Path(key).exists() and not (CATALOG_DIR / f"{key.lower()}.json").exists():
        from .hub import read_hub_config
        return key, read_hub_config(key)
    try:
        path, name = _config_path(key)
    except UnknownModelError:
        raise
    except (OSError, ValueError) as e:  # a name too long for the file system, a NUL byte, ...
        raise UnknownModelError(f"unknown model {key[:80]!r}: not in the catalog and not a usable path "
                                f"({getattr(e, 'strerror', None) or e})") from None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:  # unreadable, not UTF-8, not JSON, absurdly nested
        raise ConfigError(f"{path}: not a readable JSON config ({str(e)[:200]})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: a config.json must hold a JSON object")
    return name, cfg


def _config_path(key: str) -> tuple[Path, str]:
    """(path of the config.json, model name) for a catalog name, a config file or a folder holding one."""
    cat = CATALOG_DIR / f"{key.lower()}.json"
    if "/" not in key and "\\" not in key and cat.exists():
        return cat, key.lower()
    path = Path(key)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UnknownModelError(f"model folder {key!r} holds no config.json")
        path = path / "config.json"
    if not path.is_file():
        raise UnknownModelError(
            f"unknown model {key!r}: not in the catalog ({', '.join(catalog_names())}), not a config.json path "
            "and not a Hub id (ORG/NAME)")
    return path, (path.parent.name if path.name == "config.json" else path.stem)


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def is_hub_id(key: str) -> bool:
    """ORG/NAME as the Hugging Face Hub spells repositories (no path prefix, no '..')."""
    return bool(HUB_ID.match(key)) and ".." not in key


def spec_from_config(cfg: dict, name: str, source: str = "") -> ModelSpec:
    """Validate a config dict and derive its ModelSpec: the family that claims it parses it."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{name}: a config must be a JSON object (a dict), got {type(cfg).__name__}")
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError(f"{name}: 'text_config' must be a JSON object, got {type(text).__name__}")
    c = {**{k: v for k, v in cfg.items() if not k.startswith("_")}, **(text or {})}
    n = cfg_int(c, "num_hidden_layers", name, maximum=MAX_LAYERS, required=not _layer_list_given(c))
    if n is None:  # Nemotron-H: the layer count is the pattern's length
        n = len(c.get("hybrid_override_pattern") or c.get("layers_block_type") or c.get("layer_types"))
    dtype = c.get("torch_dtype") or c.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    if not isinstance(dtype, str):
        raise ConfigError(f"{name}: 'torch_dtype' must be a dtype name such as \"bfloat16\", got {dtype!r}")
    common = dict(name=name, num_layers=n, torch_dtype=dtype, source=source or str(cfg.get("_source", "")),
                  config=c, hidden_size=cfg_int(c, "hidden_size", name, required=False))
    return detect(c, name).parse(c, name, common)


def _layer_list_given(c: dict) -> bool:
    """A config whose layer count is its pattern's length (Nemotron-H's hybrid_override_pattern)."""
    v = c.get("hybrid_override_pattern") or c.get("layers_block_type")
    return isinstance(v, (str, list)) and len(v) > 0


# --- config field readers, for spec_from_config and every family's parser (each failure names the field) -----------
def cfg_int(cfg: dict, key: str, name: str, default=None, required=True, minimum=1, maximum=MAX_DIM):
    """An integer field in [minimum, maximum] (None when absent and not required). A JSON null reads as absent,
    as transformers' configs read it (num_key_value_heads: null is multi-head attention, head_dim: null derived)."""
    v = cfg.get(key)
    if v is None:
        v = default
    if v is None:
        if required:
            raise ConfigError(f"{name}: config is missing {key!r}")
        return None
    if isinstance(v, float):  # JSON integers parse as int; 1e30 or 128.0 is not a config integer
        raise ConfigError(f"{name}: {key!r} must be a JSON integer >= {minimum}, got the float {v!r}")
    return need_int(f"{name}: {key!r}", v, minimum, maximum, error=ConfigError)


def cfg_int_list(cfg: dict, key: str, name: str) -> tuple[int, ...]:
    """A list of integers in [0, MAX_DIM] (empty when absent)."""
    v = cfg.get(key) or []
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_DIM
                                          for x in v):
        raise ConfigError(f"{name}: {key!r} must be a list of integers in [0, {MAX_DIM:,}], got {str(v)[:80]}")
    return tuple(v)


def cfg_layer_ids(cfg: dict, key: str, name: str, n: int) -> tuple[int, ...]:
    """A list of layer indices, each < n."""
    ids = cfg_int_list(cfg, key, name)
    bad = [i for i in ids if i >= n]
    if bad:
        raise ConfigError(f"{name}: {key!r} names layer {bad[0]}, but the model has {n} layers (0-{n - 1})")
    return ids


def load_model(name_or_path: str | Path | ModelSpec) -> ModelSpec:
    """A ModelSpec from a catalog name (``qwen3-8b``), a config.json path or a Hub id (``Qwen/Qwen3-8B``)."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    name, cfg = read_config(name_or_path)
    return spec_from_config(cfg, name)


def catalog() -> list[ModelSpec]:
    """Every catalog model, loaded."""
    return [load_model(n) for n in catalog_names()]
