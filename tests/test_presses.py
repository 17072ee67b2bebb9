"""kvlab.hf.presses: every press physically frees what it evicts (held bytes measured from the tensors ==
kvlab.layout's prediction for that press, budget, format and length), `positions` says which tokens each layer
and KV head holds (and the held keys are the dense cache's keys at those positions), decode-time eviction keeps
the budget, and bad budgets, unknown presses and presses without kvlab's attention fail in one line.

The committed qwen3-tiny checkpoint (trained: KNorm's key norms do not tie) in BF16, as its cache holds it."""
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from kvlab.errors import KvlabError, ParameterError
from kvlab.hf import make_cache
from kvlab.hf.presses import PRESSES, get_press, layer_bytes

pytestmark = pytest.mark.usefixtures("one_thread")
CHECKPOINT = Path(__file__).resolve().parents[1] / "data" / "checkpoints" / "qwen3-tiny"
NAMES = list(PRESSES)
CONTEXT = 100  # tokens of context (longer than SnapKV's window of 64)
FORMATS = {  # label -> make_cache format options
    "bf16": {},
    "nvfp4": dict(kv_format="nvfp4"),
    "kivi-int4": dict(kv_format="int4", residual=16),  # KIVI: keys per channel in groups, a BF16 residual
}
BUDGETS = {"fraction": dict(keep=0.25), "tokens": dict(keep=40), "bytes": dict(keep_bytes=8_000)}


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.bfloat16, attn_implementation="sdpa").eval()


def ids(n, seed=0):
    return torch.randint(32, 127, (1, n), generator=torch.Generator().manual_seed(seed))


def forward(model, cache, x):
    with torch.no_grad():
        return model(x, cache=cache, use_cache=True).logits


def check_held(cache):
    """Bytes held == predicted, and every layer's positions are sorted, distinct and as many as it holds."""
    assert cache.nbytes == cache.predicted_bytes()
    for layer in cache.layers:
        pos = layer.positions  # [B, Hkv, held]
        assert pos.dtype == torch.long and pos.shape[-1] == layer.held_tokens
        assert bool((pos[..., 1:] > pos[..., :-1]).all()) and int(pos.max()) < layer.cumulative_length


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("name", NAMES)
def test_held_equals_predicted(model, name, budget, fmt):
    """Context compressed, then a question of 7 tokens and 3 decoded tokens enter uncompressed."""
    cache = make_cache(model, press=name, **BUDGETS[budget], **FORMATS[fmt])
    x = ids(CONTEXT + 10)
    forward(model, cache, x[:, :CONTEXT])
    check_held(cache)
    kept = cache.press.kept
    if budget == "fraction" and not PRESSES[name].variable:
        assert set(kept.values()) == {25}  # max(1, int(100 x 0.25)), kvpress's count
    if budget == "bytes" and not PRESSES[name].variable:  # AdaKV / ChunkKV hold the slots their pruner picks
        assert cache.nbytes <= 8_000 < cache.predicted_bytes() + sum(
            layer_bytes(cache.layout, i, 1) - layer_bytes(cache.layout, i, 0) for i in range(4))
    forward(model, cache, x[:, CONTEXT:CONTEXT + 7])
    for i in range(3):
        forward(model, cache, x[:, CONTEXT + 7 + i:CONTEXT + 8 + i])
        check_held(cache)
    for i, layer in enumerate(cache.layers):
        assert layer.held_tokens == cache.press.kept[i] + 10
        assert layer.positions[0, 0, -10:].tolist() == list(range(CONTEXT, CONTEXT + 10))  # positions continue


@pytest.mark.parametrize("name", NAMES)
def test_question_at_once_equals_token_by_token(name):
    """After the context is compressed, a question of 9 tokens in one forward gives the logits it gives fed one
    token at a time, on every press (PyramidKV's layers hold different counts under transformers' one mask)."""
    m = AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32, attn_implementation="sdpa").eval()
    opts = dict(window_size=4, beta=5) if name == "pyramidkv" else {}  # the pyramid is not flat at 100 tokens
    x = ids(CONTEXT + 9, seed=5)
    a, b = (make_cache(m, press=name, keep=0.3, press_options=opts) for _ in range(2))
    forward(m, a, x[:, :CONTEXT])
    forward(m, b, x[:, :CONTEXT])
    if name == "pyramidkv":
        assert len({layer.held_tokens for layer in a.layers}) > 1
    at_once = forward(m, a, x[:, CONTEXT:])[0]  # [9, vocab]
    one_by_one = torch.cat([forward(m, b, x[:, i:i + 1])[0] for i in range(CONTEXT, CONTEXT + 9)])
    assert torch.allclose(at_once, one_by_one, atol=1e-4, rtol=1e-4)


