import json
import subprocess
import sys

import pytest

from kvlab.cli import main


def run(*args):
    p = subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("model,expected", [("qwen3-8b", 147456), ("deepseek-v4.1-flash", 890)])
def test_bytes_json(model, expected):
    rc, out, err = run("bytes", model, "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["bytes_per_token"] == expected
    for k in ("model", "bytes_per_token", "bounded_bytes", "tokens", "session_bytes"):
        assert k in d


def test_v41_session(capsys):
    assert main(["bytes", "deepseek-v4.1-flash", "--tokens", "1000000", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["growing_bytes"] == 890_000_000 and d["session_bytes"] == 890_000_000 + d["session_bounded_bytes"]


def test_vllm_layout_and_explain(capsys):
    assert main(["bytes", "deepseek-v4-flash", "--layout", "vllm", "--explain", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bytes_per_token"] == 3915 and d["exact_bytes_per_token"] == 3850.25
    assert any("576" in line for line in d["explanation"])


def test_kv_format(capsys):
    assert main(["bytes", "qwen3-8b", "--kv-format", "nvfp4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_per_token"] == 41472


def test_models_lists_catalog():
    rc, out, _ = run("models")
    assert rc == 0 and "qwen3-8b" in out and "147,456" in out


@pytest.mark.parametrize("args,needle", [
    (["bytes", "nosuchmodel"], "unknown model"),
    (["bytes", "qwen3-8b", "--kv-format", "fp5"], "unknown number format"),
    (["bytes", "qwen3-8b", "--tokens", "-3"], "non-negative integer"),
    (["bytes", "qwen3-8b", "--tokens", "1.5"], "non-negative integer"),
    (["bytes", "qwen3-8b", "--layout", "sglang"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_one_line_exit_2(args, needle):
    rc, out, err = run(*args)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_bad_config_file(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"num_hidden_layers": 2, "model_type": "mystery"}))
    rc, _, err = run("bytes", str(p))
    assert rc == 2 and "unknown architecture" in err and len(err.strip().splitlines()) == 1


def test_claims_command(capsys):
    assert main(["claims", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["id"]: r for r in rows}["v41_1m_session"]["computed"] == 890_000_000


def test_run_command(tmp_path):
    rc, out, err = run("run", "01", "-p", "context_tokens", "4096", "-p", "compare_formats", "['nvfp4']",
                       "--out", str(tmp_path))
    assert rc == 0, err
    d = json.loads((tmp_path / "latest" / "results.json").read_text())
    assert d["notebooks"]["01_kv_bytes_per_token"]["results"]["session_bytes"] == 4096 * 147456
    assert "bytes_per_token" in out and "147,456" in out


def test_run_command_bad_parameter(tmp_path):
    rc, _, err = run("run", "01", "-p", "no_such_parameter", "1", "--out", str(tmp_path))
    assert rc == 2 and "not declared" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run("run", "99", "--out", str(tmp_path))
    assert rc == 2 and "no single notebook" in err
