"""Models by their Hub id, read through huggingface_hub from a cache the test builds itself; never the network."""
import json

import pytest

from kvlab.cli import main
from kvlab.errors import UnknownModelError
from kvlab.layout import build_layout
from kvlab.models import is_hub_id, load_model

QWEN3_8B = {"model_type": "qwen3", "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "hidden_size": 4096, "torch_dtype": "bfloat16"}


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """HF_HOME in tmp_path holding models--Qwen--Qwen3-8B/refs/main -> snapshots/<sha>/config.json, offline."""
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-8B"
    sha = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    (repo / "snapshots" / sha).mkdir(parents=True)
    (repo / "snapshots" / sha / "config.json").write_text(json.dumps(QWEN3_8B))
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def test_hub_id_from_the_local_cache(hub_cache, capsys):
    spec = load_model("Qwen/Qwen3-8B")
    assert spec.name == "Qwen/Qwen3-8B" and "Hugging Face Hub" in spec.source
    assert build_layout("Qwen/Qwen3-8B").bytes_per_token == 147_456
    assert main(["bytes", "Qwen/Qwen3-8B", "--tp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bytes_per_token"] == 147_456 and out["per_gpu_bytes_per_token"] == 73_728


def test_offline_and_not_cached_is_one_clear_line(hub_cache, capsys):
    with pytest.raises(UnknownModelError, match="HF_HUB_OFFLINE=1 forbids fetching it"):
        load_model("Qwen/Qwen3-9B")
    assert main(["bytes", "Qwen/Qwen3-9B"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvlab: error: Qwen/Qwen3-9B: config.json is not in the Hugging Face "
                                               "cache")


@pytest.mark.parametrize("error,words", [("GatedRepoError", ["gated model", "HF_TOKEN"]),
                                         ("RepositoryNotFoundError", ["no such model on the Hugging Face Hub"])])
def test_gated_and_missing_repositories(error, words, hub_cache, monkeypatch):
    """What the Hub answers online, raised by a stand-in for hf_hub_download (the test never goes online)."""
    import httpx
    import huggingface_hub
    from huggingface_hub import errors

    def refuse(*a, **kw):
        response = httpx.Response(403 if error == "GatedRepoError" else 404,
                                  request=httpx.Request("GET", "https://huggingface.co/x/resolve/main/config.json"))
        raise getattr(errors, error)("refused", response=response)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    with pytest.raises(UnknownModelError) as e:
        load_model("meta-llama/Llama-3.1-8B")
    for w in words:
        assert w in str(e.value)


def test_hub_ids_paths_and_catalog_names_do_not_collide(tmp_path):
    assert is_hub_id("Qwen/Qwen3-8B") and is_hub_id("deepseek-ai/DeepSeek-V3.2")
    assert not is_hub_id("qwen3-8b") and not is_hub_id("/abs/config.json") and not is_hub_id("a/b/c")
    assert not is_hub_id("../config.json")
    assert load_model("qwen3-8b").name == "qwen3-8b"  # catalog first
    d = tmp_path / "org"
    d.mkdir()
    (d / "cfg.json").write_text(json.dumps(QWEN3_8B))
    assert load_model(str(d / "cfg.json")).family == "dense"  # an existing path is a path
