"""Notebook 07 through papermill with small parameters; recorded results against direct simulator runs."""
import papermill as pm
import pytest

from kvlab.sim.analyze import analyze, policy_table
from kvlab.sim.tiering import block_bytes, make_tiers, simulate
from kvlab.sim.traces import synthetic_agent_trace
from nbutil import run_notebook


def test_small_run_matches_the_simulator(tmp_path):
    r = run_notebook("07", tmp_path, synthetic_sessions=15, models=["deepseek-v4.1-flash"], capacity_points=5,
                     ttls_s=[60], validate_mooncake=False, hbm_gb=0.01, dram_gb=0.1, ssd_gb=1.0,
                     policies=["lru", "sieve", "arc"], table_gb=[0.01, 0.05], target_shares=[0.5])
    tr = synthetic_agent_trace(seed=0, sessions=15)
    res = simulate(tr, make_tiers("deepseek-v4.1-flash", 0.01, 0.1, 1.0))
    assert r["trace_requests"] == len(tr)
    assert r["detail_recomputed_tokens"] == res.recomputed_tokens
    assert r["detail_token_hit_rate"] == pytest.approx(res.token_hit_rate, rel=1e-3)  # recorded to 4 digits
    assert r["ttl_recomputed_share"]["60"] >= r["ttl_recomputed_share"]["none"]
    # the analyzer's figures and the policy table, against direct calls (exact counts)
    a = analyze(tr, "deepseek-v4.1-flash", ["lru", "sieve", "arc", "belady"], points=5, target_shares=[0.5])
    assert r["analysis_counts"] == {k: a.counts[k] for k in ("requests", "prompt_tokens", "block_accesses",
                                                              "unique_blocks")}
    assert r["reuse_cold_accesses"] == a.reuse["cold_accesses"] == tr.n_blocks
    bb = block_bytes("deepseek-v4.1-flash", tr.block_tokens)
    rows = policy_table(tr, [int(g * 1e9 // bb) for g in (0.01, 0.05)], ["lru", "sieve", "arc", "belady"])
    assert r["policy_found_blocks"] == {p: [x["found"] for x in rows if x["policy"] == p]
                                        for p in ("lru", "sieve", "arc", "belady")}
    assert r["capacity_blocks_for_target"] == {t["policy"]: [t["capacity_blocks"]] for t in a.targets}
    assert r["belady_bound_holds"] is True
    # per-tier policies and second-access admission, on HBM + DRAM
    hd = make_tiers("deepseek-v4.1-flash", 0.01, 0.1, 0.0)
    assert set(r["policy_token_hit_rate"]) == {"lru", "sieve", "arc", "sieve/lru/lru", "lru (all/second/second)",
                                               "sieve/lru/lru (all/second/second)"}
    mix = simulate(tr, hd, ["sieve", "lru", "lru"], admission=["all", "second", "second"])
    assert r["policy_recomputed_tokens"]["sieve/lru/lru (all/second/second)"] == mix.recomputed_tokens
    assert r["policy_declined_blocks"]["sieve/lru/lru (all/second/second)"] == mix.declined_blocks > 0


def test_bad_parameter_stops_early(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match="parameter policy must be one of"):
        run_notebook("07", tmp_path, policy="mru")
