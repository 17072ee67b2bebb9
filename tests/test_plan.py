"""`kvlab plan` (kvlab.serving.plan): the fewest replicas meeting an SLO, by search over the serving simulator."""
import json

import pytest

from kvlab.cli import main
from kvlab.errors import ParameterError
from kvlab.serving.plan import fewest_replicas, meets, parse_slo, plan_trace
from kvlab.serving.stepmodel import AffineStepModel
from kvlab.sim.traces import load_trace

SLOW = AffineStepModel(0.02, 200e-6, 2e-4, 1e-8)  # a slow step model: the synthetic stream then needs replicas


def fake(ttft_at_one: float, floor: float = 0.0):
    """A run whose TTFT p99 falls as 1 / R down to `floor`: summary dicts as the simulator gives them."""
    calls = []

    def run(r):
        calls.append(r)
        return dict(requests=10, completed=10, rejected=0, ttft_p99_s=max(floor, ttft_at_one / r), tpot_p99_s=0.01)
    return run, calls


@pytest.mark.parametrize("ttft1, limit, want", [(10.0, 1.0, 10), (10.0, 0.7, 15), (1.0, 2.0, 1), (100.0, 0.5, 200)])
def test_the_search_finds_the_fewest(ttft1, limit, want):
    run, calls = fake(ttft1)
    p = fewest_replicas(run, {"ttft_p99": limit}, gpus_per_replica=2)
    assert p.replicas == want and p.gpus == 2 * want
    assert all(p.tried[r] == (r >= want) for r in p.tried)  # every run below fails, every run at or above meets
    if want > 1:
        assert p.tried[want - 1] is False and p.below["ttft_p99_s"] > limit
    assert len(calls) == len(set(calls)) and len(calls) <= 2 * want.bit_length() + 2  # each R simulated once


def test_no_replica_count_meets_it():
    run, _ = fake(10.0, floor=3.0)  # the step times alone take 3 s
    p = fewest_replicas(run, {"ttft_p99": 2.0})
    assert p.replicas is None and "no longer improves" in p.why_not and max(p.tried) <= 8
    rej = fewest_replicas(lambda r: dict(requests=5, completed=4, rejected=1, ttft_p99_s=0.1), {"ttft_p99": 1.0})
    assert rej.replicas is None and "never fits" in rej.why_not and list(rej.tried) == [1]
    capped = fewest_replicas(fake(1e6)[0], {"ttft_p99": 1.0}, max_replicas=64)
    assert capped.replicas is None and "within 64" in capped.why_not


def test_meets():
    ok = dict(requests=3, completed=3, rejected=0, ttft_p99_s=1.0, tpot_p99_s=None)
    assert meets(ok, {"ttft_p99": 1.0, "tpot_p99": 0.01})  # no TPOT measured (one output token each): no TPOT limit
    assert not meets(ok, {"ttft_p99": 0.99})
    assert not meets({**ok, "completed": 2}, {"ttft_p99": 5})


@pytest.mark.parametrize("text, match", [
    ("", "an SLO is"), ("ttft=2", "not one of"), ("ttft_p99=-1", "positive"), ("ttft_p99=nan", "write metric"), ("ttft_p99=1e999", "positive"),
    ("ttft_p99=2,ttft_p99=3", "twice"), ("ttft_p99", "write metric=seconds"), ("ttft_p99=x", "write metric"),
])
def test_bad_slos(text, match):
    with pytest.raises(ParameterError, match=match):
        parse_slo(text)
    assert parse_slo("ttft_p99=2, tpot_p99=0.05") == {"ttft_p99": 2.0, "tpot_p99": 0.05}


@pytest.fixture(scope="module")
def trace():
    return load_trace("synthetic", limit=400, seed=0)


def test_a_looser_slo_never_needs_more_gpus(trace):
    """On the same trace: loosening any limit, or a smaller KV format, never needs more replicas."""
    need = {}
    for slo in ({"ttft_p99": 5.0, "tpot_p99": 0.1}, {"ttft_p99": 5.0, "tpot_p99": 0.2}, {"ttft_p99": 10.0}):
        for f in (None, "fp8_e4m3"):
            p = plan_trace(trace, "qwen3-8b", "H200", slo, step_model=SLOW, kv_format=f, closed_loop=False)
            assert p.replicas is not None, p.why_not
            need[tuple(slo.items()), f] = p.replicas
    tight = need[(("ttft_p99", 5.0), ("tpot_p99", 0.1)), None]
    assert tight > 1  # the case is one where the count matters
    assert need[(("ttft_p99", 5.0), ("tpot_p99", 0.2)), None] <= tight
    assert need[(("ttft_p99", 10.0),), None] <= need[(("ttft_p99", 5.0), ("tpot_p99", 0.2)), None]
    for k, v in need.items():
        if k[1] == "fp8_e4m3":
            assert v <= need[k[0], None]


def test_cli_json(capsys):
    rc = main(["plan", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--slo", "ttft_p99=5,tpot_p99=0.1",
               "--limit", "400", "--open-loop", "--step-time", "affine", "--overhead-ms", "20", "--prefill-token-us",
               "200", "--decode-request-us", "200", "--json", "--no-steady"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["meets"] is True and out["replicas"] > 1 and out["gpus"] == out["replicas"]
    assert "aiconfigurator" not in out  # --no-steady
    assert out["metrics"]["tpot_p99_s"] <= 0.1 and out["below"]["tpot_p99_s"] > 0.1
    assert out["tried"][str(out["replicas"] - 1)] is False and out["step_time"] == "affine"


@pytest.mark.parametrize("extra", [["--slo", "ttft=2"], ["--slo", "ttft_p99=0"], ["--max-replicas", "0"],
                                   ["--slo", "ttft_p99=2", "--gpu", "NOPE"], ["--slo", "ttft_p99=2", "--tp", "x"]])
def test_cli_bad_input_one_line_exit_2(capsys, extra):
    args = ["plan", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--limit", "20"]
    if "--slo" not in extra:
        args += ["--slo", "ttft_p99=2"]
    rc = main(args + extra)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith("kvlab: error:")
