"""Packed cache storage: bytes held == the layout's bytes, appends == fast fill, readback is the stored values."""
import pytest
import torch

from kvlab.cache import KVCache
from kvlab.engines import allocate, paged
from kvlab.errors import KvlabError, ParameterError
from kvlab.layout import build_layout
from kvlab.models import catalog_names, load_model
from kvlab.quant import quantize


def _lengths(name: str) -> list[int]:
    """Several lengths per model, short for big dense caches (keeps the test fast)."""
    spec = load_model(name)
    if build_layout(spec).bytes_per_token < 20_000:
        return [0, 1, 5, 129, 50_000]
    w = max((x or 0) for x in spec.layer_windows) if spec.layer_windows else 0
    return [0, 1, 17, 130] + ([w + 6] if w > 124 else [])  # past every window (Gemma 3: 1,024; gpt-oss: 128)


@pytest.mark.parametrize("name", catalog_names())
def test_fill_holds_exactly_the_layout_bytes(name):
    layout = build_layout(name)
    for t in _lengths(name):
        c = KVCache(layout)
        c.fill(t)
        s = layout.session(t)
        assert c.held_bytes(True) == s.growing, (name, t)
        assert c.held_bytes(False) == s.bounded, (name, t)
        assert c.held_bytes() == s.total, (name, t)


@pytest.mark.parametrize("name,fmt", [("deepseek-v4-flash", None), ("deepseek-v4.1-flash", None),
                                      ("gpt-oss-20b", "fp8_e4m3"), ("deepseek-v3.2", None),
                                      ("qwen3-8b", "nvfp4_2level"), ("llama-3.1-8b", "int4")])
def test_appends_hold_what_fill_holds(name, fmt):
    """One token or a chunk at a time, across window and compression boundaries."""
    layout = build_layout(name, "storage", fmt)
    c = KVCache(layout)
    for n in (1, 2, 130, 1):  # 134 tokens: past the 128-token windows, m = 4 and 128 groups
        c.append_random(n)
        if c.tokens not in (1, 133, 134):
            continue
        f = KVCache(layout)
        f.fill(c.tokens)
        assert c.held_bytes() == f.held_bytes() == layout.session(c.tokens).total, (name, c.tokens)
        assert c.held_bytes(True) == layout.session(c.tokens).growing


def test_dense_readback_is_bit_exact_and_window_keeps_its_last_tokens():
    layout = build_layout("gpt-oss-20b")  # even layers slide over 128 tokens (keeping 127), odd layers are global
    c = KVCache(layout)
    g = torch.Generator().manual_seed(1)
    chunks = [c.random_inputs(n, g) for n in (100, 1, 60)]
    for x in chunks:
        c.append(x)
    for layer, key in ((0, "k"), (1, "v")):
        full = torch.cat([x[layer][key] for x in chunks])  # [161, H, D]
        want = full.to(torch.bfloat16).float()
        got = c.read(layer, key)
        w = layout.layers[layer].components[0].window
        expect = want[-w:] if w else want
        assert torch.equal(got, expect), (layer, key)
    assert c.read(0, "k").shape[0] == 127 and c.read(1, "k").shape[0] == 161  # a window of 128 keeps 127


