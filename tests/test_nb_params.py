"""kvlab.nb.params: one clear ParameterError naming the parameter, from every notebook's parameters dataclass."""
import ast
import math
from dataclasses import dataclass, fields

import pytest

from kvlab.errors import ParameterError
from kvlab.nb.params import NotebookParams
from kvlab.nb.tiering import TieringParams
from kvlab.nb.compare import BytesPerTokenParams
from kvlab.nb.runner import NOTEBOOK_DIR as NOTEBOOKS, declared_parameters
from kvlab.nb.sessions import SessionsParams
from kvlab.hf.presses import PRESSES
from kvlab.nb.quality import QualityParams
from kvlab.nb.serving import ServingParams


@dataclass
class Demo(NotebookParams):
    tokens: int  # an integer >= 1
    share: float  # a number in [0, 1]
    lengths: list  # integers >= 1
    names: list  # strings

    def __post_init__(self):
        self.need_int("tokens")
        self.need_number("share", 0.0, 1.0)
        self.need_ints("lengths")
        self.need_names("names", ["a", "b"])


GOOD = dict(tokens=3, share=0.5, lengths=[1, 2], names=["a"])


@pytest.mark.parametrize("bad,message", [
    (dict(tokens=0), "parameter tokens must be an integer >= 1, got 0"),
    (dict(tokens=1e6), "parameter tokens must be an integer, got 1000000.0"),  # refused, not turned into a float
    (dict(tokens=True), "parameter tokens must be an integer, got True"),
    (dict(share=math.nan), "parameter share must be a finite number, got nan"),
    (dict(share=1.5), "parameter share must lie in [0, 1], got 1.5"),
    (dict(share="0.5"), "parameter share must be a number, got '0.5'"),
    (dict(lengths="12"), "parameter lengths must be a list, got '12'"),
    (dict(lengths=[]), "parameter lengths must not be empty"),
    (dict(lengths=[1, -2]), "parameter lengths must be an integer >= 1, got -2"),
    (dict(names=["c"]), "parameter names must be one of a, b; got 'c'"),
    (dict(names=[1]), "parameter names must be a list of names, got 1 in [1]"),
])
def test_one_message_naming_the_parameter(bad, message):
    with pytest.raises(ParameterError) as e:
        Demo.of({**GOOD, **bad})
    assert str(e.value) == message


def test_of_reads_the_notebook_namespace():
    assert Demo.of({**GOOD, "unrelated": object()}) == Demo(**GOOD)
    with pytest.raises(ParameterError, match="the parameters cell defines no names"):
        Demo.of({k: v for k, v in GOOD.items() if k != "names"})


TIERING = dict(trace="synthetic", synthetic_sessions=200, seed=0, models=["qwen3-8b"], model="deepseek-v4.1-flash",
               gpu="H100", hbm_gb=0.05, dram_gb=1.0, ssd_gb=10.0, policy="lru", ttl_s=0.0, ttls_s=[10, 30],
               prefill_tokens_per_s=10_000.0, capacity_points=25, validate_mooncake=True, policies=["lru", "sieve"],
               table_gb=[0.05], mooncake_table_gb=[1.0], target_shares=[0.5], tier_policy=["sieve", "lru", "lru"],
               tier_admission=["all", "second", "second"])


@pytest.mark.parametrize("bad,match", [
    (dict(ttl_s=math.nan), "parameter ttl_s must be a finite number"),  # NaN is no "no TTL"
    (dict(ttls_s=[10, 0]), r"parameter ttls_s must lie in \(0, inf\]"),
    (dict(hbm_gb=0.0), "parameter hbm_gb"), (dict(gpu="A100"), "parameter gpu must be one of"),
    (dict(trace="missing.jsonl"), "parameter trace: 'missing.jsonl' not found"),
    (dict(validate_mooncake="yes"), "parameter validate_mooncake must be True or False"),
    (dict(model="nope"), "parameter model must be one of"),
    (dict(policy="mru"), "parameter policy must be one of lru, fifo"),
    (dict(policies=["lru", "clock"]), "parameter policies must be one of"),
    (dict(table_gb=[0.0]), r"parameter table_gb must lie in \(0, 1e\+09\]"),
    (dict(target_shares=[1.5]), r"parameter target_shares must lie in \(0, 1\]"),
    (dict(tier_policy=["sieve", "lru"]), r"parameter tier_policy needs one entry per tier \(hbm, dram, ssd\), got 2"),
    (dict(tier_admission=["all", "third", "all"]), "parameter tier_admission must be one of all, second"),
])
def test_notebook_07_parameters(bad, match):
    assert TieringParams.of(TIERING).ttl == math.inf
    with pytest.raises(ParameterError, match=match):
        TieringParams.of({**TIERING, **bad})


