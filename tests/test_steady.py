"""kvlab.serving.steady: aiconfigurator's own steady-state answer beside `kvlab plan`, and the measured parts of the
trace and the run that its average-request model leaves out."""
import json

import numpy as np
import pytest

from kvlab.cli import main
from kvlab.errors import ParameterError
from kvlab.serving import steady
from kvlab.sim.traces import Trace

needs_aic = pytest.mark.skipif(not steady.available(), reason="aiconfigurator not installed (pip install 'kvlab[serving]')")
SLO = {"ttft_p99": 2.0, "tpot_p99": 0.05}


def trace(times, inputs, outputs=None):
    n = len(times)
    return Trace("hand", np.asarray(times, float), np.asarray(inputs), np.asarray(outputs or [100] * n), None, None)


def test_differences_by_hand():
    """60 requests over 600 s, 30 of them inside one minute: the busiest 60 s brings 30 / (60 / 600) = 5x the mean
    rate over the span (about 5x); inputs 59 x 1,000 tokens and one of 100,000 put the p99 far above the mean."""
    times = sorted([float(i) for i in range(30)] + [60.0 + 18.3 * i for i in range(30)])
    d = steady.differences(trace(times, [1000] * 59 + [100_000]), {"ttft_p99_s": 3.0, "ttft_mean_s": 0.5,
                                                                    "token_hit_rate": 0.4})
    span = times[-1] - times[0]
    assert d["burst_peak_to_mean"] == pytest.approx(30 / 60 / (60 / span))  # [0, 60) holds t = 0..29
    inp = np.array([1000] * 59 + [100_000], float)
    assert d["input_p99_to_mean"] == pytest.approx(np.percentile(inp, 99) / inp.mean())
    assert d["ttft_p99_to_mean"] == 6.0 and d["token_hit_rate"] == 0.4
    assert steady.differences(trace([0.0, 1.0], [10, 10]), {})["burst_peak_to_mean"] is None  # span under a window
    assert steady.arrival_rate(trace([0.0, 5.0, 10.0], [1, 1, 1])) == pytest.approx(0.3)


@pytest.mark.parametrize("kw, match", [(dict(model="qwen3-8b", kv_format="nvfp4"), "own KV dtype"),
                                       (dict(model="qwen3-8b", gpu="MI300X"), "no data for GPU"),
                                       (dict(model="deepseek-v4.1-flash"), "no model")])
def test_why_not_names_the_gap(kw, match):
    kw = {"gpu": "H200", "engine": "vllm", "kv_format": None, **kw}
    a = steady.recommend(kw.pop("model"), kw.pop("gpu"), kw.pop("engine"), SLO, 1.0, 4000, 300, **kw)
    assert a.gpus is None and (match in a.why_not or "not installed" in a.why_not)


def test_bad_rate_is_refused():
    with pytest.raises(ParameterError, match="steady request rate"):
        steady.recommend("qwen3-8b", "H200", "vllm", SLO, 0.0, 4000, 300)


def test_not_installed_says_so(monkeypatch):
    monkeypatch.setattr(steady, "available", lambda: False)
    a = steady.recommend("qwen3-8b", "H200", "vllm", SLO, 1.0, 4000, 300)
    assert a.gpus is None and "not installed" in a.why_not


@needs_aic
@pytest.mark.slow
def test_recommend_is_aiconfigurators_own_answer():
    """The same numbers as calling aiconfigurator's cli_recommend directly (ms limits), and more load never asks
    for fewer GPUs."""
    from aiconfigurator.cli import cli_recommend
    ours = steady.recommend("qwen3-8b", "H200", "vllm", SLO, 6.0, 4000, 500, prefix=1000)
    theirs = cli_recommend(model_path="Qwen/Qwen3-8B", system="h200_sxm", backend="vllm", target_request_rate=6.0,
                           isl=4000, osl=500, prefix=1000, ttft=2000.0, tpot=50.0, top_n=1).best_latencies["agg"]
    assert ours.gpus == theirs["total_gpus_needed"] and ours.replicas == theirs["replicas_needed"]
    assert ours.ttft_s == pytest.approx(theirs["ttft"] / 1e3) and ours.tpot_s == pytest.approx(theirs["tpot"] / 1e3)
    more = steady.recommend("qwen3-8b", "H200", "vllm", SLO, 60.0, 4000, 500, prefix=1000)
    assert more.gpus >= ours.gpus and more.why_not is None


@needs_aic
@pytest.mark.slow
def test_cli_plan_carries_the_steady_answer(capsys):
    rc = main(["plan", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--slo", "ttft_p99=2,tpot_p99=0.05",
               "--limit", "200", "--json"])
    out = json.loads(capsys.readouterr().out)
    a = out["aiconfigurator"]
    assert rc == 0 and out["meets"] and a["why_not"] is None and a["gpus"] >= 1 and a["kvlab_gpus"] == out["gpus"]
    assert a["rate_from"] == "kvlab's planned run" and 0 < a["prefix"] < a["isl"]
    assert set(a["differences"]) >= {"burst_peak_to_mean", "input_p99_to_mean", "ttft_p99_to_mean", "token_hit_rate"}


def test_aiconfigurator_is_pinned():
    """kvlab's figures and calls are checked against aiconfigurator 0.12.0: the extra pins both packages to it and
    the installed ones (where installed) are it."""
    from pathlib import Path
    from kvlab.serving.steptime import aiconfigurator as aic
    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert f'"aiconfigurator-core=={aic.PINNED}' in text and f'"aiconfigurator=={aic.PINNED}' in text
    assert steady.VERSION == aic.PINNED == "0.12.0"
    if aic.available():
        import importlib.metadata as md
        assert aic.version() == md.version("aiconfigurator") == aic.PINNED


@needs_aic
@pytest.mark.slow
def test_deprecation_notice_is_caught_not_printed(capfd):
    """aiconfigurator 0.12.0 warns that its sweep functions move to `aisimulate` (DeprecationWarning, once per
    process); `kvlab plan` runs it with warnings shown, as `python -W default` would, and the notice is caught into
    NOTICES, never printed."""
    import warnings
    import aiconfigurator.deprecation as dep
    from kvlab.serving.steptime import aiconfigurator as aic
    dep._warned_entry_points.clear()  # it warns once per process: make this run the first
    aic.NOTICES.clear()
    with warnings.catch_warnings(record=True) as leaked:
        warnings.simplefilter("always")
        rc = main(["plan", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--slo", "ttft_p99=2,tpot_p99=0.05",
                   "--limit", "100", "--tp", "1", "--json"])
    out, err = capfd.readouterr()
    assert rc == 0 and json.loads(out)["aiconfigurator"]["gpus"] >= 1
    assert not [str(w.message) for w in leaked] and "aisimulate" not in out + err and err == ""
    assert any("aisimulate" in n and n.startswith("DeprecationWarning") for n in aic.NOTICES), aic.NOTICES
