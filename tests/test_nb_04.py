"""Notebook 04 end to end with small parameters (papermill), its recorded results checked."""
import papermill as pm
import pytest

from kvlab.nb.attention import AttentionParams
from kvlab.errors import ParameterError

from nbutil import run_notebook


@pytest.mark.slow
def test_nb_04_small(tmp_path):
    r = run_notebook("04", tmp_path, context_lengths=[256, 512], eval_tokens=512, formats=["bf16", "nvfp4"],
                     mechanisms=["dense", "window", "topk", "capped", "csa", "hca", "mla"], needle_formats=["bf16"],
                     needle_depths=[0.0, 0.5, 1.0], top_k=16, candidate_blocks=4, candidate_block_size=8, window=16,
                     hca_ratio=32, seeds=1, flops_lengths=[4096, 1048576], stack_layers=4, stack_prompt=48,
                     stack_steps=4)
    assert r["mla_absorbed_vs_expanded_rel_error"] < 1e-5
    if "hf_csa_topk_agreement" in r:  # transformers installed (dev extra)
        assert r["hf_csa_entries_rel_error"] == 0.0 and r["hf_csa_topk_agreement"] == 1.0
    assert r["rel_error_dense_bf16"] < 0.01 < r["rel_error_dense_nvfp4"] < 0.3  # the format alone
    assert r["rel_error_mla_bf16"] < 0.01 and r["rel_error_mla_nvfp4"] < 0.1  # exact mechanism, lossy format
    assert r["needle_topk_bf16"] > 0.9 and r["needle_window_bf16"] < 0.8  # the indexer finds mid-context needles
    assert r["v41_flops_growth_4k_to_1m"] == pytest.approx(1.27, abs=0.01)
    assert r["claim_v41_decode_flops_quarter"] == "holds under assumption"
    assert r["dense_flops_growth_4k_to_1m"] > 100
    assert r["replay_tokens"] == 16 and 0 < r["replay_flops_fraction_of_prefill"] < 1
    assert r["v41_session_bytes_1m"] > 890 * (1 << 20)  # growing 890 B/token plus bounded windows
    assert r["stack_kl_v41_bf16"] >= 0 and len(r["frontier"]) >= 2


def test_bad_parameter_stops_in_the_first_cells(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match="parameter top_k = 10000 is larger than the shortest context"):
        run_notebook("04", tmp_path, top_k=10_000)


DEFAULTS = dict(context_lengths=[1024, 4096], eval_tokens=4096, formats=["bf16"], mechanisms=["dense"],
                needle_formats=["bf16"], needle_depths=[0.0, 1.0], top_k=64, candidate_blocks=32, candidate_block_size=8,
                window=64, csa_ratio=4, hca_ratio=128, seeds=2, flops_lengths=[4096], stack_layers=10, stack_prompt=256,
                stack_steps=16, threads=1, seed=0)


@pytest.mark.parametrize("kw,match", [({"mechanisms": ["dense", "flash"]}, "parameter mechanisms must be one of"),
                                      ({"needle_depths": [0.5, float("nan")]}, "parameter needle_depths must be a finite"),
                                      ({"top_k": 512}, r"larger than the candidate pool \(32 x 8\)"),
                                      ({"needle_formats": ["fp5"]}, "parameter needle_formats: unknown number format"),
                                      ({"seeds": 0}, "parameter seeds must be an integer >= 1")])
def test_bad_parameters(kw, match):
    with pytest.raises(ParameterError, match=match):
        AttentionParams.of({**DEFAULTS, **kw})
    assert AttentionParams.of(DEFAULTS).seed_list == [0, 1]