def test_compressed_entries_are_group_means_packed_by_kvlab_quant():
    """V4.1 Full layer (m = 2): entries are the (stand-in) compressor's group means, stored as NVFP4."""
    layout = build_layout("deepseek-v4.1-flash")
    layer = next(l.index for l in layout.layers if any(c.role == "main" for c in l.components))
    m = next(c.ratio for c in layout.layers[layer].components if c.role == "main")
    c = KVCache(layout)
    g = torch.Generator().manual_seed(2)
    xs = [c.random_inputs(n, g) for n in (1, 4, 2)]  # 7 tokens, a partly filled last entry
    for x in xs:
        c.append(x)
    main = torch.cat([x[layer]["main"] for x in xs])  # [7, 1, 512]
    rows = main.to(torch.bfloat16).float()  # the stand-in compressor reads BF16 rows
    groups = [rows[a:a + m].mean(0) for a in range(0, 7, m)]
    want = quantize(torch.stack(groups).reshape(-1, 512), "nvfp4").dequantize(torch.float32)
    got = c.read(layer, "main").reshape(-1, 512)
    assert got.shape[0] == -(-7 // m)
    assert torch.equal(got[:-1], want[:-1])  # closed entries
    assert torch.equal(got[-1:], want[-1:])  # the partly filled entry: the mean so far
    tail = c.read(layer, "main_tail")  # the one pending token's [kv, kv, gate 0] row
    assert tail.shape == (7 % m, 1, 2048) and torch.equal(tail[0, 0, :512], main[-1, 0].to(torch.bfloat16).float())


def test_reuse_layers_store_nothing_and_read_their_source():
    layout = build_layout("deepseek-v4.1-flash")
    c = KVCache(layout)
    c.append_random(9)
    reuse = next(l for l in layout.layers if l.source is not None and l.source != l.index)
    assert {s.key for s in c.slots if s.layer == reuse.index} == {"swa"}
    assert torch.equal(c.read(reuse.index, "main"), c.read(reuse.source, "main"))
    with pytest.raises(ParameterError, match="stores no"):
        c.read(0, "main")


def test_per_tensor_scale_is_pinned_by_the_first_chunk():
    layout = build_layout("qwen3-8b", "storage", "fp8_e4m3")
    c = KVCache(layout)
    g = torch.Generator().manual_seed(3)
    x1, x2 = c.random_inputs(4, g), c.random_inputs(3, g)
    x2[0]["k"] *= 10  # a later chunk with larger values saturates, it does not rescale stored entries
    c.append(x1)
    c.append(x2)
    k1 = x1[0]["k"].reshape(-1, 128)
    s = quantize(k1, "fp8_e4m3").scales.view(torch.float32)
    st = c.stores[(0, "k")]
    assert torch.equal(st.tensor_scales[0].view(torch.float32), s)
    want = quantize(torch.cat([k1, x2[0]["k"].reshape(-1, 128)]), "fp8_e4m3", scale=s.reshape(())).dequantize()
    assert torch.equal(c.read(0, "k").reshape(-1, 128), want)
    assert c.held_bytes() == layout.session(7).total  # 4 B of scale per component per layer included


@pytest.mark.parametrize("name,scheme,tokens", [("qwen3-8b", "vllm", [1, 16, 17, 100]),
                                                ("deepseek-v3.2", "vllm", [1, 64, 65, 300]),
                                                ("gpt-oss-20b", "vllm", [1, 127, 128, 129, 300]),
                                                ("deepseek-v4-flash", "vllm", [1, 128, 256, 257, 1025]),
                                                ("deepseek-v4.1-flash", "storage", [1, 2, 63, 64, 65, 300])])
def test_paged_storage_difference_is_the_predicted_page_rounding(name, scheme, tokens):
    a = allocate(name, scheme)
    engine = a.engine if a.paged else paged(64)
    for t in tokens:
        c = KVCache(a.layout, engine)
        c.fill(t)
        pred = allocate(a.layout, engine=engine).session(t)
        exact = a.layout.session(t)
        assert c.held_bytes() - exact.total == pred.total - exact.total, (name, t)
        assert c.held_bytes(True) == pred.growing


@pytest.mark.parametrize("tokens", [1, 3, 127, 128, 255, 256, 259, 383])
def test_paged_compressor_tails_take_one_page(tokens):
    """V4 under vLLM's rule: an m = 128 tail (up to 127 pending tokens) is one page sized for all of them,
    so the paged cache holds exactly what the engine predicts at every length (it once overflowed)."""
    a = allocate("deepseek-v4-flash", "vllm")
    c = KVCache(a.layout, a.engine)
    c.fill(tokens)
    tails = [c.stores[(s.layer, s.key)] for s in c.slots if s.component.tail_of and s.component.ratio == 128]
    assert tails and all(st.buf.pages == (1 if tokens % 128 else 0) for st in tails)
    assert c.held_bytes() == a.session(tokens).total


def test_paged_appends_match_paged_fill():
    a = allocate("deepseek-v4.1-flash")
    engine = paged(16)
    c = KVCache(a.layout, engine)
    for n in (1, 15, 1, 200):
        c.append_random(n)
        f = KVCache(a.layout, engine)
        f.fill(c.tokens)
        assert c.held_bytes() == f.held_bytes()
        for s in c.slots:  # and the same values, in the same order
            if s.component.tail_of is None and s.key == "swa":
                assert c.read(s.layer, s.key).shape == f.read(s.layer, s.key).shape


def test_bad_input():
    c = KVCache(build_layout("qwen3-8b"))
    with pytest.raises(ParameterError, match="inputs must be"):
        c.append({0: {}})
    g = torch.Generator().manual_seed(0)
    x = c.random_inputs(2, g)
    x[3]["k"] = x[3]["k"][:, :, :64]
    with pytest.raises(ParameterError, match=r"expected \[n, 8, 128\]"):
        c.append(x)
    c.fill(3)
    with pytest.raises(ParameterError, match="from empty"):
        c.fill(3)
    with pytest.raises(KvlabError):
        KVCache(build_layout("qwen3-8b")).fill(-1)
    with pytest.raises(KvlabError, match="unknown number format"):
        KVCache.for_model("qwen3-8b", kv_format="fp7")
