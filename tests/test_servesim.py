"""The discrete-event serving simulator (kvlab.serving.simulator) and `kvlab serve-sim`."""
import json
import math

import numpy as np
import pytest

from kvlab.cli import main
from kvlab.errors import ParameterError
from kvlab.serving.router import ROUTERS
from kvlab.serving.simulator import ServeConfig, deployment_config, simulate_serving
from kvlab.serving.stepmodel import AffineStepModel, StepModel
from kvlab.sim.tiering import make_tiers, simulate
from kvlab.sim.traces import Trace, have_trace, load_trace, read_mooncake

MODEL = "llama-3.1-8b"
# Simulator mechanics tests run on fixed affine coefficients (given, so they time any deployment); the default step
# times of a deployment (auto) have tests of their own below.
STEP = AffineStepModel(4e-3, 21.3e-6, 0.107e-3, 17.9e-9, basis="coefficients given for simulator tests")


def plain(ts, inp, out):
    """A trace without prefix information (Azure's shape)."""
    n = len(ts)
    return Trace("plain", np.asarray(ts, float), np.broadcast_to(np.asarray(inp, np.int64), n).copy(),
                 np.broadcast_to(np.asarray(out, np.int64), n).copy(), None, None)


def poisson(n, rate, seed=0):
    return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))


def test_affine_is_a_step_model():
    m = AffineStepModel(1e-3, 2e-6, 3e-5, 4e-9)
    assert isinstance(m, StepModel)
    assert m.step_s([(100, 50)], [1000, 2000]) == pytest.approx(1e-3 + 2e-6 * 100 + 3e-5 * 2 + 4e-9 * 3050)
    with pytest.raises(ParameterError):
        AffineStepModel(-1.0, 0, 0, 0)
    with pytest.raises(TypeError):  # no silent default: the fit is asked for by name
        AffineStepModel()


def test_idle_replica_ttft_is_the_prefill_step():
    m = AffineStepModel.fitted()
    r = simulate_serving(plain([5.0], 3000, 10), ServeConfig(), m)
    assert r.ttft_s[0] == pytest.approx(m.step_s([(3000, 0)], []), rel=1e-12)
    assert r.queue_s[0] == 0.0
    # nine decode steps after the first token, each at its context
    assert r.tpot_s[0] == pytest.approx(np.mean([m.step_s([], [3000 + k]) for k in range(9)]), rel=1e-12)
    # a long prompt is chunked under max_num_batched_tokens: TTFT is the sum of its chunk steps
    r = simulate_serving(plain([0.0], 5000, 1), ServeConfig(max_num_batched_tokens=2048), m)
    want = sum(m.step_s([(n, c)], []) for n, c in ((2048, 0), (2048, 2048), (904, 4096)))
    assert r.ttft_s[0] == pytest.approx(want, rel=1e-12)


def test_littles_law():
    tr = load_trace("synthetic", limit=1500, seed=3)
    r = simulate_serving(tr, deployment_config(MODEL, "H100", tr, replicas=2, router="least_loaded"), STEP)
    s = r.summary()
    lam = s["completed"] / s["makespan_s"]
    assert s["mean_in_system"] == pytest.approx(lam * s["e2e_mean_s"], rel=1e-9)


def test_md1_pollaczek_khinchine():
    m = AffineStepModel(2e-3, 10e-6, 0.0, 0.0)
    D = m.step_s([(800, 0)], [])  # 10 ms
    rho = 0.7
    r = simulate_serving(plain(poisson(60_000, rho / D, seed=1), 800, 1), ServeConfig(max_num_seqs=1), m)
    pk = rho * D / (2 * (1 - rho))  # M/D/1 mean wait, Pollaczek-Khinchine
    assert r.summary()["completed"] == 60_000
    assert np.nanmean(r.queue_s) == pytest.approx(pk, rel=0.05)
    assert np.allclose(r.ttft_s - r.queue_s, D)