def test_fit_mask_keeps_the_causal_columns():
    """One mask for every layer, cut or widened to a layer's held count: the last S columns stay, held ones see."""
    from kvlab.hf.presses.run import fit_mask
    causal = torch.ones(3, 3, dtype=torch.bool).tril()  # [S, S] among the new tokens
    m = torch.cat([torch.ones(3, 4, dtype=torch.bool), causal], dim=1)[None, None]  # [1, 1, 3, 4 held + 3]
    assert torch.equal(fit_mask(m, 5)[0, 0], torch.cat([torch.ones(3, 2, dtype=torch.bool), causal], dim=1))
    assert torch.equal(fit_mask(m, 9)[0, 0], torch.cat([torch.ones(3, 6, dtype=torch.bool), causal], dim=1))
    f = torch.zeros(1, 1, 3, 7).masked_fill(~m, float("-inf"))  # a float mask: 0 attends
    assert torch.equal(fit_mask(f, 9)[..., 2:], f) and not fit_mask(f, 9)[..., :2].any()
    assert fit_mask(None, 4) is None and fit_mask(m, 7) is m


@pytest.mark.parametrize("name", NAMES)
def test_positions_hold_those_keys(model, name):
    """BF16: each layer holds exactly the dense cache's keys and values at its positions."""
    x = ids(CONTEXT, seed=1)
    dense = DynamicCache(config=model.config)
    forward(model, dense, x)
    cache = make_cache(model, press=name, keep=0.3)
    forward(model, cache, x)
    for layer, ref in zip(cache.layers, dense.layers):
        idx = layer.positions[..., None].expand(-1, -1, -1, ref.keys.shape[-1])  # [B, Hkv, kept, D]
        assert torch.equal(layer.streams["k"].held(), ref.keys.gather(2, idx))
        assert torch.equal(layer.streams["v"].held(), ref.values.gather(2, idx))


def test_prefill_attention_is_dense(model):
    """The context's own logits are the dense model's: compression comes after the context's attention."""
    x = ids(CONTEXT, seed=2)
    ref = forward(model, DynamicCache(config=model.config), x)
    for name in ("snapkv", "h2o", "knorm"):
        assert torch.equal(forward(model, make_cache(model, press=name, keep=0.25), x), ref)


def test_no_press_is_unchanged(model):
    """Without a press the cache is today's: same logits as a cache made without the press arguments."""
    x = ids(40, seed=3)
    a, b = make_cache(model), make_cache(model, press=None)
    assert torch.equal(forward(model, a, x), forward(model, b, x)) and a.nbytes == b.nbytes


@pytest.mark.parametrize("name", ["streaming_llm", "tova", "h2o"])
def test_decode_time_eviction(model, name):
    """Decode mode: after every forward the layer is back at its budget, and holds what the layout says."""
    cache = make_cache(model, press=name, keep=24, press_mode="decode", kv_format="fp8")
    x = ids(80, seed=4)
    forward(model, cache, x[:, :16])  # shorter than the budget: nothing evicted
    assert all(layer.held_tokens == 16 for layer in cache.layers)
    for t in range(16, 40):
        forward(model, cache, x[:, t:t + 1])
        check_held(cache)
        assert all(layer.held_tokens == min(t + 1, 24) for layer in cache.layers)
    if name == "streaming_llm":  # 4 sinks and the most recent 20
        assert cache.layers[0].positions[0, 0].tolist() == [0, 1, 2, 3] + list(range(20, 40))
    if name == "tova":  # one set per layer
        pos = cache.layers[2].positions
        assert torch.equal(pos[:, 0], pos[:, 1])


def test_h2o_decode_accumulates(model):
    """H2O as decode-time eviction keeps its per-slot sums aligned with the slots it keeps."""
    cache = make_cache(model, press="h2o", keep=20, press_mode="decode")
    x = ids(60, seed=5)
    forward(model, cache, x[:, :30])
    for t in range(30, 34):
        forward(model, cache, x[:, t:t + 1])
    st = cache.runs[1].state
    assert st["attention"].shape == st["seen"].shape == (1, 2, 20)
    assert bool((st["seen"] >= 1).all())


