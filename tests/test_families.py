"""The family registry: detection, one module per family, hybrid layer patterns and state shapes."""
import json

import pytest

from kvlab.engines import allocate
from kvlab.errors import ConfigError, ParameterError
from kvlab.families import FAMILIES, REGISTRY, detect, get_family
from kvlab.layout import build_layout
from kvlab.models import catalog_names, load_model, spec_from_config


def test_every_catalog_model_has_a_registered_family():
    for name in catalog_names():
        spec = load_model(name)
        assert spec.family in REGISTRY
        assert get_family(spec.family).description == spec.description


def test_registry_names_every_family_once_with_a_module():
    assert set(FAMILIES) == {"dense", "mla", "mla_dsa", "dsv4", "dsv41", "qwen3_next", "jamba", "mamba2_hybrid",
                             "lfm2", "kimi_linear", "minimax"}
    for fam in REGISTRY.values():
        assert fam.__class__.__module__.startswith("kvlab.families.")
        assert fam.splits, f"{fam.name} states how TP / DCP treat its components"
        assert all(s.source for s in fam.splits.values())


def test_unknown_family_and_architecture():
    with pytest.raises(Exception, match="unknown model family 'nope'"):
        get_family("nope")
    with pytest.raises(ConfigError, match="unknown architecture"):
        detect({"model_type": "mystery"}, "x")


def _cfg(**fields) -> dict:
    return {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_size": 64, **fields}


@pytest.mark.parametrize("fields,kinds", [
    (dict(model_type="qwen3_next", num_hidden_layers=8, full_attention_interval=4, linear_num_key_heads=2,
          linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16),
     ["linear"] * 3 + ["attention"] + ["linear"] * 3 + ["attention"]),
    (dict(model_type="jamba", num_hidden_layers=8, attn_layer_period=4, attn_layer_offset=1),
     ["linear", "attention", "linear", "linear"] * 2),
    (dict(model_type="nemotron_h", hybrid_override_pattern="M-M*-E", mamba_num_heads=4, mamba_head_dim=16,
          n_groups=1, ssm_state_size=8), ["linear", "none", "linear", "attention", "none", "none"]),
    (dict(model_type="bamba", num_hidden_layers=4, attn_layer_indices=[2], mamba_n_heads=4, mamba_d_state=8),
     ["linear", "linear", "attention", "linear"]),
    (dict(model_type="falcon_h1", num_hidden_layers=2, mamba_n_heads=4, mamba_d_state=8), ["hybrid", "hybrid"]),
    (dict(model_type="lfm2", num_hidden_layers=4, full_attn_idxs=[1, 3]), ["linear", "attention"] * 2),
    (dict(model_type="minimax", num_hidden_layers=4, attn_type_list=[0, 1, 0, 1]), ["linear", "attention"] * 2),
    (dict(model_type="kimi_linear", num_hidden_layers=4, kv_lora_rank=32, qk_rope_head_dim=8,
          linear_attn_config={"full_attn_layers": [4], "kda_layers": [1, 2, 3], "num_heads": 4, "head_dim": 16,
                              "short_conv_kernel_size": 4}), ["linear"] * 3 + ["attention"]),
])
def test_layer_kinds_from_each_family_pattern(fields, kinds):
    spec = spec_from_config(_cfg(**fields), "t")
    assert list(spec.layer_kinds) == kinds
    L = build_layout(spec)
    assert all(any(c.state for c in l.components) == (k in ("linear", "hybrid")) for l, k in zip(L.layers, kinds))
    assert all(any(c.grows for c in l.components) == (k in ("attention", "hybrid")) for l, k in zip(L.layers, kinds))


def test_qwen3_next_by_hand():
    """Gated DeltaNet: conv (2 x 16 x 128 + 32 x 128 = 8,192 channels) x 4 columns BF16 + recurrent 32 x 128 x 128
    FP32 per linear layer (transformers); 12 attention layers of 2 KV heads x 256 grow."""
    L = build_layout("qwen3-next-80b-a3b")
    assert L.bytes_per_token == 12 * 2 * 2 * 256 * 2 == 24_576
    per_layer = 8192 * 4 * 2 + 32 * 128 * 128 * 4
    assert L.state_bytes == 36 * per_layer == 77_856_768
    v = build_layout("qwen3-next-80b-a3b", "vllm")  # vLLM: 3 conv columns, recurrent state in the model dtype
    assert v.state_bytes == 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 2)


def test_jamba_by_hand():
    """Mamba-1: conv 8,192 channels (2 x 4,096) x 4 BF16 + SSM 8,192 x 16 FP32; 4 of 32 layers attend."""
    L = build_layout("jamba-v0.1")
    assert [i for i, k in enumerate(L.model.layer_kinds) if k == "attention"] == [4, 12, 20, 28]
    assert L.bytes_per_token == 4 * 2 * 8 * 128 * 2 == 16_384
    assert L.state_bytes == 28 * (8192 * 4 * 2 + 8192 * 16 * 4)


def test_hybrid_session_is_small_per_token_but_large_per_session():
    """What notebook 01 shows: per token a hybrid is an order of magnitude below a dense model; the fixed state is
    paid per session whatever its length."""
    q = build_layout("qwen3-next-80b-a3b")
    assert q.bytes_per_token * 6 == build_layout("qwen3-8b").bytes_per_token
    s1, s2 = q.session(1), q.session(100_000)
    assert s1.bounded == s2.bounded == q.state_bytes  # the state is whole from the first token