def test_saturation_matches_batch_throughput():
    m = AffineStepModel(3e-3, 20e-6, 0.1e-3, 0.0)
    B = 64
    r = simulate_serving(plain(np.zeros(8 * B), 16, 2000), ServeConfig(max_num_seqs=B), m)
    assert r.summary()["throughput_tokens_per_s"] == pytest.approx(m.decode_throughput(B), rel=0.01)


@pytest.mark.parametrize("name", ["synthetic", "mooncake-conversation"])
def test_unbounded_hits_equal_kvlab_simulate(name):
    if name != "synthetic" and not have_trace(name):
        pytest.skip(f"{name} is not on this machine")
    tr = load_trace(name, limit=3000)
    s = simulate(tr, make_tiers(MODEL, 1e6, gpu="H100", block_tokens=tr.block_tokens))
    # vLLM's rules, in a pool that never evicts: a hit stops short of the prompt's last token, at a whole 16-token
    # block, so each request may hit up to two blocks' tokens less than the trace-block count says
    r = simulate_serving(tr, deployment_config(MODEL, "H100", tr, closed_loop=False, num_blocks=10 ** 7), STEP)
    lost = s.hit_tokens[0] - r.hit_tokens[0]
    assert 0 <= lost < 32 * len(tr) and r.hit_tokens[1:].tolist() == [0, 0]


def test_tiers_move_bytes_and_hit_below_hbm():
    """A bounded pool (the HBM tier) with host DRAM behind it: the pool's evictions move to DRAM and come back as
    hits (kvlab.serving.hosttiers; tests/test_host_tiers.py checks the rules)."""
    tr = load_trace("synthetic", limit=300)
    kw = dict(closed_loop=False, num_blocks=12_000)
    cfg = deployment_config(MODEL, "H100", tr, dram_gb=200.0, **kw)
    s = simulate_serving(tr, cfg, STEP).summary()
    assert s["dram_hit_blocks"] > 0 and s["moved_bytes"]["hbm->dram"] > 0 and s["moved_bytes"]["dram->hbm"] > 0
    small = simulate_serving(tr, deployment_config(MODEL, "H100", tr, **kw), STEP).summary()
    assert small["token_hit_rate"] < s["token_hit_rate"] and small["moved_bytes"] == {}


def test_same_seed_same_run():
    runs = []
    for _ in range(2):
        tr = load_trace("synthetic", limit=800, seed=7)
        runs.append(simulate_serving(tr, deployment_config(MODEL, "H100", tr, replicas=3, router="prefix"), STEP))
    a, b = runs
    for k in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        assert np.array_equal(getattr(a, k), getattr(b, k), equal_nan=True)
    assert a.summary() == b.summary()


def test_preemption_by_recompute_and_rejection():
    m = AffineStepModel.fitted()
    # 4 requests of 1,000 + 500 tokens in a 3,200-token pool: they cannot all grow, some get preempted
    r = simulate_serving(plain(np.zeros(4), 1000, 500), ServeConfig(pool_tokens=3200), m)
    s = r.summary()
    assert s["completed"] == 4 and s["preemptions"] > 0
    # one request that can never fit the pool is rejected, the others served
    r = simulate_serving(plain([0.0, 0.1, 0.2], [100, 5000, 100], 10), ServeConfig(pool_tokens=4096), m)
    assert r.rejected.tolist() == [False, True, False] and r.summary()["completed"] == 2


def test_azure_trace_and_empty_prompt():
    if have_trace("azure-code-2023"):
        tr = load_trace("azure-code-2023", limit=500)
        cfg = deployment_config(MODEL, "H100", tr, replicas=2, router="least_loaded")
        s = simulate_serving(tr, cfg, STEP).summary()
        assert s["completed"] + s["rejected"] == 500 and s["token_hit_rate"] == 0.0
    # a request with no prompt or no output token is refused (vLLM refuses both), naming the first and the count
    cfg = ServeConfig(cache_blocks=(100, 0, 0))
    tr = Trace("e", np.zeros(3), np.array([5, 0, 0]), np.array([3, 3, 3]), np.array([0, 1, 1, 1]),
               np.zeros(1, np.int64), 512)
    with pytest.raises(ParameterError, match=r"trace e: request 2 \(of 3\) has 0 input .*1 more like it.*vLLM refuses"):
        simulate_serving(tr, cfg, STEP)
    tr = plain([0.0, 1.0], [10, 10], [4, 0])
    with pytest.raises(ParameterError, match=r"request 2 .* 0 output tokens"):
        simulate_serving(tr, ServeConfig(), STEP)


