"""Model configs: load a Hugging Face config.json (catalog name or path) into a validated `ModelSpec`.

The catalog lives in data/models/<name>.json: the published config.json fields plus a `_source`
key naming where they come from. Any other config.json given by path (transformers'
`save_pretrained` output included) is read the same way.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError, UnknownModelError
from .resources import package_dir

DATA_DIR = package_dir("data")  # data/ at the repository top, package data in a wheel
CATALOG_DIR = DATA_DIR / "models"

# Architecture families that kvlab can lay out; detected from the config's fields.
FAMILIES = {
    "dense": "MHA / GQA / MQA, optionally with sliding-window layers",
    "mla": "Multi-head latent attention (DeepSeek-V2/V3): latent + decoupled RoPE key",
    "mla_dsa": "MLA plus the DSA lightning-indexer key (DeepSeek-V3.2)",
    "dsv4": "DeepSeek V4: SWA, CSA (compressed + indexer) and HCA layers",
    "dsv41": "DeepSeek V4.1: CSA2 with KV-source layers (Full / Reindex / Reuse)",
}


@dataclass(frozen=True)
class ModelSpec:
    """The fields of a config that decide what its KV cache holds."""

    name: str  # catalog name, or the config file's stem
    family: str  # one of FAMILIES
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
    source: str = ""  # where the fields come from
    config: dict = field(default_factory=dict, repr=False, compare=False)  # the text config as read

    @property
    def description(self) -> str:
        return FAMILIES[self.family]


def catalog_names() -> list[str]:
    """Catalog model names, sorted."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.json"))


def read_config(name_or_path: str | Path) -> tuple[str, dict]:
    """Read a catalog entry or a config.json path (a directory holding one works too)."""
    key = str(name_or_path)
    cat = CATALOG_DIR / f"{key.lower()}.json"
    if "/" not in key and "\\" not in key and cat.exists():
        path, name = cat, key.lower()
    else:
        path = Path(key)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise UnknownModelError(
                f"unknown model {key!r}: not in the catalog ({', '.join(catalog_names())}) and not a config.json path")
        name = path.parent.name if path.name == "config.json" else path.stem
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not a readable JSON config ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: a config.json must hold a JSON object")
    return name, cfg


def _int(cfg: dict, key: str, name: str, default=None, required=True, minimum=1):
    v = cfg.get(key, default)
    if v is None:
        if required:
            raise ConfigError(f"{name}: config is missing {key!r}")
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"{name}: {key!r} must be an integer >= {minimum}, got {v!r}")
    return v


def _int_list(cfg: dict, key: str, name: str) -> tuple[int, ...]:
    v = cfg.get(key) or []
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise ConfigError(f"{name}: {key!r} must be a list of non-negative integers")
    return tuple(v)


def _windows(cfg: dict, n: int, name: str) -> tuple[int | None, ...]:
    """Per-layer sliding windows from `layer_types`, Gemma's pattern, or a global `sliding_window`."""
    w = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) < n:
            raise ConfigError(f"{name}: 'layer_types' must list one type per layer ({n})")
        if any(t == "sliding_attention" for t in types[:n]):
            _int(cfg, "sliding_window", name)
        return tuple(w if t == "sliding_attention" else None for t in types[:n])
    if w is None or cfg.get("use_sliding_window") is False:
        return (None,) * n
    w = _int(cfg, "sliding_window", name)
    pattern = cfg.get("sliding_window_pattern")
    if pattern:  # Gemma 2/3: every pattern-th layer is global
        return tuple(None if (i + 1) % pattern == 0 else w for i in range(n))
    return (w,) * n


def spec_from_config(cfg: dict, name: str, source: str = "") -> ModelSpec:
    """Validate a config dict and derive its ModelSpec."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    c = {**{k: v for k, v in cfg.items() if not k.startswith("_")}, **text}
    n = _int(c, "num_hidden_layers", name)
    dtype = str(c.get("torch_dtype") or c.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    common = dict(name=name, num_layers=n, torch_dtype=dtype, source=source or str(cfg.get("_source", "")),
                  config=c, hidden_size=c.get("hidden_size"))
    if c.get("compress_ratios"):
        ratios = _int_list(c, "compress_ratios", name)
        if len(ratios) < n:
            raise ConfigError(f"{name}: 'compress_ratios' has {len(ratios)} entries for {n} layers")
        srcs = _int_list(c, "kv_source_layer_ids", name)
        if any(s >= n for s in srcs):
            raise ConfigError(f"{name}: 'kv_source_layer_ids' names a layer >= num_hidden_layers ({n})")
        return ModelSpec(
            family="dsv41" if srcs else "dsv4",
            num_heads=_int(c, "num_attention_heads", name, required=False),
            num_kv_heads=_int(c, "num_key_value_heads", name, default=1),
            head_dim=_int(c, "head_dim", name),
            qk_rope_head_dim=_int(c, "qk_rope_head_dim", name),
            index_head_dim=_int(c, "index_head_dim", name),
            index_n_heads=_int(c, "index_n_heads", name, required=False),
            index_topk=_int(c, "index_topk", name, required=False),
            compress_ratios=ratios[:n],
            sliding_window=_int(c, "sliding_window", name),
            kv_source_layers=srcs,
            index_source_layers=_int_list(c, "index_source_layer_ids", name),
            candidate_blocks=_int(c, "candidate_topk_blocks", name, required=False),
            candidate_block_size=_int(c, "candidate_block_size", name, required=False),
            **common)
    if c.get("kv_lora_rank") is not None:
        idx = _int(c, "index_head_dim", name, required=False)
        return ModelSpec(
            family="mla_dsa" if idx else "mla",
            num_heads=_int(c, "num_attention_heads", name),
            num_kv_heads=1,
            head_dim=_int(c, "kv_lora_rank", name) + _int(c, "qk_rope_head_dim", name),
            kv_lora_rank=_int(c, "kv_lora_rank", name),
            qk_rope_head_dim=_int(c, "qk_rope_head_dim", name),
            index_head_dim=idx,
            index_n_heads=_int(c, "index_n_heads", name, required=False),
            index_topk=_int(c, "index_topk", name, required=False),
            **common)
    if c.get("num_attention_heads") is None:
        raise ConfigError(
            f"{name}: unknown architecture (model_type {c.get('model_type')!r}): found none of "
            "num_attention_heads (MHA/GQA/MQA), kv_lora_rank (MLA) or compress_ratios (DeepSeek V4)")
    heads = _int(c, "num_attention_heads", name)
    if c.get("head_dim") is None and c.get("hidden_size") is None:
        raise ConfigError(f"{name}: config is missing 'head_dim' (and 'hidden_size' to derive it)")
    head_dim = c.get("head_dim") or _int(c, "hidden_size", name) // heads
    return ModelSpec(
        family="dense",
        num_heads=heads,
        num_kv_heads=_int(c, "num_key_value_heads", name, default=heads),
        head_dim=_int({"head_dim": head_dim}, "head_dim", name),
        layer_windows=_windows(c, n, name),
        **common)


def load_model(name_or_path: str | Path | ModelSpec) -> ModelSpec:
    """A ModelSpec from a catalog name (``qwen3-8b``) or a config.json path."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    name, cfg = read_config(name_or_path)
    return spec_from_config(cfg, name)


def catalog() -> list[ModelSpec]:
    """Every catalog model, loaded."""
    return [load_model(n) for n in catalog_names()]
