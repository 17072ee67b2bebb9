"""Notebook 07 through papermill with small parameters; recorded results against direct simulator runs."""
import papermill as pm
import pytest

from kvlab.sim.tiering import make_tiers, simulate
from kvlab.sim.traces import synthetic_agent_trace
from nbutil import run_notebook


def test_small_run_matches_the_simulator(tmp_path):
    r = run_notebook("07", tmp_path, synthetic_sessions=15, models=["deepseek-v4.1-flash"], capacity_points=5,
                     ttls_s=[60], validate_mooncake=False, hbm_gb=0.01, dram_gb=0.1, ssd_gb=1.0)
    tr = synthetic_agent_trace(seed=0, sessions=15)
    res = simulate(tr, make_tiers("deepseek-v4.1-flash", 0.01, 0.1, 1.0))
    assert r["trace_requests"] == len(tr)
    assert r["detail_recomputed_tokens"] == res.recomputed_tokens
    assert r["detail_token_hit_rate"] == pytest.approx(res.token_hit_rate, rel=1e-3)  # recorded to 4 digits
    assert r["ttl_recomputed_share"]["60"] >= r["ttl_recomputed_share"]["none"]
    assert set(r["policy_token_hit_rate"]) == {"lru", "lfu"}


def test_bad_parameter_stops_early(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match="parameter policy must be one of"):
        run_notebook("07", tmp_path, policy="fifo")