def test_closed_loop_sessions_wait_for_their_turn():
    tr = load_trace("synthetic", limit=600)
    cfg = deployment_config(MODEL, "H100", tr)
    assert cfg.closed_loop is None
    r = simulate_serving(tr, cfg, STEP)
    sid = tr.session_ids
    for s in np.unique(sid)[:20]:
        idx = np.flatnonzero(sid == s)
        ends = r.arrival_s[idx] + r.e2e_s[idx]
        assert np.all(r.arrival_s[idx[1:]] >= ends[:-1] - 1e-9)  # next turn after the previous finished


@pytest.mark.parametrize("router", ROUTERS)
def test_routers_spread_and_prefix_router_keeps_hits(router):
    tr = load_trace("synthetic", limit=1500)
    r = simulate_serving(tr, deployment_config(MODEL, "H100", tr, replicas=4, router=router, closed_loop=False),
                         STEP)
    s = r.summary()
    assert s["completed"] == len(tr)
    assert s["token_hit_rate"] > 0


def test_prefix_router_beats_round_robin_on_hits():
    tr = load_trace("synthetic", limit=1500)
    hit = {k: simulate_serving(tr, deployment_config(MODEL, "H100", tr, replicas=4, router=k, closed_loop=False), STEP)
           .summary()["token_hit_rate"] for k in ("round_robin", "prefix")}
    assert hit["prefix"] > hit["round_robin"]


def test_goodput_under_slo():
    tr = load_trace("synthetic", limit=500)
    cfg = deployment_config(MODEL, "H100", tr)
    loose = simulate_serving(tr, cfg, STEP, slo=dict(ttft_s=1e6, tpot_s=1e6)).summary()
    tight = simulate_serving(tr, cfg, STEP, slo=dict(ttft_s=1e-6)).summary()
    assert loose["goodput_requests_per_s"] == pytest.approx(loose["throughput_requests_per_s"])
    assert tight["goodput_requests_per_s"] == 0.0


def test_bad_inputs():
    tr = plain([0.0], 10, 1)
    with pytest.raises(ParameterError):
        ServeConfig(replicas=0)
    with pytest.raises(ParameterError):
        ServeConfig(router="random")
    with pytest.raises(ParameterError):
        simulate_serving("trace")
    with pytest.raises(ParameterError):
        simulate_serving(tr, step_model=object())
    with pytest.raises(ParameterError, match="session ids"):
        simulate_serving(tr, ServeConfig(closed_loop=True), STEP)
    with pytest.raises(ParameterError, match="slo takes"):
        simulate_serving(tr, step_model=STEP, slo=dict(latency=1.0))
    with pytest.raises(ParameterError, match="give a step_model"):  # a bare config names no deployment to price
        simulate_serving(tr)


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_json(capsys):
    rc, out, err = run_cli(capsys, "serve-sim", "synthetic", "--model", MODEL, "--gpu", "H100", "--replicas", "2",
                           "--router", "prefix", "--dram-gb", "50", "--limit", "400", "--json")
    assert rc == 0, err
    d = json.loads(out)
    for k in ("requests", "completed", "rejected", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
              "throughput_tokens_per_s", "token_hit_rate"):
        assert k in d
    assert d["requests"] == 400 and d["completed"] + d["rejected"] == 400


def test_cli_text(capsys):
    rc, out, _ = run_cli(capsys, "serve-sim", "synthetic", "--model", MODEL, "--gpu", "H100", "--tp", "2",
                         "--limit", "100")
    assert rc == 0 and "TTFT p50" in out


