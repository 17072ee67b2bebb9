"""kvlab.hf: a transformers cache holding K/V in kvlab formats — tokens, bytes, formats, mechanisms, errors.

Tiny randomly initialised models of each supported family (built from their transformers configs, nothing
downloaded) run in BF16, as the reference DynamicCache holds them."""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from kvlab.cache.memory import storage_bytes
from kvlab.errors import ConfigError, ParameterError, UnknownFormatError
from kvlab.hf import make_cache
from kvlab.hf.cache import RawStream
from kvlab.hf.mechanisms import parse_mechanism, use_kvlab_attention
from kvlab.quant import kivi_quantize

pytestmark = pytest.mark.usefixtures("one_thread")

DENSE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32)
MLA = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=48, q_lora_rank=None, qk_rope_head_dim=16,
           qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
           first_k_dense_replace=1)
CONFIGS = {
    "llama": DENSE,
    "qwen3": DENSE,
    "mistral": dict(DENSE, sliding_window=8),
    "gemma3_text": dict(DENSE, sliding_window=8, query_pre_attn_scalar=32,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    "deepseek_v2": MLA,
    "deepseek_v3": MLA,
}
FAMILIES = list(CONFIGS)


@pytest.fixture(scope="module")
def models():
    out = {}
    for mt, kw in CONFIGS.items():
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(mt, **kw)
        out[mt] = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    return out


def ids(n, seed=0):
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def feed(model, cache, lengths):
    """Prefill, then chunks: yields the cache after each. Grad mode is switched off per call, never across a
    yield: a generator left suspended inside `no_grad` (as zip leaves the longer of two) would restore its saved
    mode whenever it is collected, turning autograd off for every later test."""
    x = ids(sum(lengths))
    a = 0
    for n in lengths:
        with torch.no_grad():
            model(x[:, a:a + n], cache=cache, use_cache=True)
        a += n
        yield a


def dynamic_bytes(cache) -> int:
    return storage_bytes([t for layer in cache.layers for t in (layer.keys, layer.values)])


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_generates_what_dynamic_cache_generates(models, family):
    m = models[family]
    prompt = ids(12, seed=1)
    ref = m.generate(prompt, max_new_tokens=16, do_sample=False, cache=DynamicCache(config=m.config))
    cache = make_cache(m)
    out = m.generate(prompt, max_new_tokens=16, do_sample=False, cache=cache)
    assert torch.equal(ref, out)
    assert cache.nbytes == cache.predicted_bytes()


def test_generate_takes_past_key_values(models):
    m = models["qwen3"]
    prompt = ids(10, seed=2)
    ref = m.generate(prompt, max_new_tokens=8, do_sample=False)
    out = m.generate(prompt, max_new_tokens=8, do_sample=False, past_key_values=make_cache(m))
    assert torch.equal(ref, out)


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_bf16_holds_what_dynamic_cache_holds(models, family):
    m = models[family]
    ours, ref = make_cache(m), DynamicCache(config=m.config)
    for _ in zip(feed(m, ours, [20, 1, 1, 7]), feed(m, ref, [20, 1, 1, 7])):
        assert ours.nbytes == dynamic_bytes(ref) == ours.predicted_bytes()


def test_sliding_layers_keep_window_minus_one(models):
    """Gemma 3's sliding layers keep sliding_window - 1 tokens between steps, as DynamicSlidingWindowLayer does;
    transformers' own layer also keeps the storage behind its view (more bytes than the tokens it keeps)."""
    m = models["gemma3_text"]
    ours, ref = make_cache(m), DynamicCache(config=m.config)
    list(feed(m, ours, [30])), list(feed(m, ref, [30]))
    for a, b in zip(ours.layers, ref.layers):
        s = a.streams["k"]
        assert torch.equal(s.held(), b.keys)
    per_token = 2 * 2 * 32 * 2  # K and V, 2 KV heads of 32, BF16
    assert ours.nbytes == per_token * (7 + 7 + 30) == ours.predicted_bytes()
    assert dynamic_bytes(ref) > ours.nbytes  # the sliding views hold the whole prefill's storage


FORMATS = [dict(kv_format="bf16"), dict(kv_format="fp8_e4m3"), dict(kv_format="mxfp8"), dict(kv_format="nvfp4"),
           dict(kv_format="mxfp4"), dict(kv_format="int4", residual=16), dict(kv_format="int2", residual=8),
           dict(k_format="int4", v_format="int2"), dict(k_format="fp8_e4m3_b128", v_format="bf16"),
           dict(kv_format="nvfp4", residual=5, block=4)]


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text", "deepseek_v3"])
@pytest.mark.parametrize("opts", FORMATS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_held_bytes_equal_prediction(models, family, opts):
    m = models[family]
    cache = make_cache(m, **opts)
    for t in feed(m, cache, [37, 1, 1, 30, 1]):
        assert cache.tokens == t
        assert cache.nbytes == cache.predicted_bytes() == cache.layout.session(t).total


def test_predicted_bytes_grow_as_the_layout_says(models):
    """Integer keys in KIVI groups: nothing is quantized before a group of 32 completes past the residual."""
    m = models["qwen3"]
    cache = make_cache(m, "int4", residual=8)
    L = cache.layout
    k = L.layers[0].components[0]
    assert (k.role, k.group, k.residual.tokens, k.residual.block) == ("k", 32, 8, 32)
    assert L.session(39).growing == 3 * 2 * (16 + 4) * 31  # 3 layers x 2 heads x V of 31 quantized tokens
    # the 40th token completes a key group past the residual: 32 tokens x 32 channels x 4 bits + 32 scale/zero
    assert L.session(40).growing - L.session(39).growing == 3 * 2 * (512 + 4 * 32) + 3 * 2 * 20


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_residual_tokens_are_exact(models, family):
    """The newest `residual` tokens are returned as given; older ones as their format decodes them."""
    m = models[family]
    cache = make_cache(m, "int2", residual=6, key_axis="token")
    layer = cache.layers[0]
    torch.manual_seed(3)
    shape = (1, 1, 20, 64) if family == "deepseek_v3" else (1, 2, 20, 32)
    k, v = torch.randn(shape).bfloat16(), torch.randn(shape[:-1] + (16 if family == "deepseek_v3" else 32,)).bfloat16()
    kk, vv = layer.update(k[:, :, :48 // 3] if False else k[..., :48] if family == "deepseek_v3" else k, v)
    if family == "deepseek_v3":
        k = k[..., :48]
    assert torch.equal(kk[:, :, -6:], k[:, :, -6:]) and torch.equal(vv[:, :, -6:], v[:, :, -6:])
    assert not torch.equal(kk[:, :, :14], k[:, :, :14])


def test_kivi_keys_per_channel_match_kvlab_quant():
    """The cache's KIVI path decodes to exactly what kvlab.quant.kivi_quantize gives (keys per channel over
    32 tokens, values per token), for the tokens both quantize."""
    cfg = AutoConfig.for_model("qwen3", **DENSE)
    cache = make_cache(cfg, "int4", residual=8, dtype=torch.float32)
    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(1, 2, 75, 32, generator=g), torch.randn(1, 2, 75, 32, generator=g)
    kk, vv = cache.update(k, v, 0)
    ref = kivi_quantize(k, v, bits=4, group=32, residual=8)
    rk, rv = ref.dequantize()
    assert ref.k.shape[-2] == 64
    assert torch.equal(kk[:, :, :64], rk[:, :, :64]) and torch.equal(vv[:, :, :64], rv[:, :, :64])
    assert torch.equal(kk[:, :, 64:], k[:, :, 64:])  # the key group of the last 11 tokens waits unquantized


def test_kv_split_formats(models):
    m = models["qwen3"]
    cache = make_cache(m, k_format="int4", v_format="int2", key_axis="token")
    roles = {c.role: c.entry.format_name for c in cache.layout.layers[0].components}
    assert roles == {"k": "int4", "v": "int2"}
    mla = make_cache(models["deepseek_v3"], k_format="fp8_e4m3_b128", v_format="bf16")
    lat = mla.layout.layers[0].components[0]
    assert [(p.name, p.fmt.name) for p in lat.entry.parts] == [("latent", "fp8_e4m3_b128"), ("rope", "bf16")]
    assert lat.entry.nbytes == 48 + 4 + 2 * 16  # DeepSeek's fp8_ds_mla arrangement at this width


def test_per_layer_overrides(models):
    m = models["qwen3"]
    cache = make_cache(m, "nvfp4", per_layer={0: {"kv_format": "bf16"}})
    assert [lc.components[0].entry.format_name for lc in cache.layout.layers] == ["bf16", "nvfp4", "nvfp4"]
    list(feed(m, cache, [20, 1]))
    x = cache.layers[0].streams["k"]
    assert x.count == 21 and cache.nbytes == cache.predicted_bytes()
    assert isinstance(x, RawStream) and not isinstance(cache.layers[1].streams["k"], RawStream)  # BF16 as read


RAW_CASES = [(mt, o) for mt in FAMILIES for o in (dict(), dict(mechanism="window=16"), dict(mechanism="hca=4,window=8"))
             if mt != "mistral" or not o] + [(mt, o) for mt in ("qwen3", "gemma3_text") for o in (
                 dict(press="snapkv", keep=0.5), dict(press="streaming_llm", keep=12, press_mode="decode"),
                 dict(press="adakv", keep=0.5))]


@pytest.mark.parametrize("mt, opts", RAW_CASES, ids=[f"{m}-{'-'.join(str(v) for v in o.values() if not isinstance(v, dict)) or 'plain'}"
                                                      for m, o in RAW_CASES])
def test_raw_streams_equal_packed_rows(models, mt, opts, monkeypatch):
    """K/V kept in the model's own dtype are held as attention reads them (RawStream, one concatenation a step);
    the packed-row Stream they stand for gives bit-equal logits, the same held bytes and the same kept positions,
    step after step (prefill, chunks, decode steps; windows, pooling, presses and beam reordering included)."""
    m = models[mt]
    use_kvlab_attention(m)

    def run():
        cache = make_cache(m, **opts)
        x = torch.cat([ids(100, seed=5), ids(100, seed=6)])  # [2, 100]: two sequences, so reordering shows
        out, held = [], []
        with torch.no_grad():
            for a, b in ((0, 80), (80, 88), (88, 89), (89, 90), (90, 91)):
                out.append(m(x[:, a:b], past_key_values=cache, use_cache=True).logits)
                held.append((cache.nbytes, cache.predicted_bytes()))
            cache.reorder_cache(torch.tensor([1, 0]))
            out.append(m(x[:, 91:92], past_key_values=cache, use_cache=True).logits)
            held.append((cache.nbytes, cache.predicted_bytes()))
        return out, held, [lyr.positions.clone() for lyr in cache.layers], cache
    fast, fast_held, fast_pos, cache = run()
    assert any(isinstance(s, RawStream) for lyr in cache.layers for s in lyr.streams.values())
    monkeypatch.setattr(RawStream, "applies", staticmethod(lambda stored, dtype: False))
    slow, slow_held, slow_pos, _ = run()
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))
    assert fast_held == slow_held and all(h == p for h, p in fast_held)
    assert all(torch.equal(a, b) for a, b in zip(fast_pos, slow_pos))


def test_batch_and_beams(models):
    m = models["llama"]
    prompt = torch.cat([ids(9, seed=5), ids(9, seed=6)])
    for kw in (dict(), dict(num_beams=2)):
        ref = m.generate(prompt, max_new_tokens=6, do_sample=False, cache=DynamicCache(config=m.config), **kw)
        cache = make_cache(m)
        out = m.generate(prompt, max_new_tokens=6, do_sample=False, cache=cache, **kw)
        assert torch.equal(ref, out)
        assert cache.nbytes == cache.predicted_bytes()


MECHANISMS = ["window=16", "topk=8", "capped=4x4,topk=8", "csa=4,topk=4,window=16", "hca=8,window=16"]


@pytest.fixture(scope="module")
def fp32_models():
    out = {}
    for mt in ("qwen3", "gemma3_text", "deepseek_v3"):
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(mt, **CONFIGS[mt])
        out[mt] = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa").eval()
    return out


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text", "deepseek_v3"])
@pytest.mark.parametrize("mech", MECHANISMS)
def test_mechanisms_bytes_and_chunking(fp32_models, family, mech):
    """Per-query masks make a chunked feed equal to one forward, and the bytes equal the prediction."""
    m = fp32_models[family]
    x = ids(70, seed=7)
    with torch.no_grad():
        a = make_cache(m, "nvfp4", mechanism=mech)
        chunks = torch.cat([m(x[:, i:i + 9], cache=a).logits for i in range(0, 70, 9)], 1)
        b = make_cache(m, "nvfp4", mechanism=mech)
        whole = m(x, cache=b).logits
        dense = m(x, cache=make_cache(m, "nvfp4")).logits
    assert a.nbytes == a.predicted_bytes() == b.nbytes
    torch.testing.assert_close(chunks, whole, atol=1e-4, rtol=0)
    assert (whole - dense).abs().max() > 1e-3  # the mechanism changed what attention read


@pytest.mark.parametrize("mech", ["window=1000", "topk=1000"])
def test_mechanism_that_keeps_everything_is_dense(models, mech):
    m = models["qwen3"]
    x = ids(40, seed=8)
    with torch.no_grad():
        ref = m(x, cache=make_cache(m)).logits
        out = m(x, cache=make_cache(m, mechanism=mech)).logits
    assert torch.equal(ref, out)


@pytest.mark.parametrize("family,per_token", [("qwen3", 3 * 2 * 2 * 32 * 2), ("deepseek_v3", 2 * (48 + 16) * 2)])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_window_bytes_are_bounded(models, family, per_token, fmt):
    """A window keeps its last W - 1 tokens on dense K/V and on the MLA latent alike, in any format."""
    m = models[family]
    cache = make_cache(m, fmt, mechanism="window=16")
    sizes = [cache.nbytes for _ in feed(m, cache, [30, 1, 1, 1])]
    assert sizes == [cache.predicted_bytes()] * 4
    if fmt == "bf16":
        assert sizes[0] == per_token * 15


def test_mechanism_needs_kvlab_attention():
    cfg = AutoConfig.for_model("qwen3", **DENSE)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    cache = make_cache(cfg, mechanism="topk=4")  # a config: the model is not switched
    with pytest.raises(ParameterError, match="use_kvlab_attention"), torch.no_grad():
        m(ids(10), cache=cache)


@pytest.mark.parametrize("text,err", [("windw=4", "not one of"), ("csa=8,window=8", "must hold"),
                                      ("capped=4,topk=2", "BLOCKSxSIZE"), ("window=1", "at least 2"),
                                      ("topk=0", ">= 1"), ("garbage", "not one of"),
                                      ("window=8,topk=4", "combines")])
def test_bad_mechanisms(text, err):
    with pytest.raises(ParameterError, match=err):
        parse_mechanism(text)


def test_mechanism_key_colon_value():
    """'key:value' reads as 'key=value' (papermill parses one '=' per parameters line)."""
    for text in ("window:16", "csa:4,topk:4,window:16", "capped:4x4,topk:8"):
        assert parse_mechanism(text) == parse_mechanism(text.replace(":", "="))


def test_unsupported_family_is_named():
    cfg = AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    with pytest.raises(ConfigError, match="'gpt2'.*|gpt2"):
        make_cache(cfg)


def test_bad_formats_are_named(models):
    m = models["qwen3"]
    with pytest.raises(UnknownFormatError, match="fp5"):
        make_cache(m, "fp5")
    with pytest.raises(ParameterError, match="int4_b32_ue8m0"):
        make_cache(m, "int4_b32_ue8m0")
    with pytest.raises(ParameterError, match="not both"):
        make_cache(m, "nvfp4", k_format="int4")
    with pytest.raises(ParameterError, match="residual"):
        make_cache(m, "int4", residual=-1)
    with pytest.raises(ParameterError, match="KIVI"):
        make_cache(models["deepseek_v3"], "int4", key_axis="channel")


KERNEL_FORMATS = ["int4", "int2", "int8", "int4_g64", "nvfp4", "nvfp4_2level", "mxfp4", "mxfp8", "fp8_e4m3",
                  "fp8_e5m2", "fp8_e4m3_token", "fp8_e4m3_b128", "fp8_e4m3_b64_ue8m0",
                  "int4_g64/channel", "int2_g64/channel", "int8/channel"]  # /channel: values in key groups too


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", KERNEL_FORMATS)
def test_compiled_decoder_is_bit_exact(fmt, dtype):
    """The numba decoder returns exactly what kvlab.quant's dequantize gives, zeros and signs included."""
    cfg = AutoConfig.for_model("qwen3", **dict(DENSE, num_hidden_layers=1))
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1, 2, 70, 32, generator=g) * torch.logspace(-3, 3, 32)  # channels of very different scale
    x[:, :, 3] = 0.0
    x[:, :, 4] = -0.0
    x[:, :, 5, ::2] = -1e-30  # rounds to -0 in most formats
    x = x.to(dtype)
    fmt, _, axis = fmt.partition("/")
    opts = dict(value_axis=axis) if axis else {}
    fast, slow = make_cache(cfg, fmt, dtype=dtype, **opts), make_cache(cfg, fmt, dtype=dtype, **opts)
    a = fast.update(x, x, 0)
    assert all(s.decoder is not None for s in fast.layers[0].streams.values())
    slow.layers[0].lazy_initialization(x, x)  # the streams exist from the first update on
    for s in slow.layers[0].streams.values():
        s.decoder = None
    b = slow.update(x, x, 0)
    for u, v in zip(a, b):
        assert torch.equal(u.view(torch.int16) if dtype == torch.bfloat16 else u.view(torch.int32),
                           v.view(torch.int16) if dtype == torch.bfloat16 else v.view(torch.int32))


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_steps_store_what_quantize_stores(fmt):
    """Token-by-token appends on the pinned per-tensor scale store exactly the bytes of kvlab.quant's path,
    saturation past the first chunk's range, zeros and signs included."""
    cfg = AutoConfig.for_model("qwen3", **dict(DENSE, num_hidden_layers=1))
    g = torch.Generator().manual_seed(11)
    x = torch.randn(1, 2, 24, 32, generator=g)
    x[:, :, 20:] *= 1e3  # beyond the scale pinned by the first 16 tokens: saturates
    x[:, :, 18] = -0.0
    x[:, :, 19, ::3] = -1e-30
    x = x.bfloat16()
    fast, slow = make_cache(cfg, fmt), make_cache(cfg, fmt)
    slow.layers[0].lazy_initialization(x, x)  # the streams exist from the first update on
    for s in slow.layers[0].streams.values():
        s.packed.fp8 = None
    for c in (fast, slow):
        c.update(x[:, :, :16], x[:, :, :16], 0)
        for t in range(16, 24):
            c.update(x[:, :, t:t + 1], x[:, :, t:t + 1], 0)
    for role in ("k", "v"):
        a, b = fast.layers[0].streams[role].packed, slow.layers[0].streams[role].packed
        assert a.fp8 is not None and a.rows == b.rows == 24
        assert torch.equal(a.packed(), b.packed()) and torch.equal(a.tensor_scales[0], b.tensor_scales[0])


def test_cache_dtype_apart_from_the_model():
    """An FP32 model with a cache kept in BF16: the residual is BF16 (as predicted), attention gets FP32."""
    cfg = AutoConfig.for_model("qwen3", **DENSE)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa").eval()
    cache = make_cache(m, "int4", residual=8, dtype=torch.bfloat16)
    list(feed(m, cache, [40, 1]))
    s = cache.layers[0].streams["v"]
    assert s.pend.dtype == torch.bfloat16 and cache.layout.model.torch_dtype == "bfloat16"
    assert cache.nbytes == cache.predicted_bytes()
    ref, bf = make_cache(m, dtype=torch.bfloat16), make_cache(m, "bf16")
    x = ids(30, seed=11)
    with torch.no_grad():
        assert torch.equal(m(x, cache=ref).logits, m(x, cache=bf).logits)  # BF16 storage either way
