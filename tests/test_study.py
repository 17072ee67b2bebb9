"""kvlab.serving.study (notebook 09's logic): deployments, offered load, the fewest GPUs, and the fast counts it
rests on (Layout.totals, kvlab.attention.flops.DecodeCounter) against the one-at-a-time ones."""
import numpy as np
import pytest

from kvlab.attention.flops import CAPS, DecodeCounter, decode_flops
from kvlab.engines import allocate
from kvlab.errors import KvlabError, NoEngineLayout, ParameterError
from kvlab.layout import Shard, build_layout
from kvlab.models import catalog_names
from kvlab.serving.plan import parse_slo
from kvlab.serving.simulator import deployment_config
from kvlab.nb.serving import ServingParams
from kvlab.serving.study import Deployment, Study, scaled, synthetic_at
from kvlab.sim.traces import load_trace

LENGTHS = np.array([1, 2, 5, 63, 64, 65, 127, 128, 129, 255, 1000, 4096, 4097, 131072, 1_000_003])


@pytest.mark.parametrize("model", catalog_names())
def test_totals_equal_one_session_at_a_time(model):
    """Layout.totals prices many lengths at once: exactly session(n).total at each, every scheme, format, shard."""
    seen = 0
    for scheme in ("storage", "vllm", "bf16"):
        for fmt in (None, "fp8_e4m3", "nvfp4", "int4"):
            for shard in (None, Shard(2)):
                try:
                    layout = allocate(model, scheme, fmt, **({"shard": shard} if shard else {})).layout
                except KvlabError:
                    continue
                assert layout.totals(LENGTHS).tolist() == [layout.session(int(t)).total for t in LENGTHS]
                seen += 1
    assert seen


@pytest.mark.parametrize("model", ["qwen3-8b", "llama-3.1-8b"])
def test_totals_with_a_kivi_residual(model):
    layout = build_layout(model, "storage", kv_format="int4", residual=32, block=64, key_axis="channel")
    assert layout.totals(LENGTHS).tolist() == [layout.session(int(t)).total for t in LENGTHS]
    with pytest.raises(ParameterError, match="at least 1 token"):
        layout.totals(np.array([5, 0]))


@pytest.mark.parametrize("model", ["deepseek-v4-flash", "deepseek-v4.1-flash"])
@pytest.mark.parametrize("cap", CAPS)
def test_decode_counter_many_contexts_at_once(model, cap):
    c = DecodeCounter(model, cap=cap)
    got = c.context_flops(LENGTHS)
    assert got.tolist() == [decode_flops(model, int(t), cap=cap).context for t in LENGTHS]


@pytest.mark.parametrize("text, want", [
    ("qwen3-8b", Deployment("qwen3-8b")),
    ("qwen3-8b:fp8_e4m3", Deployment("qwen3-8b", "fp8_e4m3")),
    ("deepseek-v4-flash@tp4", Deployment("deepseek-v4-flash", None, 4)),
    ("deepseek-v4.1-flash:fp8_e4m3@tp8", Deployment("deepseek-v4.1-flash", "fp8_e4m3", 8)),
])
def test_deployment_parse(text, want):
    assert Deployment.parse(text) == want


@pytest.mark.parametrize("bad", ["", "qwen3-8b@tp0", "qwen3-8b@4", "a b", 7, "qwen3-8b:"])
def test_deployment_parse_refuses(bad):
    with pytest.raises(ParameterError):
        Deployment.parse(bad)


def test_load_scales_the_trace():
    tr = load_trace("synthetic", sessions=6)
    fast = scaled(tr, 4)
    assert np.allclose(fast.timestamps * 4, tr.timestamps) and (fast.input_tokens == tr.input_tokens).all()
    more = synthetic_at(3, sessions=6)
    assert len(np.unique(more.session_ids)) == 18  # 3 x the users, arriving 3 x as fast
    with pytest.raises(ParameterError):
        scaled(tr, 0)