@pytest.mark.parametrize("argv", [
    ["--replicas", "0"], ["--gpu", "NOPE"], ["--model", "no-such-model"], ["--router", "random"],
    ["--limit", "0"], ["--ttl-s", "0"], ["--policy", "belady"], ["--tp", "x"],
])
def test_cli_bad_input_one_line_exit_2(capsys, argv):
    base = {"--model": MODEL, "--gpu": "H100"}
    args = ["serve-sim", "synthetic"]
    over = dict(zip(argv[::2], argv[1::2]))
    for k, v in {**base, **over}.items():
        args += [k, v]
    args += ["--limit", "50"] if "--limit" not in over else []
    rc, out, err = run_cli(capsys, *args)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("kvlab: error:")


def test_cli_missing_trace(capsys):
    rc, _, err = run_cli(capsys, "serve-sim", "/nonexistent/trace.jsonl", "--model", MODEL, "--gpu", "H100")
    assert rc == 2 and len(err.strip().splitlines()) == 1


def test_step_time_sources_drive_the_simulator():
    """Every kvlab.serving.steptime source is a StepModel: the roofline prices the simulator's steps, and one
    request on an idle replica gets its prefill step's time as TTFT."""
    from kvlab.serving.steptime import step_time
    from kvlab.serving.steptime.base import Chunk, Step
    src = step_time("qwen3-8b", "h200", "vllm", source="roofline")
    assert isinstance(src, StepModel)
    assert src.step_s([(512, 256)], [1000, 0]) == pytest.approx(
        src.step_ms(Step((Chunk(512, 256),), (1000, 1))) / 1e3, rel=1e-12)
    r = simulate_serving(plain([1.0], 1500, 4), ServeConfig(), src)
    assert r.ttft_s[0] == pytest.approx(src.step_s([(1500, 0)], []), rel=1e-12)
    busy = simulate_serving(plain(poisson(40, 5.0), 800, 16), ServeConfig(), src)
    assert busy.summary()["completed"] == 40


# --- one answer per question: serve-sim prices steps as plan does, and says how -----------------------------------
def _json(capsys, *argv):
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0, err
    return json.loads(out)


def test_serve_sim_and_plan_give_one_answer(capsys):
    """By default serve-sim and plan price a deployment the same way (auto), so the same deployment gets the same
    TPOT from both; serve-sim no longer falls back on the affine Qwen3-8B / H200 fit."""
    common = ["synthetic", "--model", "qwen3-8b", "--gpu", "MI300X", "--limit", "150", "--open-loop"]
    p = _json(capsys, "plan", *common, "--slo", "ttft_p99=5,tpot_p99=0.5", "--tp", "1", "--no-steady", "--json")
    s = _json(capsys, "serve-sim", *common, "--replicas", str(p["replicas"]), "--json")
    assert p["meets"] and s["step_time"] == p["step_time"] and s["step_time"]["source"] == "roofline"
    for k in ("tpot_p99_s", "ttft_p99_s", "throughput_tokens_per_s"):
        assert s[k] == p["metrics"][k], k
    roofline = _json(capsys, "serve-sim", *common, "--replicas", str(p["replicas"]), "--step-time", "roofline",
                     "--json")
    assert roofline["tpot_p50_s"] == s["tpot_p50_s"]  # auto chose the roofline here (no aiconfigurator data)


@pytest.mark.slow
def test_llama_70b_tp4_is_not_priced_by_the_qwen3_fit(capsys):
    """Llama-3.1-70B at TP 4 on H100: the default is auto (aiconfigurator's data there, else the roofline), equal to
    asking for auto, and the affine Qwen3-8B / H200 fit is refused for it unless its coefficients are given."""
    common = ["synthetic", "--model", "llama-3.1-70b", "--gpu", "H100", "--tp", "4", "--limit", "60"]
    d = _json(capsys, "serve-sim", *common, "--json")
    auto = _json(capsys, "serve-sim", *common, "--step-time", "auto", "--json")
    assert d["step_time"]["source"] in ("aiconfigurator", "roofline") and d["tpot_p50_s"] == auto["tpot_p50_s"]
    basis = d["step_time"]["basis"].lower()
    assert "llama-3.1-70b" in basis and "h100" in basis and "tp 4" in basis
    rc, _, err = run_cli(capsys, "serve-sim", *common, "--step-time", "affine")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "Qwen3-8B / H200" in err and "llama-3.1-70b on H100, vllm, TP 4" in err and "--overhead-ms" in err
    given = _json(capsys, "serve-sim", *common, "--step-time", "affine", "--overhead-ms", "6", "--prefill-token-us",
                  "80", "--decode-request-us", "300", "--context-token-ns", "60", "--json")
    assert given["step_time"]["source"] == "affine" and "given on the command line" in given["step_time"]["basis"]


