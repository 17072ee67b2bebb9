"""`kvlab measure`: JSON fields, the 890,000,000-byte growth of V4.1-Flash at 1M tokens, bad input."""
import json

import pytest

from kvlab.cli import main


def _json(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_v41_flash_million_tokens(capsys):
    rc, d = _json(capsys, ["measure", "deepseek-v4.1-flash", "--tokens", "1000000", "--device", "cpu",
                           "--no-profile", "--json"])
    assert rc == 0
    for k in ("device", "tokens", "measured_bytes", "predicted_bytes", "difference_bytes", "method"):
        assert k in d
    assert d["device"] == "cpu" and d["method"] == "storage" and d["tokens"] == 1_000_000
    assert d["measured_growing_bytes"] == d["predicted_growing_bytes"] == 890_000_000
    assert d["measured_bytes"] == d["predicted_bytes"] and d["difference_bytes"] == 0


def test_paged_text_output(capsys):
    rc = main(["measure", "qwen3-8b", "--tokens", "17", "--layout", "vllm", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and "page rounding of 16-token pages" in out and "predicted rounding 2,211,840 B" in out


@pytest.mark.parametrize("argv,msg", [
    (["measure", "qwen3-8b", "--tokens", "10", "--device", "tpu"], "unknown device"),
    (["measure", "qwen3-8b", "--tokens", "10", "--kv-format", "fp7"], "unknown number format"),
    (["measure", "no-such-model", "--tokens", "10"], "unknown model"),
    (["measure", "llama-3.1-70b", "--tokens", "100000000", "--device", "cpu"], "available"),
    (["measure", "qwen3-8b", "--tokens", "-3"], "non-negative"),
])
def test_bad_input_exits_2(capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def test_config_path(capsys, tmp_path):
    from kvlab.models import CATALOG_DIR
    (tmp_path / "config.json").write_text((CATALOG_DIR / "qwen3-8b.json").read_text())
    rc, d = _json(capsys, ["measure", str(tmp_path), "--tokens", "33", "--layout", "bf16", "--device", "cpu",
                           "--json"])
    assert rc == 0 and d["measured_bytes"] == d["predicted_bytes"] == 147456 * 33 == d["check_bytes"]
