"""Models that soft-cap their attention logits (Gemma 2's attn_logit_softcapping), which torch's SDPA cannot: kvlab's
attention paths (mechanisms, presses) cap them as transformers' Gemma 2 eager attention does, and `load` runs such a
model on eager attention so that transformers' own paths work too. A tiny random Gemma 2 with a strong cap (0.5), so
that attention without the cap answers visibly differently."""
import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, Gemma2Config
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

from kvlab.hf import make_cache
from kvlab.hf.evaluate import held_bytes, load
from kvlab.hf.mechanisms import use_kvlab_attention
from kvlab.attention.dense import causal_mask
from kvlab.hf.sdpa import attend

pytestmark = pytest.mark.usefixtures("one_thread")
CAP = 0.5


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    cfg = Gemma2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                       attn_logit_softcapping=CAP, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny-gemma2")
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():  # scores well past the cap, so that an uncapped path answers differently
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    model.save_pretrained(d)
    return str(d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("held", [0, 5])
def test_attend_is_gemma2_eager(dtype, held):
    """Bit for bit transformers' Gemma 2 eager attention (grouped heads, a causal float mask), held tokens or none."""
    torch.manual_seed(1)
    s, t = 6, 6 + held
    q, k, v = torch.randn(2, 4, s, 16, dtype=dtype), torch.randn(2, 2, t, 16, dtype=dtype), \
        torch.randn(2, 2, t, 16, dtype=dtype)
    allowed = causal_mask(s, t)[None, None]  # [1, 1, S, T]
    additive = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    module = torch.nn.Module()
    module.num_key_value_groups, module.head_dim, module.training = 2, 16, False
    want, _ = eager_attention_forward(module, q, k, v, additive, scaling=0.25, softcap=CAP)  # [B, S, H, D]
    got = attend(q, k, v, additive, 0.25, CAP).transpose(1, 2)
    assert torch.equal(got, want)
    for mask in (allowed, None):  # a bool mask, or none (causal): the same attention
        torch.testing.assert_close(attend(q, k, v, mask, 0.25, CAP).transpose(1, 2), want, atol=1e-6, rtol=0)
    uncapped = attend(q, k, v, additive, 0.25)
    assert not torch.allclose(uncapped.transpose(1, 2), want, atol=1e-2)  # the cap matters here


def test_load_runs_softcapped_models_on_eager(folder):
    model, _ = load(folder)
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("options", [dict(mechanism="window=64"), dict(press="knorm", keep=24)])
def test_kvlab_attention_caps_as_the_model_does(folder, options):
    """Through kvlab's attention function (a window or a press that keep every token of the 24), the logits equal
    transformers' eager attention with DynamicCache up to BF16 rounding; without the cap they would not."""
    model, _ = load(folder)
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids, past_key_values=DynamicCache(config=model.config)).logits.float()
        cache = make_cache(model, **options)
        assert model.config._attn_implementation == "kvlab"
        got = model(ids, past_key_values=cache).logits.float()
        nxt = model(ids[:, :1], past_key_values=cache).logits.float()  # a decode step over the held tokens
    torch.testing.assert_close(got, want, atol=1e-3, rtol=0)
    assert torch.isfinite(nxt).all()
    assert held_bytes(cache) == cache.predicted_bytes()
