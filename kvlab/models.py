"""Model configs: load a Hugging Face config.json (catalog name or path) into a validated `ModelSpec`.

The catalog lives in data/models/<name>.json: the published config.json fields plus a `_source`
key naming where they come from. Any other config.json given by path (transformers'
`save_pretrained` output included) is read the same way.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .checks import need_int, need_type
from .errors import ConfigError, UnknownModelError
from .resources import package_dir

DATA_DIR = package_dir("data")  # data/ at the repository top, package data in a wheel
CATALOG_DIR = DATA_DIR / "models"

MAX_LAYERS = 100_000  # far beyond any published model (hundreds); a layout holds one entry per layer
MAX_DIM = 2**31 - 1  # head counts, widths, windows: int32 in every engine
LAYER_TYPES = {"full_attention": None, "sliding_attention": "window"}  # transformers' layer_types kvlab lays out

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
    need_type("model", name_or_path, (str, os.PathLike), "a catalog name, a config.json path or a ModelSpec")
    key = os.fspath(name_or_path)
    if not key.strip():
        raise UnknownModelError(f"model name is empty; choose one of {', '.join(catalog_names())} or a config.json path")
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
            f"unknown model {key!r}: not in the catalog ({', '.join(catalog_names())}) and not a config.json path")
    return path, (path.parent.name if path.name == "config.json" else path.stem)


def _int(cfg: dict, key: str, name: str, default=None, required=True, minimum=1, maximum=MAX_DIM):
    v = cfg.get(key, default)
    if v is None:
        if required:
            raise ConfigError(f"{name}: config is missing {key!r}")
        return None
    if isinstance(v, float):  # JSON integers parse as int; 1e30 or 128.0 is not a config integer
        raise ConfigError(f"{name}: {key!r} must be a JSON integer >= {minimum}, got the float {v!r}")
    return need_int(f"{name}: {key!r}", v, minimum, maximum, error=ConfigError)


def _int_list(cfg: dict, key: str, name: str) -> tuple[int, ...]:
    v = cfg.get(key) or []
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_DIM
                                          for x in v):
        raise ConfigError(f"{name}: {key!r} must be a list of integers in [0, {MAX_DIM:,}], got {str(v)[:80]}")
    return tuple(v)


def _layer_ids(cfg: dict, key: str, name: str, n: int) -> tuple[int, ...]:
    """A list of layer indices, each < n."""
    ids = _int_list(cfg, key, name)
    bad = [i for i in ids if i >= n]
    if bad:
        raise ConfigError(f"{name}: {key!r} names layer {bad[0]}, but the model has {n} layers (0-{n - 1})")
    return ids


def _windows(cfg: dict, n: int, name: str) -> tuple[int | None, ...]:
    """Per-layer sliding windows from `layer_types`, Gemma's pattern, or a global `sliding_window`."""
    w = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) < n:
            raise ConfigError(f"{name}: 'layer_types' must list one type per layer ({n})")
        bad = [(i, t) for i, t in enumerate(types[:n]) if not isinstance(t, str) or t not in LAYER_TYPES]
        if bad:
            raise ConfigError(f"{name}: 'layer_types' gives layer {bad[0][0]} the type {bad[0][1]!r}; kvlab lays out "
                              f"{' and '.join(LAYER_TYPES)}")
        if any(t == "sliding_attention" for t in types[:n]):
            w = _int(cfg, "sliding_window", name)
        return tuple(w if t == "sliding_attention" else None for t in types[:n])
    if w is None or cfg.get("use_sliding_window") is False:
        return (None,) * n
    w = _int(cfg, "sliding_window", name)
    pattern = _int(cfg, "sliding_window_pattern", name, required=False)
    if pattern:  # Gemma 2/3: every pattern-th layer is global
        return tuple(None if (i + 1) % pattern == 0 else w for i in range(n))
    return (w,) * n


