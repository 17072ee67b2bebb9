"""The one step-time protocol (kvlab.serving.stepmodel.StepModel), the registry of step-time sources
(kvlab.serving.stepsources) the CLI reads, and serve-sim's progress bar."""
import numpy as np
import pytest

from kvlab.errors import ParameterError
from kvlab.serving import stepsources
from kvlab.serving.blockpool import BlockPool
from kvlab.serving.replica import prompt_keys
from kvlab.serving.scheduler import output_key
from kvlab.serving.stepmodel import AffineStepModel, StepModel, as_step_model


class OnlyStepS:
    """A third party's source: step_s alone, figures as numpy floats."""

    target = None

    def step_s(self, prefill, decode):
        return np.float64(1e-3 + 1e-6 * sum(n for n, _ in prefill) + 1e-8 * sum(decode))


def test_every_registered_source_builds_a_step_model():
    assert stepsources.names() == ("auto", "aiconfigurator", "roofline", "affine", "unit")
    d = stepsources.Deployment("qwen3-8b", "h200", "vllm", 1, None)
    for name in ("roofline", "affine", "unit"):
        assert isinstance(stepsources.build(name, d), StepModel), name
    unit = stepsources.build("unit", d)
    assert unit.step_s([(4096, 0)], [10, 20]) == 1.0
    assert stepsources.build("affine", stepsources.Deployment(coefficients=(1e-3, 0.0, 0.0, 0.0))).step_s([], [5]) == 1e-3
    assert not stepsources.get("affine").per_tp and stepsources.get("roofline").per_tp


def test_registry_refuses_unknown_and_twice():
    with pytest.raises(ParameterError, match="step-time source"):
        stepsources.get("magic")
    with pytest.raises(ParameterError, match="registered twice"):
        stepsources.register("unit", "again")(lambda d: None)
    assert stepsources.names()[-1] == "unit"


def test_cli_choices_and_help_come_from_the_registry(capsys):
    from kvlab.cli import main
    with pytest.raises(SystemExit):
        main(["serve-sim", "--help"])
    out = capsys.readouterr().out
    assert "{" + ",".join(stepsources.names()) + "}" in out
    for s in stepsources.SOURCES.values():
        assert f"{s.name}:" in out


def test_one_registry_gives_every_list():
    """The catalog choices (kvlab step-time --source, step_time) and the catalog classes come from the same
    registrations as --step-time's choices: no second list of names."""
    import subprocess
    import sys
    from kvlab.serving import steptime
    assert stepsources.catalog_names() == steptime.CHOICES == ("auto", "aiconfigurator", "roofline")
    assert set(steptime.SOURCES) == {"aiconfigurator", "roofline"}
    for name, cls in steptime.SOURCES.items():
        assert cls.name == name and issubclass(cls, steptime.StepTimeSource)
        assert stepsources.get(name).source_class() is cls
    assert stepsources.get("auto").source_class() is None and not stepsources.get("unit").catalog
    with pytest.raises(ParameterError, match="step-time source must be one of auto, aiconfigurator, roofline"):
        steptime.step_time("qwen3-8b", "H200", "vllm", source="unit")
    d = stepsources.Deployment("qwen3-8b", "h200", "vllm", 1, None)
    r = stepsources.build("roofline", d)
    assert type(r) is steptime.Roofline and r.describe() == steptime.step_time("qwen3-8b", "H200", "vllm",
                                                                               source="roofline").describe()
    with pytest.raises(ParameterError, match="unknown GPU"):
        stepsources.build("roofline", stepsources.Deployment("qwen3-8b", "nogpu"))
    with pytest.raises(ParameterError, match="tp"):
        stepsources.build("roofline", stepsources.Deployment("qwen3-8b", "h200", tp=0))
    # the CLI's help reads the registry without loading the sources' modules
    code = ("import sys\nfrom kvlab.cli import main\nfor c in ('serve-sim', 'plan', 'step-time'):\n"
            "    try:\n        main([c, '--help'])\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('kvlab.serving.step')), file=sys.stderr)")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert err.strip() == "['kvlab.serving.stepmodel', 'kvlab.serving.stepsources']"


def test_adapted_source_prices_runs_step_by_step():
    m = as_step_model(OnlyStepS())
    assert isinstance(m, StepModel) and m.describe()["source"] == "OnlyStepS"
    run = m.decode_run_s([3, 70], 5)
    assert [float(x) for x in run] == [float(OnlyStepS().step_s((), [3 + j, 70 + j])) for j in range(5)]
    assert type(m.step_s([(1, 0)], [])) is float
    a = AffineStepModel.fitted()
    assert as_step_model(a) is a
    with pytest.raises(ParameterError, match="step_s"):
        as_step_model(object())


def test_base_decode_run_equals_the_vectorized_ones():
    a = AffineStepModel(1.1e-3, 2.3e-6, 3.7e-5, 4.9e-9)
    ctx = [1, 400, 9000]
    assert StepModel.decode_run_s(a, ctx, 20).tolist() == a.decode_run_s(ctx, 20).tolist()


def test_keys_and_bulk_take_keep_their_order():
    # prompt keys: trace block of each KV block's last token, offset in it; output keys never equal one
    ids = np.array([7, 9], np.int64)
    assert prompt_keys(ids, 70, 16, 32).tolist() == [7 * 32 + 15, 7 * 32 + 31, 9 * 32 + 15, 9 * 32 + 31]
    assert prompt_keys(ids, 200, 16, 32).tolist() == prompt_keys(ids, 64, 16, 32).tolist()  # keys stop where the
    # trace's blocks do
    assert output_key(0, 0) < 0 and output_key(1, 0) != output_key(0, 1)
    # take: blocks put back at the head, then never-used ones, then the tail (least recently freed first)
    p = BlockPool(10)
    a = p.take(6)
    assert a == [1, 2, 3, 4, 5, 6]
    p.cache(a[0], 100)
    p.free([a[0]])  # hashed: to the tail
    p.free([a[1]])  # unhashed: to the head
    assert p.take(5) == [2, 7, 8, 9, 1] and p.cached == {}


def test_serve_sim_progress_bar(tmp_path, capsys, monkeypatch):
    from kvlab.cli import main, servesim
    monkeypatch.setattr(servesim, "PROGRESS_REQUESTS", 5)
    args = ["serve-sim", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--limit", "20", "--step-time", "unit"]
    assert main(args) == 0
    assert "serve-sim:" in capsys.readouterr().err
    assert main(args + ["--no-progress"]) == 0
    assert "serve-sim:" not in capsys.readouterr().err
    assert main(args + ["--json"]) == 0
    assert "serve-sim:" not in capsys.readouterr().err