def test_adakv_holds_what_it_reads_and_masks(model):
    """AdaKV's heads keep different counts: the layer holds its fullest head's and reports what each reads."""
    cache = make_cache(model, press="adakv", keep=0.25)
    forward(model, cache, ids(CONTEXT, seed=6))
    check_held(cache)
    for i, layer in enumerate(cache.layers):
        read = layer.readable.sum(-1)  # [B, Hkv]
        assert int(read.sum()) == 2 * 25 and layer.held_tokens == int(read.max()) == cache.press.kept[i]


def test_pyramid_budgets_fall_with_depth():
    p = get_press("pyramidkv", window_size=8)
    budgets = [p.layer_budget(i, 4, 512, 256, 0.5) for i in range(4)]
    assert budgets == sorted(budgets, reverse=True) and budgets[0] > budgets[-1]
    assert abs(sum(budgets) / 4 - 256) < 1  # their mean is the budget, t x keep


def test_random_is_seeded(model):
    x = ids(CONTEXT, seed=7)
    a, b, c = (make_cache(model, press="random", keep=0.25, press_options=dict(seed=s)) for s in (0, 0, 1))
    for cache in (a, b, c):
        forward(model, cache, x)
    assert torch.equal(a.layers[0].positions, b.layers[0].positions)
    assert not torch.equal(a.layers[0].positions, c.layers[0].positions)


