"""`kvlab plan` (kvlab.serving.plan): the fewest replicas meeting an SLO, by search over the serving simulator."""
import json

import pytest

from kvlab.cli import main
from kvlab.errors import ParameterError
from kvlab.serving.plan import METRICS, fewest_replicas, meets, parse_slo, plan_trace
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
               "200", "--decode-request-us", "200", "--context-token-ns", "10", "--json", "--no-steady"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["meets"] is True and out["replicas"] > 1 and out["gpus"] == out["replicas"]
    assert "aiconfigurator" not in out  # --no-steady
    assert out["metrics"]["tpot_p99_s"] <= 0.1 and out["below"]["tpot_p99_s"] > 0.1
    assert out["tried"][str(out["replicas"] - 1)] is False and out["step_time"]["source"] == "affine"


@pytest.mark.parametrize("extra", [["--slo", "ttft=2"], ["--slo", "ttft_p99=0"], ["--max-replicas", "0"],
                                   ["--slo", "ttft_p99=2", "--gpu", "NOPE"], ["--slo", "ttft_p99=2", "--tp", "x"]])
def test_cli_bad_input_one_line_exit_2(capsys, extra):
    args = ["plan", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--limit", "20"]
    if "--slo" not in extra:
        args += ["--slo", "ttft_p99=2"]
    rc = main(args + extra)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith("kvlab: error:")


# --- the search over TP and replicas; what a plan that meets nothing says -------------------------------------------
def test_nothing_meets_the_slo_exits_1_with_each_candidates_best(capsys):
    """No TP and replica count meets the SLO: each candidate's best percentile is printed, one line on stderr, exit 1
    (not 0: a script must not read 'cannot meet' as an answer)."""
    args = ["plan", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--slo", "ttft_p99=0.01,tpot_p99=0.001",
            "--limit", "60", "--open-loop", "--step-time", "roofline", "--max-tp", "2", "--no-steady"]
    rc = main(args)
    out, err = capsys.readouterr()
    assert rc == 1 and len(err.strip().splitlines()) == 1 and err.startswith("kvlab: plan: no candidate (TP1, TP2)")
    assert "no deployment of qwen3-8b on H200 meets ttft_p99 <= 0.01 s, tpot_p99 <= 0.001 s" in out
    for tp in (1, 2):
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(f"TP{tp}: not met"))
        assert "best reached ttft_p99 " in line and "tpot_p99 " in line
    rc = main(args + ["--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 1 and d["meets"] is False and d["gpus"] is None and [c["tp"] for c in d["candidates"]] == [1, 2]
    for c in d["candidates"]:
        r = c["reached"]
        assert r["ttft_p99"]["seconds"] > 0.01 and r["tpot_p99"]["seconds"] > 0.001 and r["tpot_p99"]["replicas"] >= 1


def test_help_offers_only_the_slos_it_accepts(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    offered = text.split("metrics: ", 1)[1].split(" ")[:len(METRICS)]
    assert [m.rstrip(",") for m in offered] == list(METRICS)
    assert "e2e at p50" not in text
    for m in METRICS:
        assert parse_slo(f"{m}=1") == {m: 1.0}


def fake_plans(gpus_by_tp: dict):
    """A plan_config stand-in: TP t meets the SLO at gpus_by_tp[t] GPUs (None: never), within the replica limit."""
    from kvlab.serving.plan import Plan
    calls = []

    def plan_config(trace, base, slo, *, step_model, max_replicas):
        tp = base
        calls.append((tp, max_replicas))
        g = gpus_by_tp[tp]
        if g is None or g // tp > max_replicas:
            return Plan(None, None, tp, slo, None, None, {}, f"not met within {max_replicas} replicas",
                        {"ttft_p99": (3.0, 1)})
        return Plan(g // tp, g, tp, slo, {}, None, {g // tp: True})
    return plan_config, calls


@pytest.mark.parametrize("gpus_by_tp, best_tp, searched", [
    ({1: 5, 2: 2, 4: 4, 8: 8}, 2, [(1, 4096), (2, 2), (4, 0), (8, 0)]),  # TP2 wins; TP4 / 8 cannot beat 2 GPUs
    ({1: 4, 2: 4, 4: 4, 8: 8}, 1, [(1, 4096), (2, 1), (4, 0), (8, 0)]),  # a tie goes to the smaller TP
    ({1: None, 2: None, 4: 8, 8: 8}, 4, [(1, 4096), (2, 4096), (4, 4096), (8, 0)]),
    ({1: None, 2: None, 4: None, 8: None}, None, [(1, 4096), (2, 4096), (4, 4096), (8, 4096)]),
])
def test_search_takes_the_fewest_gpus_over_tp(monkeypatch, gpus_by_tp, best_tp, searched):
    """GPUs = TP x replicas; the fewest win, a tie goes to the smaller TP, and a TP is searched only up to the
    replicas that could still beat the best so far (0: skipped)."""
    from kvlab.serving import plan as planmod
    fake, calls = fake_plans(gpus_by_tp)
    monkeypatch.setattr(planmod, "plan_config", fake)
    s = planmod.search(None, {"ttft_p99": 1.0}, lambda tp: tp, lambda tp: None, (8, 4, 2, 1))
    assert (s.best.tp if s.best else None) == best_tp
    assert [c for c in calls] == [(tp, lim) for tp, lim in searched if lim]
    assert sorted(s.skipped) == [tp for tp, lim in searched if not lim]
    if s.best is not None:
        assert s.best.gpus == min(g for g in gpus_by_tp.values() if g is not None)
    d = s.to_dict()
    assert d["meets"] is (best_tp is not None) and d["rule"].startswith("fewest GPUs; a tie goes to the smaller TP")


def test_search_skips_tps_that_cannot_deploy():
    """A TP whose weights leave no KV memory is skipped with its reason; none deployable is an error."""
    from kvlab.serving.plan import search
    from kvlab.serving.simulator import deployment_config
    tr = load_trace("synthetic", limit=30)
    with pytest.raises(ParameterError, match="no tensor-parallel size can be deployed: TP 1: .*no memory left"):
        search(tr, {"ttft_p99": 9.0}, lambda tp: deployment_config("llama-3.1-70b", "H100", tr, tp=tp),
               lambda tp: SLOW, [1])


@pytest.mark.slow
def test_notebook_09_figure_from_the_shell(capsys):
    """The GPUs notebook 09 recorded for one deployment (its committed run) equal what `kvlab plan` answers from
    the shell with the command the notebook recorded beside it."""
    import shlex
    from pathlib import Path
    from kvlab.nb.record import read_results
    r = read_results(Path(__file__).parents[1] / "notebooks" / "09_gpus_for_an_slo.ipynb")
    label = "qwen3-8b fp8_e4m3"
    cmd = shlex.split(r["plan_commands"][label])
    assert cmd[:2] == ["kvlab", "plan"] and "--load" in cmd and "--tp" in cmd
    assert main(cmd[1:] + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == r["gpus_needed"][label] and out["replicas"] == r["replicas_needed"][label]
    assert out["gpus"] > 1  # a point where the replica count matters