def test_affine_fit_prices_only_its_own_deployment():
    tr = load_trace("synthetic", limit=30)
    fit = AffineStepModel.fitted()
    assert simulate_serving(tr, deployment_config("qwen3-8b", "H200", tr), fit).summary()["completed"] == 30
    for other in (dict(model="llama-3.1-70b", gpu="H100", tp=4), dict(model="qwen3-8b", gpu="H100"),
                  dict(model="qwen3-8b", gpu="H200", tp=2), dict(model="qwen3-8b", gpu="H200", kv_format="fp8_e4m3")):
        cfg = deployment_config(other.pop("model"), other.pop("gpu"), tr, **other)
        with pytest.raises(ParameterError, match="affine step model's coefficients are an affine fit"):
            simulate_serving(tr, cfg, fit)
    from kvlab.serving.steptime import step_time
    with pytest.raises(ParameterError, match="step times priced for qwen3-8b on H200"):
        simulate_serving(tr, deployment_config("llama-3.1-8b", "H200", tr), step_time("qwen3-8b", "H200", "vllm",
                                                                                      source="roofline"))
    r = simulate_serving(tr, deployment_config("qwen3-8b", "MI300X", tr))  # none given: auto for the deployment
    assert r.step_time["source"] == "roofline" and r.summary()["step_time"] == r.step_time


@pytest.mark.parametrize("extra, words", [
    (["--overhead-ms", "5"], ["--overhead-ms", "add --step-time affine"]),
    (["--step-time", "affine", "--overhead-ms", "5"], ["all four", "--prefill-token-us"]),
    (["--load", "0"], ["--load"]), (["--load", "-2"], ["--load"]), (["--load", "nan"], ["--load"]),
    (["--load", "inf"], ["--load"]), (["--sessions", "0"], ["--sessions"]),
    (["--human-pause-s", "-1"], ["--human-pause-s"]), (["--sessions", "1000000"], ["--sessions", "at most 100,000"]),
    (["--load", "1000"], ["200,000 sessions", "at most 100,000"]),
    (["--gpu", "H20"], ["did you mean H200"]), (["--gpu-memory", "-1"], ["--gpu-memory"]),
])
@pytest.mark.parametrize("command", ["serve-sim", "plan"])
def test_new_flags_refuse_nonsense(capsys, command, extra, words):
    args = [command, "synthetic", "--model", "qwen3-8b", "--gpu", "H200"] + ([] if "--load" in extra else
                                                                             ["--limit", "20"])
    args += ["--slo", "ttft_p99=2"] if command == "plan" else []
    over = dict(zip(extra[::2], extra[1::2]))
    if "--gpu" in over:
        args[args.index("--gpu") + 1] = over.pop("--gpu")
    for k, v in over.items():
        args += [k, v]
    rc, _, err = run_cli(capsys, *args)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith("kvlab: error:"), err
    for w in words:
        assert w in err, (w, err)


def test_workload_flags_are_for_the_synthetic_workload(tmp_path, capsys):
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    rc, _, err = run_cli(capsys, "serve-sim", str(f), "--model", MODEL, "--gpu", "H100", "--sessions", "5")
    assert rc == 2 and "applies to the synthetic workload only" in err


