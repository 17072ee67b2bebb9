"""The offline prefix-cache analyzer on a hand-worked trace, its CLI, and the Mooncake definitions on the real traces."""
import json

import numpy as np
import pytest

from kvlab.cli import main
from kvlab.sim import policy_kernels as pk
from kvlab.errors import ParameterError
from kvlab.sim.analyze import (analyze, bound_excess, cache_ratio_definitions, policy_table, prefix_sharing,
                                reuse_distribution)
from kvlab.sim.curves import cache_hits
from kvlab.sim.traces import have_trace, load_trace, read_mooncake

# 4-token blocks, every block full: [1 2] [1 2 3] [1 4] [5] [1 2 3 6]
REQS = [[1, 2], [1, 2, 3], [1, 4], [5], [1, 2, 3, 6]]


@pytest.fixture
def hand(tmp_path):
    p = tmp_path / "hand.jsonl"
    p.write_text("".join(json.dumps(dict(timestamp=1000 * i, input_length=4 * len(h), output_length=1, hash_ids=h))
                         + "\n" for i, h in enumerate(REQS)))
    return p


def test_sharing_by_depth(hand):
    s = prefix_sharing(read_mooncake(hand, block_tokens=4))
    # depth 1: (1) x4, (5); depth 2: (1 2) x3, (1 4); depth 3: (1 2 3) x2; depth 4: (1 2 3 6)
    assert s["depth"].tolist() == [1, 2, 3, 4]
    assert s["requests"].tolist() == [5, 4, 2, 1]
    assert s["distinct"].tolist() == [2, 2, 1, 1]
    assert s["shared"].tolist() == [4, 3, 2, 0]
    assert s["seen_before"].tolist() == [3, 2, 1, 0]


def test_sharing_compares_whole_prefixes():
    # block 9 follows different prefixes: not the same 2-block prefix although its id repeats
    from kvlab.sim.traces import Trace
    tr = Trace("t", np.arange(3.0), np.full(3, 8), np.ones(3, np.int64), np.array([0, 2, 4, 6]),
               np.array([0, 2, 1, 2, 0, 2]), 4)
    s = prefix_sharing(tr)
    assert s["distinct"].tolist() == [2, 2] and s["shared"].tolist() == [2, 2] and s["seen_before"].tolist() == [1, 1]


def test_reuse_and_definitions(hand):
    tr = read_mooncake(hand, block_tokens=4)
    r = reuse_distribution(tr)
    # stack distances of the six reuses: 1 1 2 2 4 4 (blocks touched in between)
    assert r["cold_accesses"] == 6 and r["reuses"] == 6 and r["distance_percentiles"]["50"] == 2.0
    assert dict(zip(r["distance_bins_lo"].tolist(), r["distance_counts"].tolist()))[1] == 2
    d = {x["name"]: x["value"] for x in cache_ratio_definitions(tr)}
    assert d["block_reuse"] == d["prefix_blocks"] == d["prefix_tokens"] == d["full_blocks"] == 0.5
    assert abs(d["request_mean_tokens"] - (2 / 3 + 1 / 2 + 3 / 4) / 5) < 1e-12
    assert abs(d["warm_prefix_tokens"] - 16 / 28) < 1e-12  # requests 3-5: 4 + 0 + 12 hit of 8 + 4 + 16


@pytest.mark.skipif(not pk.ENABLED, reason="numba not available")
def test_analysis_curves_and_targets(hand):
    tr = read_mooncake(hand, block_tokens=4)
    a = analyze(tr, "qwen3-8b", points=6, targets=[0.25])
    assert a.counts == dict(requests=5, prompt_tokens=48, block_accesses=12, unique_blocks=6, mean_prompt_tokens=9.6)
    assert a.block_bytes == 147_456 * 4 and a.ceiling["token_hit_rate"] == 0.5
    lru = a.curves["lru"]
    assert lru["capacity_blocks"][-1] == 6 and lru["token_hit_rate"][-1] == 0.5
    assert np.array_equal(lru["capacity_bytes"], lru["capacity_blocks"] * 147_456 * 4)
    ref = cache_hits(tr, "fifo", lru["capacity_blocks"])
    assert np.array_equal(a.curves["fifo"]["token_hit_rate"], ref.token_hit_rate)
    assert np.isnan(a.curves["s3fifo"]["token_hit_rate"]).all()  # S3-FIFO starts at 20 blocks
    for row in a.targets:
        c = row["capacity_blocks"]
        if row["policy"] == "s3fifo":
            assert c is None
            continue
        h = cache_hits(tr, row["policy"], [c - 1, c] if c > 1 else [c])
        assert h.token_hit_rate[-1] >= 0.25 and (c == 1 or h.token_hit_rate[0] < 0.25), row
    opt = a.curves["belady"]["token_hit_rate"]
    for p in ("lru", "fifo", "lfu", "sieve", "arc"):
        assert (a.curves[p]["token_hit_rate"] <= opt).all()
    json.dumps(a.to_dict())  # every field serializes (NaN as null)


