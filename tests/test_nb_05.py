"""Notebook 05 runs with small parameters and records measured == predicted."""
import pytest

from nbutil import run_notebook

pytestmark = pytest.mark.slow


def test_nb05_small(tmp_path):
    r = run_notebook("05", tmp_path, device="cpu", models=["deepseek-v4.1-flash", "qwen3-8b"],
                     kv_formats=["default"], context_lengths=[1_000, 200_000], budget_gib=0.5,
                     paged_lengths=[1, 17], crosscheck_tokens=8)
    assert r["all_measured_equal_predicted"] is True and r["checks_agree"] is True
    assert r["max_abs_difference_bytes"] == 0
    assert r["v41_flash_tokens"] == 200_000 and r["v41_flash_measured_growing_bytes"] == 890 * 200_000
    assert r["skipped_points"] == 1  # Qwen3-8B at 200K tokens (29 GB) is over the 0.5 GiB budget
    assert r["paged_all_match_rounding"] is True and r["too_large_refused"] is True
    assert r["transformers_crosscheck_exact"] is True
    assert r["v4_paged_tail_difference_bytes"] == [0, 0, 0]  # paged V4 compressor tails: as predicted


def test_nb05_bad_parameter(tmp_path):
    import papermill
    with pytest.raises(papermill.PapermillExecutionError, match="budget_gib"):
        run_notebook("05", tmp_path, budget_gib=-1.0)
