"""One answer per sliding-window config: `kvlab bytes`, kvlab's transformers cache and transformers' own
DynamicCache agree on what a sliding layer holds between steps (sliding_window - 1 tokens), for every dense
family with sliding layers in transformers 5.24, below, at and above the window.

Each config is a tiny random model of its family (nothing downloaded), saved as a config.json for the CLI; the
configs not in kvlab's catalog are the point: kvlab reads their windows as transformers does."""
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import get_layer_types_and_kwargs

from kvlab.cli import main
from kvlab.engines import allocate
from kvlab.hf import make_cache
from kvlab.layout import WINDOW_RULES, build_layout, window_held
from kvlab.models import spec_from_config

pytestmark = pytest.mark.usefixtures("one_thread")

W = 8  # every config's sliding window (tokens a query sees, itself included)
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, sliding_window=W)
# model_type -> (config kwargs, the per-layer windows transformers derives: W or None)
FAMILIES = {
    "gemma2": (dict(BASE, num_hidden_layers=4, query_pre_attn_scalar=16), (W, None, W, None)),
    "gemma3_text": (dict(BASE, num_hidden_layers=7, query_pre_attn_scalar=16), (W,) * 5 + (None, W)),
    "gpt_oss": (dict(BASE, num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2), (W, None, W, None)),
    "mistral": (dict(BASE, num_hidden_layers=2), (W, W)),
    "ministral": (dict(BASE, num_hidden_layers=2), (W, W)),
    "qwen2": (dict(BASE, num_hidden_layers=3, use_sliding_window=True, max_window_layers=1), (None, W, W)),
    "qwen3": (dict(BASE, num_hidden_layers=3, use_sliding_window=True, max_window_layers=2), (None, None, W)),
    "cohere2": (dict(BASE, num_hidden_layers=4), (W, W, W, None)),
}
LENGTHS = (W - 3, W - 1, W, 3 * W + 5)  # below, at W - 1, at and above the window


def tensor_bytes(cache) -> int:
    """Bytes of every tensor transformers' cache holds (each view counted by its own elements)."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None and t.numel())


@pytest.fixture(scope="module")
def models():
    out = {}
    for mt, (kw, _) in FAMILIES.items():
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(mt, **kw)
        out[mt] = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="eager").eval()
    return out


def cli_bytes(path, tokens, capsys, *extra) -> int:
    assert main(["bytes", str(path), "--tokens", str(tokens), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)["session_bytes"]


@pytest.mark.parametrize("family", FAMILIES)
def test_windows_read_as_transformers_reads_them(models, family):
    """kvlab's per-layer windows equal transformers' layer types, from the saved config and from the hub-style
    config without `layer_types` (the model type's default pattern, Qwen's max_window_layers)."""
    cfg = models[family].config
    expected = FAMILIES[family][1]
    types = tuple(W if t == "sliding_attention" else None for t in get_layer_types_and_kwargs(cfg)[0])
    assert types == expected
    saved = json.loads(cfg.to_json_string())
    assert spec_from_config(saved, family).layer_windows == expected
    legacy = {k: v for k, v in saved.items() if k != "layer_types"}
    if family == "gemma3_text":
        legacy["sliding_window_pattern"] = 6
    assert spec_from_config(legacy, family).layer_windows == expected


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tokens", LENGTHS)
def test_kvlab_bytes_equal_dynamic_cache_and_make_cache(models, family, tokens, tmp_path, capsys):
    m = models[family]
    m.config.save_pretrained(tmp_path)
    x = torch.randint(0, 256, (1, tokens), generator=torch.Generator().manual_seed(tokens))
    ref, ours = DynamicCache(config=m.config), make_cache(m)
    with torch.no_grad():
        m(x, past_key_values=ref, use_cache=True)
        m(x, past_key_values=ours, use_cache=True)
    predicted = cli_bytes(tmp_path / "config.json", tokens, capsys)
    assert predicted == tensor_bytes(ref) == ours.nbytes == ours.predicted_bytes()
    # and after one decode step past the prefill
    nxt = torch.randint(0, 256, (1, 1), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        m(nxt, past_key_values=ref, use_cache=True)
        m(nxt, past_key_values=ours, use_cache=True)
    assert cli_bytes(tmp_path / "config.json", tokens + 1, capsys) == tensor_bytes(ref) == ours.nbytes


def test_one_rule_in_the_layout():
    """Every sliding layer of a catalog model holds window_held(W) = W - 1 tokens; the engines that keep W say so."""
    L = build_layout("gpt-oss-20b")
    windows = [c.window for _, c in L.components(False)]
    assert windows and set(windows) == {window_held(128)} == {127}
    per_token = 2 * 8 * 64 * 2  # K and V of one layer, 8 KV heads of 64, BF16
    assert L.session(10_000).bounded == 12 * per_token * 127
    exact = allocate("gpt-oss-20b").session(10_000)
    sglang = allocate("gpt-oss-20b", engine="sglang").session(10_000)
    assert sglang.bounded - exact.bounded == 12 * per_token * WINDOW_RULES["sglang"][0]
    assert WINDOW_RULES["transformers"][0] == WINDOW_RULES["vllm"][0] == 0
    assert all(src for _, src in WINDOW_RULES.values())


def test_vllm_pages_hold_the_last_w_minus_one_tokens():
    """vLLM frees the blocks wholly before token T - W + 1: W - 1 tokens straddle at most ceil((W-2)/16) + 1."""
    a = allocate("gpt-oss-20b", engine="vllm")
    _, c = next(iter(a.layout.components(False)))
    assert a.engine.pages(c, 10_000) == -(-(127 - 1) // 16) + 1 == 9