@pytest.mark.skipif(not pk.ENABLED, reason="numba not available")
def test_policy_table_bound_and_target_shares(hand):
    tr = read_mooncake(hand, block_tokens=4)
    rows = policy_table(tr, [2, 3], ["lru", "belady", "s3fifo"])
    assert [(r["policy"], r["capacity_blocks"]) for r in rows] == [
        ("lru", 2), ("lru", 3), ("belady", 2), ("belady", 3), ("s3fifo", 2), ("s3fifo", 3)]
    for r in rows[:4]:
        h = cache_hits(tr, r["policy"], [r["capacity_blocks"]])
        assert (r["found"], r["prefix_blocks"], r["prefix_tokens"]) == (int(h.found[0]), int(h.prefix_blocks[0]),
                                                                          int(h.prefix_tokens[0]))
        assert r["token_hit_rate"] == h.token_hit_rate[0] and r["block_hit_rate"] == h.block_hit_rate[0]
    assert rows[4]["found"] is None and np.isnan(rows[4]["token_hit_rate"])  # below S3-FIFO's smallest capacity
    with pytest.raises(ParameterError, match="capacity"):
        policy_table(tr, [0], ["lru"])
    a = analyze(tr, points=6, policies=["lru", "fifo", "belady", "belady-bypass"], target_shares=[0.5, 1.0])
    assert [t["target"] for t in a.targets[::4]] == [0.25, 0.5]  # shares of the 50% ceiling
    ex = bound_excess(a, "block")
    assert set(ex) == {"lru", "fifo", "belady-bypass"} and ex["lru"] <= 0 and ex["fifo"] <= 0
    # a curve above the bound shows as a positive excess
    a.curves["fifo"]["token_hit_rate"] = a.curves["belady"]["token_hit_rate"] + 0.125
    assert bound_excess(a)["fifo"] == pytest.approx(0.125, abs=1e-12)
    with pytest.raises(ParameterError, match="no 'arc' curve"):
        bound_excess(a, bound="arc")
    with pytest.raises(ParameterError, match="not both"):
        analyze(tr, points=3, policies=["lru"], targets=[0.1], target_shares=[0.5])


@pytest.mark.skipif(not pk.ENABLED, reason="numba not available")
def test_cli_text_and_json(hand, capsys):
    assert main(["analyze", str(hand), "--block-tokens", "4", "--model", "qwen3-8b", "--points", "4",
                 "--policy", "lru", "--policy", "belady"]) == 0
    out = capsys.readouterr().out
    assert "5 requests, 48 prompt tokens, 12 block accesses of 4 tokens, 6 unique blocks" in out
    assert "depth    2:         4 requests" in out and "ceiling (every block cached): 50.00%" in out
    assert main(["analyze", str(hand), "--block-tokens", "4", "--points", "3", "--policy", "arc", "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert list(j["curves"]) == ["arc"] and j["block_bytes"] is None and j["counts"]["unique_blocks"] == 6


@pytest.mark.skipif(not (have_trace("conversation") and have_trace("mooncake_synthetic")),
                    reason="Mooncake traces not present (kvlab traces fetch, or ../shared/traces)")
def test_mooncake_definitions_against_table2():
    # which reading of "cache ratio" rounds to the paper's Table 2 figure (40% conversation, 66% synthetic)
    for name, paper, matching, exact in (("conversation", 0.40, {"warm_prefix_tokens"}, {"block_reuse": 105_710 / 288_500}),
                                         ("mooncake_synthetic", 0.66, {"full_blocks"}, {})):
        d = {x["name"]: x["value"] for x in cache_ratio_definitions(load_trace(name))}
        assert {k for k, v in d.items() if round(v, 2) == paper} == matching, (name, d)
        for k, v in exact.items():
            assert abs(d[k] - v) < 1e-12