def test_cur_scores_by_hand():
    """CurDKV's leverage on a hand-worked head: squared norms as shares of their window, keys x values,
    normalised, sinks at 1; a seeded projection gives the same scores twice and others for another seed."""
    from kvlab.hf.presses.base import PressInput
    k = torch.tensor([1.0, 2, 1, 1, 3, 1])[None, None, :, None]  # [1, 1, 6, 1]: squared norms 1 4 1 1 9 1
    v = torch.ones(1, 1, 6, 1)
    x = PressInput(keys=k, values=v, kpos=torch.arange(6)[None, None], queries=None, qpos=None, scaling=1.0,
                   layer=0, layers=1)
    s = get_press("cur", sinks=1, window=4).score(x)[0, 0]
    k2 = torch.tensor([1 / 7, 4 / 7, 1 / 7, 1 / 7, 9 / 10, 1 / 10])  # windows [1 4 1 1], [9 1 (pad 0 0)]
    v2 = torch.tensor([0.25] * 4 + [0.5] * 2)
    want = k2 * v2 / (k2 * v2).sum()
    want[0] = 1.0
    assert torch.allclose(s, want, rtol=1e-6)
    whole = get_press("cur", sinks=0, window=0, leverage="key").score(x)[0, 0]
    assert torch.allclose(whole, torch.tensor([1.0, 4, 1, 1, 9, 1]) / 17)
    kk = torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(3))
    y = PressInput(keys=kk, values=kk, kpos=torch.arange(8).expand(1, 2, 8), queries=None, qpos=None,
                   scaling=1.0, layer=0, layers=1)
    a, b, c = (get_press("cur", projection=2, seed=s).score(y) for s in (0, 0, 1))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_wrapped_inner_scorer(model):
    cache = make_cache(model, press="chunkkv:knorm", keep=0.25, press_options=dict(chunk_length=10))
    forward(model, cache, ids(CONTEXT, seed=8))
    check_held(cache)
    pos = cache.layers[0].positions[0, 0]
    assert len(pos) == 20 and all(int(p) // 10 == int(pos[i - i % 10]) // 10 for i, p in enumerate(pos))


@pytest.mark.parametrize("kwargs, match", [
    (dict(press="nope", keep=0.5), "unknown press 'nope'; choose one of streaming_llm"),
    (dict(press="snapkv"), "a press takes one budget"),
    (dict(press="snapkv", keep=0.5, keep_bytes=100), "a press takes one budget"),
    (dict(press="snapkv", keep=0), "keep must be a fraction in"),
    (dict(press="snapkv", keep=-1), "keep must be a fraction in"),
    (dict(press="snapkv", keep=1.5), "keep >= 1 is a token count"),
    (dict(press="snapkv", keep=float("nan")), "keep must be a fraction in"),
    (dict(press="snapkv", keep=True), "keep must be a fraction in"),
    (dict(press="snapkv", keep_bytes=0), "keep_bytes"),
    (dict(keep=0.5), "keep / keep_bytes are a press's budget"),
    (dict(press="snapkv", keep=0.5, press_mode="decode"), "decode-time eviction is defined for streaming_llm, tova"),
    (dict(press="snapkv", keep=0.5, press_mode="later"), "press mode"),
    (dict(press="snapkv", keep=0.5, press_options=dict(window=3)),
     r"press snapkv has no option\(s\) window; its options: kernel_size, window_size"),
    (dict(press="knorm:snapkv", keep=0.5), "only adakv, chunkkv take an inner scorer"),
    (dict(press="cur", keep=0.5, press_options=dict(leverage="keys")), "cur leverage must be one of key, value"),
    (dict(press="cur", keep=0.5, press_options=dict(window=-1)), "cur window"),
    (dict(press="cur", keep=0.5, press_options=dict(projection=2.0)), "cur projection must be an integer"),
    (dict(press="snapkv", keep=0.5, mechanism="window=16"), "give a press or a mechanism, not both"),
])
def test_bad_arguments(model, kwargs, match):
    with pytest.raises(ParameterError, match=match):
        make_cache(model, **kwargs)


def test_bad_contexts(model):
    with pytest.raises(ParameterError, match=r"snapkv needs a context longer than its window \(64 tokens\), got 50"):
        forward(model, make_cache(model, press="snapkv", keep=0.5), ids(50))
    with pytest.raises(ParameterError, match="keep_bytes=10: even one token per layer holds"):
        forward(model, make_cache(model, press="knorm", keep_bytes=10), ids(50))
    with pytest.raises(ParameterError, match="keep=51 tokens is more than the context's 50"):
        forward(model, make_cache(model, press="knorm", keep=51), ids(50))
    forward(model, make_cache(model, press="knorm", keep=50), ids(50))  # the whole context: allowed
    forward(model, make_cache(model, press="streaming_llm", keep=51, press_mode="decode"), ids(50))  # room to grow


def test_press_needs_kvlab_attention():
    """A cache made from a config leaves the model's attention as it is: the press says what it needs."""
    cfg = AutoConfig.for_model("qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    cache = make_cache(m.config, press="tova", keep=0.5)
    with pytest.raises(KvlabError, match="press tova keep 0.5 needs kvlab's attention function"):
        forward(m, cache, ids(20))


def test_eval_cli_press(capsys):
    """`kvlab eval MODEL --press NAME --keep X --json`: the context compressed, held == predicted bytes."""
    import json
    from kvlab.cli import main
    assert main(["eval", str(CHECKPOINT), "--press", "knorm", "--keep", "0.25", "--kv-format", "nvfp4", "--tokens",
                 "160", "--windows", "1", "--decode-steps", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["press"], r["context"]) == ("knorm keep 0.25", 80)
    # 4 layers x (20 kept + 80 uncompressed) x K + V x 2 heads x NVFP4 entry of 32 (16 B codes + 2 scales)
    assert r["held_bytes"] == r["predicted_bytes"] == 4 * 100 * 2 * 2 * 18 and r["held_equals_predicted"]
    assert main(["eval", str(CHECKPOINT), "--keep", "0.5"]) == 2
    assert "--keep / --keep-bytes are a press's budget: give --press too" in capsys.readouterr().err
    assert main(["eval", str(CHECKPOINT), "--press", "snapkv", "--keep", "2.5"]) == 2


def tiny(model_type, **kw):
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32)
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **{**base, **kw})
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()


def test_sliding_layers_keep_their_window():
    """Gemma 3: the press acts on the full-attention layer; the sliding ones keep their window."""
    m = tiny("gemma3_text", sliding_window=8, query_pre_attn_scalar=32,
             layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    cache = make_cache(m, press="snapkv", keep=0.25, kv_format="nvfp4", press_options=dict(window_size=16))
    x = ids(80)
    forward(m, cache, x[:, :70])
    forward(m, cache, x[:, 70:75])
    check_held(cache)
    assert [layer.held_tokens for layer in cache.layers] == [7, 7, 17 + 5]


def test_mla_refused():
    m = tiny("deepseek_v3", num_key_value_heads=4, kv_lora_rank=48, q_lora_rank=None, qk_rope_head_dim=16,
             qk_nope_head_dim=16, v_head_dim=16, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
             n_group=1, topk_group=1, first_k_dense_replace=1, num_hidden_layers=2)
    with pytest.raises(ParameterError, match="press knorm scores dense K/V heads; this deepseek_v3 model caches"):
        make_cache(m, press="knorm", keep=0.5)


def test_reset_starts_a_new_context(model):
    """After cache.reset() the next first forward is a new context, compressed by its own length."""
    cache = make_cache(model, press="knorm", keep=0.5)
    forward(model, cache, ids(CONTEXT))
    cache.reset()
    forward(model, cache, ids(40, seed=9))
    check_held(cache)
    assert cache.press.context == 40 and all(layer.held_tokens == 20 for layer in cache.layers)
