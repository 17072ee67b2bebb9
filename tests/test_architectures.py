"""Every dense architecture kvlab.hf's cache accepts (kvlab.hf.cache.family.DENSE_TYPES), on a tiny random model
built from its transformers config (nothing downloaded): BF16 through kvlab's cache answers as DynamicCache does, and
the bytes held equal the config's prediction in a quantized format, under a press and under a window; a press that
cannot run on the architecture says why in one ParameterError."""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from kvlab.errors import ParameterError
from kvlab.hf import make_cache
from kvlab.hf.cache import DENSE_TYPES
from kvlab.hf.evaluate import held_bytes

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
EXTRA = {  # what a type needs beyond BASE to be small (a head_dim where its default is large, experts, windows)
    "qwen3": dict(head_dim=16), "qwen3_moe": dict(head_dim=16, num_experts=4, num_experts_per_tok=2,
                                                  moe_intermediate_size=32),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2), "gemma": dict(head_dim=16),
    "gemma2": dict(head_dim=16, sliding_window=8),
    "gemma3_text": dict(head_dim=16, sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    "glm4": dict(head_dim=16), "mistral": dict(sliding_window=8), "ministral": dict(head_dim=16, sliding_window=8),
    "cohere2": dict(sliding_window=8), "exaone4": dict(sliding_window=8),
    "gpt_oss": dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
}
TYPES = [t for t in DENSE_TYPES if t != "gemma3"]  # gemma3: the multimodal wrapper of gemma3_text (test_gemma_real)
T = 96  # context tokens (more than SnapKV's 64-token window)


def tiny(model_type: str):
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **{**BASE, **EXTRA.get(model_type, {})})
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()


def run(model, cache, ids):
    """Prefill `ids`, then two decode steps; the last logits."""
    with torch.no_grad():
        out = model(ids, past_key_values=cache)
        for _ in range(2):
            out = model(out.logits[:, -1:].argmax(-1), past_key_values=cache)
    return out.logits


@pytest.fixture(scope="module", params=TYPES)
def model(request):
    return tiny(request.param)


def test_bf16_is_dynamic_cache(model):
    ids = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(0))
    want = run(model, DynamicCache(config=model.config), ids)
    cache = make_cache(model)
    assert torch.equal(run(model, cache, ids), want)
    assert held_bytes(cache) == cache.predicted_bytes()


@pytest.mark.parametrize("options", [dict(kv_format="int4", residual=8), dict(kv_format="nvfp4"),
                                     dict(press="snapkv", keep=0.25), dict(press="streaming_llm", keep=10),
                                     dict(press="expected_attention", keep=0.5), dict(mechanism="window=8")],
                         ids=["int4", "nvfp4", "snapkv", "streaming_llm", "expected_attention", "window"])
def test_held_bytes_are_predicted(model, options):
    ids = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(1))
    try:
        cache = make_cache(model, **options)
        logits = run(model, cache, ids)
    except ParameterError as e:  # the architecture cannot take this setting: one line saying why
        msg = str(e)
        assert "\n" not in msg
        assert ("full-attention layers" in msg or "partial rotary" in msg), msg
        print(f"refused: {msg}")
        return
    assert torch.isfinite(logits).all()
    assert held_bytes(cache) == cache.predicted_bytes()