def test_an_engine_without_a_layout_counts_the_model_storage():
    """V4.1-Flash has no published vLLM layout: its pool is the model's storage, and the config says so."""
    tr = load_trace("synthetic", sessions=2)
    with pytest.raises(NoEngineLayout):
        allocate("deepseek-v4.1-flash", engine="vllm")
    cfg = deployment_config("deepseek-v4.1-flash", "H200", tr, engine="vllm", tp=4)
    assert "as the model stores it" in cfg.layout_note
    exact = deployment_config("deepseek-v4.1-flash", "H200", tr, engine=None, tp=4)
    assert cfg.pool_tokens == exact.pool_tokens and "as the model stores it" not in exact.layout_note
    assert "sliding windows and fixed states is left out" in exact.layout_note  # its window and compressor tails
    assert deployment_config("qwen3-8b", "H200", tr).layout_note == ""


def test_fewest_gpus_on_a_small_study():
    """More users never need fewer GPUs; a smaller KV format never more; each run is kept, not rerun."""
    syn = dict(sessions=6, seed=0, human_pause_median_s=10.0)
    st = Study(load_trace("synthetic", **syn), "H200", synthetic=syn)
    slo = parse_slo("ttft_p99=2,tpot_p99=0.05")
    bf16, fp8 = Deployment("qwen3-8b"), Deployment("qwen3-8b", "fp8_e4m3")
    light, heavy = st.fewest(bf16, slo, 1), st.fewest(bf16, slo, 24)
    assert light.replicas == 1 and heavy.replicas >= light.replicas
    assert st.fewest(fp8, slo, 24).gpus <= heavy.gpus
    assert heavy.gpus == heavy.replicas * bf16.tp
    r = st.run(bf16, 1, 24)
    assert st.run(bf16, 1, 24) is r  # kept
    assert r.summary()["requests"] == len(st.trace_at(24))
    curve = st.load_curve(bf16, [1, 24])
    assert curve[1]["ttft_p99_s"] >= curve[0]["ttft_p99_s"]


def _defaults():
    return dict(trace="synthetic", synthetic_sessions=20, human_pause_median_s=10.0, seed=0, limit=0, gpu="H200",
                engine="vllm", step_time="roofline", deployments=["qwen3-8b", "deepseek-v4-flash@tp4"],
                slo={"ttft_p99": 2.0, "tpot_p99": 0.05}, load=16.0, loads=[1, 2], knee=[0], dram_gbs=[0, 256],
                max_replicas=64, steady=False)


@pytest.mark.parametrize("bad, match", [
    (dict(deployments=["nosuch-model"]), "parameter deployments"),
    (dict(deployments=["qwen3-8b:fp7"]), "parameter deployments"),
    (dict(deployments=["deepseek-v4-flash@tp2"]), "parameter deployments: .*no memory left for KV"),
    (dict(slo={"ttft": 2}), "parameter slo"),
    (dict(slo={"ttft_p99": "2"}), "parameter slo"),
    (dict(slo={"ttft_p99": -1.0}), "parameter slo"),
    (dict(slo={}), "parameter slo"),
    (dict(load=0.0), "parameter load"),
    (dict(knee=[5]), "parameter knee"),
    (dict(gpu="A100"), "parameter gpu"),
    (dict(step_time="guess"), "parameter step_time"),
    (dict(dram_gbs=[-1]), "parameter dram_gbs"),
    (dict(synthetic_sessions=0), "parameter synthetic_sessions"),
    (dict(steady="yes"), "parameter steady"),
])
def test_serving_params_refuse(bad, match):
    with pytest.raises(ParameterError, match=match):
        ServingParams.of({**_defaults(), **bad})


def test_serving_params_take_the_cli_form_too():
    p = ServingParams.of({**_defaults(), "slo": "ttft_p99=3"})
    assert p.slo_limits == {"ttft_p99": 3.0} and p.slo_text == "ttft_p99=3"
    assert ServingParams.of(_defaults()).slo_text == "ttft_p99=2,tpot_p99=0.05"


def test_serving_params_bad_trace_file(tmp_path):
    p = ServingParams.of({**_defaults(), "trace": str(tmp_path / "missing.jsonl")})
    with pytest.raises(ParameterError, match="parameter trace"):
        p.study()
