import json

import pytest

from kvlab.errors import ConfigError, UnknownModelError
from kvlab.layout import build_layout
from kvlab.models import CATALOG_DIR, catalog_names, load_model

REQUIRED = {"qwen3-8b", "deepseek-llm-7b", "deepseek-llm-67b", "deepseek-v2", "deepseek-v3", "deepseek-v3.2",
            "deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v4.1-flash", "llama-3.1-8b", "llama-3.1-70b"}


def test_catalog_has_required_models():
    assert REQUIRED <= set(catalog_names())
    mixed = [m for m in map(load_model, catalog_names()) if any(m.layer_windows) and not all(m.layer_windows)]
    assert mixed, "at least one model mixes sliding-window and global layers"


@pytest.mark.parametrize("name", catalog_names())
def test_catalog_entry_names_its_source(name):
    raw = json.loads((CATALOG_DIR / f"{name}.json").read_text())
    assert raw["_source"].strip()
    assert name == name.lower()
    spec = load_model(name)
    assert spec.source == raw["_source"]


@pytest.mark.parametrize("name,family", [("qwen3-8b", "dense"), ("deepseek-v3", "mla"), ("deepseek-v3.2", "mla_dsa"),
                                         ("deepseek-v4-flash", "dsv4"), ("deepseek-v4.1-flash", "dsv41"),
                                         ("gpt-oss-120b", "dense")])
def test_families(name, family):
    assert load_model(name).family == family


def test_windows():
    g = load_model("gemma-3-27b")
    assert sum(w is None for w in g.layer_windows) == 10 and set(filter(None, g.layer_windows)) == {1024}
    o = load_model("gpt-oss-120b")
    assert o.layer_windows[:2] == (128, None)
    assert not any(load_model("qwen3-8b").layer_windows)


def test_config_path_and_directory(tmp_path):
    cfg = json.loads((CATALOG_DIR / "qwen3-8b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert build_layout(str(tmp_path)).bytes_per_token == 147456
    assert build_layout(str(tmp_path / "config.json")).bytes_per_token == 147456


def test_transformers_save_pretrained(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3Config(num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                   hidden_size=4096, vocab_size=1000)
    cfg.save_pretrained(tmp_path)
    assert build_layout(str(tmp_path)).bytes_per_token == 147456


def test_null_fields_read_as_absent(tmp_path):
    """transformers writes None as null (a LlamaConfig with num_key_value_heads=None is multi-head attention, a
    head_dim of None is hidden_size / heads): a null field reads as the absent one, not as a missing required one."""
    base = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}
    sizes = []
    for extra in ({}, {"num_key_value_heads": None, "head_dim": None}, {"num_key_value_heads": 32, "head_dim": 128}):
        p = tmp_path / f"{len(sizes)}.json"
        p.write_text(json.dumps({**base, **extra}))
        sizes.append(build_layout(str(p)).bytes_per_token)
    assert sizes == [32 * 2 * 32 * 128 * 2] * 3


@pytest.mark.parametrize("cfg,msg", [
    ({"model_type": "mystery", "num_hidden_layers": 4}, "unknown architecture"),
    ({"num_attention_heads": 8, "hidden_size": 64}, "missing 'num_hidden_layers'"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8}, "head_dim"),
    ({"num_hidden_layers": -1, "num_attention_heads": 8, "head_dim": 8}, "num_hidden_layers"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": "big"}, "head_dim"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8, "kv_lora_rank": 512}, "qk_rope_head_dim"),
    ({"num_hidden_layers": 4, "compress_ratios": [0, 4], "head_dim": 512, "qk_rope_head_dim": 64,
      "index_head_dim": 128, "sliding_window": 128}, "compress_ratios"),
])
def test_bad_configs(tmp_path, cfg, msg):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=msg):
        load_model(str(p))


def test_malformed_json(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable JSON"):
        load_model(str(p))


def test_unknown_model():
    with pytest.raises(UnknownModelError, match="not in the catalog"):
        load_model("gpt-7")