@pytest.mark.parametrize("command", ["serve-sim", "plan"])
def test_zero_length_request_names_file_and_line(tmp_path, capsys, command):
    """A request with no prompt (or no output) is not served with a throughput: refused, naming the file and line."""
    rec = '{{"timestamp": {t}, "input_length": {n}, "output_length": {o}, "hash_ids": {h}}}\n'
    f = tmp_path / "empty.jsonl"
    f.write_text(rec.format(t=0, n=600, o=4, h="[1, 2]") + "\n" + rec.format(t=5, n=0, o=4, h="[]")
                 + rec.format(t=9, n=0, o=4, h="[]"))
    args = [command, str(f), "--model", MODEL, "--gpu", "H100", "--step-time", "roofline"]
    rc, out, err = run_cli(capsys, *args, *(["--slo", "ttft_p99=2"] if command == "plan" else []))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{f}: line 3: request 2 has 0 input and 4 output tokens (2 such requests)" in err
    c = tmp_path / "empty.csv"
    c.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,0\n")
    rc, _, err = run_cli(capsys, "serve-sim", str(c), "--model", MODEL, "--gpu", "H100", "--step-time", "roofline")
    assert rc == 2 and f"{c}: line 3: request 2 has 396 input and 0 output tokens" in err


def test_load_scales_the_trace_as_notebook_09_does(capsys):
    """--load 4 on the synthetic workload is four times the users, arriving four times as fast (study.synthetic_at);
    on a recorded trace it replays the same requests four times faster (study.scaled)."""
    from kvlab.serving.study import synthetic_at
    d = _json(capsys, "serve-sim", "synthetic", "--model", "qwen3-8b", "--gpu", "MI300X", "--sessions", "5",
              "--human-pause-s", "10", "--load", "4", "--json")
    assert d["requests"] == len(synthetic_at(4, 5, 0, human_pause_median_s=10.0)) and d["load"] == 4
    one = _json(capsys, "serve-sim", "synthetic", "--model", "qwen3-8b", "--gpu", "MI300X", "--sessions", "5",
                "--human-pause-s", "10", "--json")
    assert one["requests"] < d["requests"]


def test_text_output_names_step_times_and_memory(capsys):
    rc, out, _ = run_cli(capsys, "serve-sim", "synthetic", "--model", "qwen3-8b", "--gpu", "MI300X", "--limit", "20")
    assert rc == 0
    assert "  step times: roofline (an estimate: kvlab's weight, KV and FLOP counts for qwen3-8b on MI300X" in out
    assert "; not aiconfigurator: " in out and "  MI300X: 192 GB from the datasheet" in out


def test_pipeline_stages_are_not_priced_silently(capsys):
    """No step-time source models pipeline stages: a PP 2 deployment is refused unless its coefficients are given."""
    rc, _, err = run_cli(capsys, "serve-sim", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--pp", "2",
                         "--limit", "20", "--step-time", "roofline")
    assert rc == 2 and "price one pipeline stage (PP 1)" in err and len(err.strip().splitlines()) == 1
    d = _json(capsys, "serve-sim", "synthetic", "--model", "qwen3-8b", "--gpu", "H200", "--pp", "2", "--limit", "20",
              "--step-time", "affine", "--overhead-ms", "5", "--prefill-token-us", "20", "--decode-request-us", "100",
              "--context-token-ns", "20", "--json")
    assert d["completed"] == 20 and d["step_time"]["source"] == "affine"


@pytest.mark.parametrize("command", ["serve-sim", "simulate"])
def test_trace_hashed_in_another_block_size(tmp_path, capsys, command):
    """A Mooncake-format trace made elsewhere with 64-token hash blocks: read with --block-tokens 64 its shared
    prefix is found (the same hits as the API's reading), refused without it, naming the option."""
    rec = '{{"timestamp": {t}, "input_length": {n}, "output_length": 4, "hash_ids": {h}}}\n'
    f = tmp_path / "b64.jsonl"
    f.write_text(rec.format(t=0, n=200, h="[1, 2, 3, 4]") + rec.format(t=1000, n=150, h="[1, 2, 5]"))
    argv = ([command, str(f), "--model", MODEL, "--gpu", "H100", "--step-time", "unit", "--json"]
            if command == "serve-sim" else [command, "--trace", str(f), "--model", MODEL, "--hbm-gb", "1", "--json"])
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2 and "--block-tokens" in err
    rc, out, err = run_cli(capsys, *argv, "--block-tokens", "64")
    assert rc == 0, err
    tr = read_mooncake(f, block_tokens=64)
    assert tr.block_tokens == 64
    if command == "serve-sim":  # the second request shares two 64-token blocks: 8 KV blocks of 16
        r = simulate_serving(tr, deployment_config(MODEL, "H100", tr), AffineStepModel(1.0, 0.0, 0.0, 0.0))
        assert r.prefix_hit_tokens.tolist() == [0, 128]
        assert json.loads(out)["token_hit_rate"] == pytest.approx(128 / 350)
    else:
        assert json.loads(out)["token_hit_rate"] > 0