def notebook_defaults(stem: str) -> dict:
    """A notebook's declared parameter defaults (kvlab.nb.runner.declared_parameters), as values."""
    return {n: ast.literal_eval(p["default"]) for n, p in declared_parameters(NOTEBOOKS / f"{stem}.ipynb").items()}


def test_every_notebook_default_is_accepted():
    """The dataclass and the parameters cell agree: the cell's defaults build it, its names are its fields."""
    for stem, cls in (("06_sessions_per_gpu", SessionsParams), ("07_tiering_on_traces", TieringParams),
                      ("01_kv_bytes_per_token", BytesPerTokenParams),
                      ("08_quality_on_trained_models", QualityParams), ("09_gpus_for_an_slo", ServingParams)):
        defaults = notebook_defaults(stem)
        cls.of(defaults)
        assert set(defaults) == {f.name for f in fields(cls) if f.init}, stem


def test_notebook_06_parameters():
    p = notebook_defaults("06_sessions_per_gpu")
    assert SessionsParams.of(p).kw == dict(utilization=0.9, activation_gb=4.0)
    for bad, match in ((dict(prefix_hit_rates=[1.5]), "parameter prefix_hit_rates must lie in"),
                       (dict(checklist_gpu="A100"), "parameter checklist_gpu must be one of"),
                       (dict(decode_tokens_per_s=-1.0), "parameter decode_tokens_per_s"),
                       (dict(contexts=[0]), "parameter contexts must be an integer >= 1")):
        with pytest.raises(ParameterError, match=match):
            SessionsParams.of({**p, **bad})


def test_notebook_08_parameters():
    p = notebook_defaults("08_quality_on_trained_models")
    q = QualityParams.of(p)
    assert [path.split("/")[-1] for path in q.paths] == ["qwen3-tiny", "deepseek-v3-tiny", "kvlab-v41-tiny"]
    for bad, match in ((dict(mechanisms=["windw=4"]), "parameter mechanisms: mechanism 'windw=4'"),
                       (dict(formats=["fp7"]), "parameter formats: "),
                       (dict(peers=["quanto3"]), "parameter peers must be one of"),
                       (dict(contexts=[8]), "parameter contexts must be an integer >= 16"),
                       (dict(models="qwen3-tiny"), "parameter models must be a list"),
                       (dict(task="copy"), "parameter task must be one of"),
                       (dict(compute_dtype="float16"), "parameter compute_dtype must be one of"),
                       (dict(mechanisms=["window:3/2"]), "not a fraction of the context"),
                       (dict(presses=["snapkv keep lots"]), "not a number or fraction"),
                       (dict(presses=["snapkv"]), r"write it as 'name keep budget \[format\]'"),
                       (dict(presses=["snapk keep 1/4"]), "unknown press"),
                       (dict(others=["nvfp9"]), "parameter others: 'nvfp9' is not one of this run's settings"),
                       (dict(heatmap=["window:1/8"]), "parameter heatmap: 'window:1/8'"),
                       (dict(depth_samples=-1), "parameter depth_samples"),
                       (dict(batch=0), "parameter batch"),
                       (dict(full="yes"), "parameter full must be True or False"),
                       (dict(longer=["int9"]), "parameter longer: 'int9' is not one of this run's settings"),
                       (dict(halfwidth=0.5), "parameter halfwidth"), (dict(halfwidth=-0.01), "parameter halfwidth"),
                       (dict(halfwidth="0.05"), "parameter halfwidth")):
        with pytest.raises(ParameterError, match=match):
            QualityParams.of({**p, **bad})
    # the defaults draw until every accuracy interval is +-0.05 (385 samples bound any), in FP32 compute (a CPU
    # without BF16 instructions emulates BF16 matmuls); halfwidth=0.1 draws up to 97
    assert (q.halfwidth, q.max_samples, q.compute_dtype) == (0.05, 385, "float32") and q.samples < q.max_samples
    assert QualityParams.of({**p, "halfwidth": 0.1}).max_samples == 97
    assert QualityParams.of({**p, "halfwidth": 0, "samples": 40}).max_samples == 40  # 0: exactly `samples`
    # full=True: the complete grid, every press at three budgets, every setting at both contexts, +-0.05
    f = QualityParams.of({**p, "full": True})
    assert f.halfwidth == 0.05 and f.others == f.longer == ["*"]
    assert len(f.presses) == 3 * len(PRESSES) and {p.split()[0] for p in f.presses} == set(PRESSES)
    assert {s.label for s in f.pick(["*"])} == {s.label for s in f.settings()}
    assert [s.label for s in q.pick(["window:1/4"])] == ["window=1/4"]  # notebooks write ':', labels '='
