"""Notebook 09 through papermill with small parameters; its recorded GPU counts against direct kvlab.serving.study
runs of the same deployments, and against `kvlab plan` run with the command the notebook records."""
import json
import shlex

from kvlab.serving.plan import parse_slo
from kvlab.serving.study import Deployment, Study
from kvlab.sim.traces import load_trace
from nbutil import run_notebook


def test_small_run_matches_the_study(tmp_path, capsys):
    deps = ["qwen3-8b", "qwen3-8b:fp8_e4m3", "deepseek-v4.1-flash@tp4"]
    r = run_notebook("09", tmp_path, synthetic_sessions=6, deployments=deps, load=24.0, loads=[1, 24], knee=[0],
                     dram_gbs=[0, 64], max_replicas=16)
    syn = dict(sessions=6, seed=0, human_pause_median_s=10.0)
    st = Study(load_trace("synthetic", **syn), "H200", synthetic=syn)
    slo = parse_slo("ttft_p99=2,tpot_p99=0.05")
    want = {Deployment.parse(d).label: st.fewest(Deployment.parse(d), slo, 24.0, max_replicas=16).gpus for d in deps}
    assert r["gpus_needed"] == want
    assert r["gpus_needed"]["deepseek-v4.1-flash own format TP4"] % 4 == 0  # whole TP4 replicas
    assert r["trace_requests"] == len(st.trace) and r["requests_at_load"] == len(st.trace_at(24.0))
    assert all(r["smaller_format_no_more_gpus"].values())
    assert set(r["tier_hit_rate"]) == {"0", "64"} and r["tier_hit_rate"]["64"] >= r["tier_hit_rate"]["0"]
    assert set(r["knee_ttft_p99_s"]) == {"qwen3-8b own format|1", "qwen3-8b own format|24"}
    # aiconfigurator's steady answer: for the deployment it covers (BF16 KV) where it is installed, none otherwise
    from kvlab.serving import steady
    aic = r["aiconfigurator_gpus"]
    assert aic["qwen3-8b fp8_e4m3"] is None and aic["deepseek-v4.1-flash own format TP4"] is None
    assert (aic["qwen3-8b own format"] or 0) >= 1 if steady.available() else aic["qwen3-8b own format"] is None
    # the shell gives the notebook's answer with the command it records
    from kvlab.cli import main
    cmd = shlex.split(r["plan_commands"]["qwen3-8b own format"])
    assert cmd[:2] == ["kvlab", "plan"] and "--load" in cmd and cmd[cmd.index("--load") + 1] == "24"
    assert main(cmd[1:] + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == r["gpus_needed"]["qwen3-8b own format"] and out["step_time"]["source"] == "roofline"