def test_vllm_hybrid_allocator_enlarges_the_attention_block():
    """_align_hybrid_block_size: without prefix caching block = 16 x cdiv(state page, 16 x 2,048 B) = 16 x
    cdiv(1,097,728, 32,768) = 544 for Qwen3-Next; with it (vLLM's default, 'align' mode) a multiple of the GDN's
    64-token prefill checkpoints: 64 x cdiv(1,097,728, 64 x 2,048) = 576. Each state page padded to the block's
    attention page."""
    state = 8192 * 3 * 2 + 32 * 128 * 128 * 2
    none = allocate("qwen3-next-80b-a3b", engine="vllm", prefix_caching=False)
    assert state == 1_097_728 and none.engine.block_tokens == 544 and none.engine.state_page == 544 * 2048
    assert none.session(1).bounded == 36 * 544 * 2048
    assert none.bytes_per_token == 24_576  # attention pages hold whole tokens: no padding per token
    align = allocate("qwen3-next-80b-a3b", engine="vllm")
    assert align.engine.block_tokens == 576 and align.engine.state_page == 576 * 2048
    fp8 = allocate("qwen3-next-80b-a3b", engine="vllm", kv_format="fp8")  # 1,024 B a token: 1,072 / 1,088
    assert fp8.engine.block_tokens == 1088
    assert allocate("qwen3-next-80b-a3b", engine="vllm", kv_format="fp8", prefix_caching=False).engine.block_tokens \
        == 1072
    jamba = allocate("jamba-v0.1", engine="vllm")  # Mamba-1 layers export no checkpoints: both modes alike
    none = allocate("jamba-v0.1", engine="vllm", prefix_caching=False)
    state, token = 8192 * 3 * 2 + 8192 * 16 * 2, 4096  # conv + SSM state; one token's K and V
    assert jamba.engine.block_tokens == none.engine.block_tokens == 16 * -(-state // (16 * token)) == 80


def test_nemotron_vllm_ssm_dtype_from_its_config():
    spec = spec_from_config(_cfg(model_type="nemotron_h", hybrid_override_pattern="M*", mamba_num_heads=4,
                                 mamba_head_dim=16, n_groups=1, ssm_state_size=8, conv_kernel=4), "t")
    v = build_layout(spec, "vllm")  # NemotronHForCausalLMConfig: mamba_ssm_cache_dtype from config, else float32
    assert v.state_bytes == (64 + 16) * 3 * 2 + 4 * 16 * 8 * 4
    spec16 = spec_from_config(_cfg(model_type="nemotron_h", hybrid_override_pattern="M*", mamba_num_heads=4,
                                   mamba_head_dim=16, n_groups=1, ssm_state_size=8, mamba_ssm_cache_dtype="bfloat16"),
                              "t")
    assert build_layout(spec16, "vllm").state_bytes == (64 + 16) * 3 * 2 + 4 * 16 * 8 * 2


def test_kv_format_leaves_the_state_alone():
    L = build_layout("jamba-v0.1", kv_format="fp8_e4m3")
    assert L.bytes_per_token == 16_384 // 2 and L.state_bytes == build_layout("jamba-v0.1").state_bytes


@pytest.mark.parametrize("fields,words", [
    (dict(model_type="qwen3_next", num_hidden_layers=4, layer_types=["linear_attention", "chunk"] * 2),
     ["'layer_types'", "layer 1", "'chunk'"]),
    (dict(model_type="nemotron_h", hybrid_override_pattern="MX*"), ["'hybrid_override_pattern'", "M, *, -, E"]),
    (dict(model_type="jamba", num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=2),
     ["'attn_layer_offset' (2)", "'attn_layer_period' (2)"]),
    (dict(model_type="minimax", num_hidden_layers=4, attn_type_list=[0, 2, 0, 1]), ["'attn_type_list'"]),
    (dict(model_type="kimi_linear", num_hidden_layers=2, kv_lora_rank=8, qk_rope_head_dim=8,
          linear_attn_config={"full_attn_layers": [2], "kda_layers": [3]}), ["layer 3", "1-2"]),
    (dict(model_type="qwen3_next", num_hidden_layers=4), ["'linear_num_key_heads'"]),
    (dict(model_type="bamba", num_hidden_layers=2), ["'layer_types'", "'attn_layer_indices'"]),
])
def test_hybrid_configs_that_describe_no_model(fields, words):
    with pytest.raises(ConfigError) as e:
        build_layout(spec_from_config(_cfg(**fields), "t"))
    for w in words:
        assert w in str(e.value)


def test_state_heads_must_split_evenly_under_tp():
    from kvlab.layout import Shard
    spec = spec_from_config(_cfg(model_type="qwen3_next", num_hidden_layers=4, num_attention_heads=8,
                                 linear_num_key_heads=4, linear_num_value_heads=6, linear_key_head_dim=16,
                                 linear_value_head_dim=16), "t")
    with pytest.raises(ParameterError, match="6 linear value heads cannot be split over TP 4"):
        build_layout(spec, shard=Shard(tp=4))
    assert build_layout(spec, shard=Shard(tp=2)).state_bytes * 2 == build_layout(spec).state_bytes


def test_catalog_json_is_the_published_field_names():
    """The new catalog entries carry config.json fields (and a _source), nothing kvlab-specific."""
    from kvlab.models import CATALOG_DIR
    for name in ("qwen3-next-80b-a3b", "jamba-v0.1"):
        d = json.loads((CATALOG_DIR / f"{name}.json").read_text())
        assert d["_source"] and "model_type" in d
