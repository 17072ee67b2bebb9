"""Every hybrid family's layout equals the bytes transformers' own cache holds for a tiny model of that family
(attention K/V + conv states + recurrent states, after a prefill and decode steps; transformers 5.24, CPU)."""
import pytest

from kvlab.errors import ParameterError
from kvlab.families.crosscheck import TINY, hybrid_crosscheck

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_hybrid_layout_equals_transformers_cache(model_type):
    r = hybrid_crosscheck(model_type, tokens=9, decode=2)
    assert r.hf_bytes == r.predicted_bytes, r.tensors
    assert 0 < r.predicted_state_bytes < r.predicted_bytes
    assert any("states" in t[1] or t[1] == "linear_cache" for t in r.tensors)


@pytest.mark.parametrize("model_type", ["qwen3_next", "nemotron_h", "lfm2"])
@pytest.mark.parametrize("tokens,decode", [(1, 0), (3, 1), (17, 4)])
def test_lengths_shorter_and_longer_than_the_conv_kernel(model_type, tokens, decode):
    r = hybrid_crosscheck(model_type, tokens=tokens, decode=decode)
    assert r.exact, r.tensors


def test_qwen3_next_state_shapes_are_transformers():
    r = hybrid_crosscheck("qwen3_next", tokens=6, decode=1)
    shapes = {(what, shape, dtype) for _, what, shape, dtype in r.tensors}
    assert ("conv_states[0]", (1, 128, 4), "torch.bfloat16") in shapes  # 2 x 2 x 16 + 4 x 16 channels, kernel 4
    assert ("recurrent_states[0]", (1, 4, 16, 16), "torch.float32") in shapes


def test_bad_input():
    with pytest.raises(ParameterError, match="model_type must be one of"):
        hybrid_crosscheck("gpt2")
    with pytest.raises(ParameterError, match="decode"):
        hybrid_crosscheck("lfm2", tokens=2, decode=2)
