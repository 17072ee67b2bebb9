"""kvlab.hf.cache picks a layer class per decoder layer from the config's layer_types through one mapping
(layers.LAYERS), as transformers' DynamicCache does: full, sliding and MLA layers, no kind switch."""
import pytest
from transformers import AutoConfig

from kvlab.errors import ConfigError, ParameterError
from kvlab.hf import make_cache
from kvlab.hf.cache import LAYERS, FullLayer, MlaLayer, SlidingLayer, layer_kinds


def gemma(**kw):
    return AutoConfig.for_model("gemma3_text", hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=64,
                                sliding_window=16, **kw)


def test_layer_types_pick_the_classes():
    cfg = gemma()
    assert [cls for cls, _ in layer_kinds(cfg)] == [SlidingLayer] * 5 + [FullLayer]
    cache = make_cache(cfg, "int4")
    assert [type(lyr) for lyr in cache.layers] == [SlidingLayer] * 5 + [FullLayer]
    assert [lyr.sliding_window for lyr in cache.layers] == [16] * 5 + [None]
    # a window evicts token by token: the sliding layers' keys go along head_dim, the full layer's per channel (KIVI)
    assert cache.options["per_layer"] == {i: {"key_axis": "token", "value_axis": "token"} for i in range(5)}
    assert cache.options["key_axis"] == "channel" and cache.full == [False] * 5 + [True]
    windowed = make_cache(cfg, mechanism="window=8")
    assert [lyr.sliding_window for lyr in windowed.layers] == [16] * 5 + [8]
    assert windowed.layers[0].mech.dense and not windowed.layers[5].mech.dense  # a mechanism is a full layer's


def test_mla_layers_and_what_they_refuse():
    cfg = AutoConfig.for_model("deepseek_v3", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16,
                               q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                               vocab_size=64, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=2)
    cache = make_cache(cfg)
    assert [type(lyr) for lyr in cache.layers] == [MlaLayer, MlaLayer] and cache.options["key_axis"] == "token"
    with pytest.raises(ParameterError, match="scores dense K/V heads; this deepseek_v3 model caches an MLA latent"):
        make_cache(cfg, press="knorm", keep=0.5)


def test_one_mapping_and_unknown_layer_types():
    assert LAYERS == {("dense", "full_attention"): FullLayer, ("dense", "sliding_attention"): SlidingLayer,
                      ("mla", "full_attention"): MlaLayer}
    with pytest.raises(ConfigError, match="hold full and sliding attention layers; .* layer types chunked_attention"):
        cfg = gemma()
        cfg.layer_types, cfg.attention_chunk_size = ["chunked_attention"] + ["full_attention"] * 5, 8
        layer_kinds(cfg)
