"""Cross-check with HF transformers' DeepSeek V4 (CPU, tiny config): same weights, same input."""
import pytest

pytest.importorskip("transformers.models.deepseek_v4")

from kvlab.attention.hfcheck import crosscheck  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_kvlab_matches_transformers_deepseek_v4():
    r = crosscheck(seed=0)
    # compressed entries: the same float32 ops in the same order -> identical
    for k in ("csa_entries", "csa_entries_streamed", "hca_entries", "hca_entries_streamed"):
        assert r[k] == 0.0, k
    assert r["csa_topk_agreement"] == 1.0  # every query selects the same compressed entries
    # attention output: same math, different summation order (sparse gather vs masked dense)
    assert r["csa_attention_output"] < 1e-5 and r["hca_attention_output"] < 1e-5
