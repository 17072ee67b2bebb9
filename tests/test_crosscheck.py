"""Hugging Face transformers' caches hold exactly the bytes kvlab's layout predicts."""
import pytest

from kvlab.cache.crosscheck import crosscheck
from kvlab.errors import KvlabError

pytestmark = pytest.mark.slow


def test_qwen3_dense_kv():
    r = crosscheck("qwen3-8b", tokens=19, decode=3)
    assert r.shapes[0] == ([1, 8, 19, 128], [1, 8, 19, 128])  # real kv heads and head_dim
    assert r.hf_bytes == r.hf_storage_bytes == r.predicted_bytes == 2 * 2 * 8 * 128 * 19 * 2
    assert r.exact and r.engine_bytes == 2 * 2 * 8 * 128 * 32 * 2  # vLLM: two 16-token blocks


def test_deepseek_v3_caches_the_latent():
    r = crosscheck("deepseek-v3", tokens=21, decode=2)
    assert r.shapes[0] == ([1, 1, 21, 512], [1, 1, 21, 64])  # latent as keys, RoPE key as values
    assert r.hf_bytes == r.hf_storage_bytes == r.predicted_bytes == 2 * (512 + 64) * 2 * 21
    assert r.exact and "latent" in r.hf_caches


def test_unsupported_and_bad_input():
    with pytest.raises(KvlabError, match="cross-check supports"):
        crosscheck("gpt-oss-20b", tokens=4)
    with pytest.raises(KvlabError, match="decode"):
        crosscheck("qwen3-8b", tokens=3, decode=3)