@pytest.mark.parametrize("command", ["serve-sim", "plan"])
def test_weight_gb_for_a_model_without_an_estimate(capsys, command):
    """A model kvlab has no weight estimate for (gemma-3-27b's config, no parameter count on file) is refused in
    one line naming --weight-gb, and runs with it; the weights given size the pool (more weights, fewer blocks)."""
    base = [command, "synthetic", "--model", "gemma-3-27b", "--gpu", "H200", "--limit", "40", "--json",
            "--step-time", "roofline"] + (["--slo", "ttft_p99=30"] if command == "plan" else [])
    rc, _, err = run_cli(capsys, *base)
    assert rc == 2 and "--weight-gb" in err and len(err.strip().splitlines()) == 1
    rc, out, err = run_cli(capsys, *base, "--weight-gb", "54.9")
    assert rc in (0, 1), err
    if command == "serve-sim":
        d = json.loads(out)
        assert d["completed"] == 40
        tr = load_trace("synthetic", limit=40)
        small, big = (deployment_config("gemma-3-27b", "H200", tr, weights=int(g * 1e9)) for g in (54.9, 80.0))
        assert small.pool_tokens > big.pool_tokens > 0


def test_window_only_model_refused_and_hybrid_pool_says_what_it_leaves_out(tmp_path, capsys):
    """A config whose every layer slides over a window (Mistral-7B-v0.1's layout) has no growing KV for the
    scheduler to page: one line, exit 2 (it divided by zero before). A hybrid (gemma-3-27b: sliding and full layers)
    runs, its note saying the windows are outside the pool; a full-attention model has no such note."""
    cfg = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 128, "sliding_window": 4096, "max_position_embeddings": 32768, "vocab_size": 32000,
           "torch_dtype": "bfloat16"}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    rc, out, err = run_cli(capsys, "serve-sim", "synthetic", "--model", str(f), "--gpu", "H100", "--weight-gb", "14.5",
                           "--limit", "20")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "no KV grows with the context" in err and "kvlab sessions" in err
    tr = load_trace("synthetic", limit=20)
    hybrid = deployment_config("gemma-3-27b", "H200", tr, weights=int(54.9e9))
    assert "sliding windows and fixed states is left out of it" in hybrid.layout_note
    assert "left out" not in deployment_config(MODEL, "H100", tr).layout_note


def test_the_pool_says_how_it_was_budgeted(capsys):
    """No silent default behind the pool: the memory rule with its numbers and where the weights came from (the
    estimate's source, or given), or that the pool was given; plan gives it per TP searched."""
    base = ["serve-sim", "synthetic", "--model", MODEL, "--gpu", "H100", "--limit", "20", "--json"]
    notes = {}
    for label, extra in (("estimate", []), ("given", ["--weight-gb", "30"]), ("pool", ["--num-blocks", "400"])):
        rc, out, err = run_cli(capsys, *base, *extra)
        assert rc == 0, err
        notes[label] = json.loads(out)["pool_note"]
    assert "vllm's rule" in notes["estimate"] and "weights estimated" in notes["estimate"] and "model card" in notes[
        "estimate"]
    assert "30,000,000,000 B weights" in notes["given"] and notes["given"].endswith("weights given")
    assert notes["pool"].startswith("KV pool given")
    rc, out, err = run_cli(capsys, "plan", "synthetic", "--model", MODEL, "--gpu", "H100", "--limit", "20", "--json",
                           "--slo", "ttft_p99=30", "--no-steady")
    assert rc == 0, err
    assert "vllm's rule" in json.loads(out)["pool_notes"]["TP1"]