def spec_from_config(cfg: dict, name: str, source: str = "") -> ModelSpec:
    """Validate a config dict and derive its ModelSpec."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{name}: a config must be a JSON object (a dict), got {type(cfg).__name__}")
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError(f"{name}: 'text_config' must be a JSON object, got {type(text).__name__}")
    c = {**{k: v for k, v in cfg.items() if not k.startswith("_")}, **(text or {})}
    n = _int(c, "num_hidden_layers", name, maximum=MAX_LAYERS)
    dtype = c.get("torch_dtype") or c.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    if not isinstance(dtype, str):
        raise ConfigError(f"{name}: 'torch_dtype' must be a dtype name such as \"bfloat16\", got {dtype!r}")
    common = dict(name=name, num_layers=n, torch_dtype=dtype, source=source or str(cfg.get("_source", "")),
                  config=c, hidden_size=_int(c, "hidden_size", name, required=False))
    if c.get("compress_ratios"):
        ratios = _int_list(c, "compress_ratios", name)
        if len(ratios) < n:
            raise ConfigError(f"{name}: 'compress_ratios' has {len(ratios)} entries for {n} layers")
        srcs = _layer_ids(c, "kv_source_layer_ids", name, n)
        head_dim, rope = _int(c, "head_dim", name), _int(c, "qk_rope_head_dim", name)
        if rope >= head_dim:
            raise ConfigError(f"{name}: 'qk_rope_head_dim' ({rope}) must be smaller than 'head_dim' ({head_dim}): "
                              "a DeepSeek V4 entry is a NoPE part of head_dim - qk_rope_head_dim dims plus the RoPE part")
        kv_heads = _int(c, "num_key_value_heads", name, default=1)
        if kv_heads != 1:
            raise ConfigError(f"{name}: 'num_key_value_heads' is {kv_heads}; kvlab lays out DeepSeek V4-style models "
                              "(compress_ratios) with their one shared K=V head")
        if srcs:
            _check_kv_sources(ratios[:n], srcs, name)
        return ModelSpec(
            family="dsv41" if srcs else "dsv4",
            num_heads=_int(c, "num_attention_heads", name, required=False),
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            qk_rope_head_dim=rope,
            index_head_dim=_int(c, "index_head_dim", name),
            index_n_heads=_int(c, "index_n_heads", name, required=False),
            index_topk=_int(c, "index_topk", name, required=False),
            compress_ratios=ratios[:n],
            sliding_window=_int(c, "sliding_window", name),
            kv_source_layers=srcs,
            index_source_layers=_layer_ids(c, "index_source_layer_ids", name, n),
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
    if c.get("head_dim") is not None:
        head_dim = _int(c, "head_dim", name)
    elif common["hidden_size"] is None:
        raise ConfigError(f"{name}: config is missing 'head_dim' (and 'hidden_size' to derive it)")
    elif common["hidden_size"] % heads:
        raise ConfigError(f"{name}: 'hidden_size' ({common['hidden_size']}) is not divisible by "
                          f"'num_attention_heads' ({heads}), so head_dim cannot be derived; add 'head_dim'")
    else:
        head_dim = common["hidden_size"] // heads
    kv_heads = _int(c, "num_key_value_heads", name, default=heads)
    if kv_heads > heads or heads % kv_heads:
        raise ConfigError(f"{name}: 'num_attention_heads' ({heads}) must be a multiple of 'num_key_value_heads' "
                          f"({kv_heads}): each KV head serves a whole group of query heads (MHA, GQA or MQA)")
    return ModelSpec(
        family="dense",
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        layer_windows=_windows(c, n, name),
        **common)


def _check_kv_sources(ratios: tuple[int, ...], srcs: tuple[int, ...], name: str) -> None:
    """V4.1: every KV-source layer stores entries (ratio > 0), and every other compressing layer has a source
    before it to read."""
    empty = [s for s in srcs if not ratios[s]]
    if empty:
        raise ConfigError(f"{name}: 'kv_source_layer_ids' lists layer {empty[0]}, whose compress ratio is 0 "
                          "(a sliding-window-only layer stores no entries to share)")
    first = min(srcs)
    orphans = [i for i, m in enumerate(ratios) if m and i < first]
    if orphans:
        raise ConfigError(f"{name}: layer {orphans[0]} compresses (ratio {ratios[orphans[0]]}) but comes before the "
                          f"first 'kv_source_layer_ids' layer ({first}), so it has no entries to read")


def load_model(name_or_path: str | Path | ModelSpec) -> ModelSpec:
    """A ModelSpec from a catalog name (``qwen3-8b``) or a config.json path."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    name, cfg = read_config(name_or_path)
    return spec_from_config(cfg, name)


def catalog() -> list[ModelSpec]:
    """Every catalog model, loaded."""
    return [load_model(n) for n in catalog_names()]
