"""Bad input to the trace, simulation, analysis, sweep and run commands, through `kvlab.cli.main` (issue 33).

Every case is data: files written fresh under tmp_path, then one command line. Each must exit 2 with exactly one
stderr line `kvlab: error: ...` holding the words listed (the file, the line, the field, the option), raise nothing
(no traceback), and leave the folder as it was: no file written, none changed, none left behind (a `.part`, an
empty run folder). The rules behind them: the trace readers are the one gate every command's trace passes
(zero-length requests and backward arrivals refused with file and line), a catalog trace is read only from a copy
that matches its checksum, options that would change nothing are refused, and every path is checked before work.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.sim import catalog
from nbutil import tiny_notebook

REC = {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [7, 8]}
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
T0 = "2023-11-16 18:17:03.9799600"
T1 = "2023-11-16 18:17:04.0319600"


def jl(*records) -> str:
    return "".join((r if isinstance(r, str) else json.dumps({**REC, **r})) + "\n" for r in records)


GOOD_JSONL = jl({}, {"timestamp": 500, "hash_ids": [7, 9]})
TINY = GOOD_JSONL.encode()  # the catalog entry "tiny" the tests add: its published bytes
FILES = {  # name -> text (bytes as they are); None: a folder
    "good.jsonl": GOOD_JSONL,
    "zero_in.jsonl": jl({}, {"timestamp": 5, "input_length": 0, "hash_ids": []}),
    "zero_out.jsonl": jl({"output_length": 0}),
    "zero_twice.jsonl": jl({}, {"timestamp": 5, "input_length": 0, "hash_ids": []},
                           {"timestamp": 6, "output_length": 0}),
    "back.jsonl": jl({"timestamp": 900}, {"timestamp": 100}),
    "nofield.jsonl": jl({}, '{"timestamp": 1, "input_length": 10, "hash_ids": [1]}'),
    "strlen.jsonl": jl({}, {"input_length": "1000"}),
    "floatlen.jsonl": jl({"output_length": 2.5}),
    "boollen.jsonl": jl({"output_length": True}),
    "negtime.jsonl": jl({"timestamp": -1}),
    "nantime.jsonl": jl({}, '{"timestamp": NaN, "input_length": 10, "output_length": 1, "hash_ids": [1]}'),
    "hashcount.jsonl": jl({"input_length": 2000}),
    "hashneg.jsonl": jl({"hash_ids": [7, -8]}),
    "deep.jsonl": "[" * 100_000 + "]" * 100_000 + "\n",
    "digits.jsonl": '{"timestamp": 0, "input_length": ' + "9" * 5000 + ', "output_length": 1, "hash_ids": []}\n',
    "array.jsonl": "[1, 2, 3]\n",
    "notjson.jsonl": jl({}) + "{oops\n",
    "latin1.jsonl": jl({}).encode() + b'{"timestamp": 1, "x": "\xe9"}\n',
    "empty.jsonl": "",
    "blank.jsonl": "\n\n  \n",
    "good.csv": f"{AZ}{T0},100,10\n{T1},200,20\n",
    "az_back.csv": f"{AZ}{T1},100,10\n{T0},100,10\n",
    "az_zero_in.csv": f"{AZ}{T0},100,10\n{T1},0,10\n",
    "az_zero_out.csv": f"{AZ}{T0},100,0\n",
    "az_underscore.csv": f"{AZ}{T0},1_000,10\n",
    "az_sign.csv": f"{AZ}{T0},+100,10\n",
    "az_float.csv": f"{AZ}{T0},100.0,10\n",
    "az_time.csv": f"{AZ}yesterday,100,10\n",
    "az_date_only.csv": f"{AZ}2023-11-16,100,10\n",
    "az_fields.csv": f"{AZ}{T0},100,10,7\n",
    "az_header.csv": "time,ctx,gen\n" + f"{T0},100,10\n",
    "az_bigfield.csv": f"{AZ}{T0},100,{'9' * 200_000}\n",
    "az_huge.csv": f"{AZ}{T0},{'9' * 60},10\n",
    "afile.txt": "not a folder\n",
    "tiny.ipynb": None,  # made by the fixture (a notebook declaring x)
    "grid.json": json.dumps({"x": [1, 2]}),
    "grid01.json": json.dumps({"model": ["qwen3-8b"], "context_tokens": [1000, 0]}),
    "biggrid.json": json.dumps({"x": list(range(101)), "y": list(range(100))}),
    "bomb.yaml": "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(  # a billion laughs: 10**8 items from 8 lines
        f"{c}: &{c} [{', '.join([f'*{b}'] * 10)}]\n" for b, c in zip("abcdefg", "bcdefgh")),
    "huge.json": json.dumps({"x": ["y" * 100] * 20_000}),
    "adir": None,
}
SWEEPS = {  # a sweep folder's sweep.json, as text
    "not_json": "{oops",
    "a_list": "[1, 2]",
    "no_notebook": json.dumps({"grid": {"x": [1]}, "points": []}),
    "other_notebook": json.dumps({"notebook": "01_kv_bytes_per_token", "grid": {"x": [1]}, "points": []}),
    "grid_list": json.dumps({"notebook": "tiny", "grid": [1, 2], "points": []}),
    "grid_empty_values": json.dumps({"notebook": "tiny", "grid": {"x": []}, "points": []}),
    "grid_bad_name": json.dumps({"notebook": "tiny", "grid": {"not a name": [1]}, "points": []}),
    "no_points": json.dumps({"notebook": "tiny", "grid": {"x": [1]}}),
    "undeclared": json.dumps({"notebook": "tiny", "grid": {"y": [1]}, "points": []}),
    "points_escape": json.dumps({"notebook": "tiny", "grid": {"x": [1]}, "points": [{"folder": "../x", "params": {}}]}),
    "binary": b"\xff\xfe\x00\x01",
}


@pytest.fixture
def d(tmp_path, monkeypatch):
    """The case folder (also the working folder): trace files, a notebook, grids, sweep folders; an empty data folder
    and a mirror holding the catalog entry "tiny"; no network."""
    for name, text in FILES.items():
        p = tmp_path / name
        if name == "tiny.ipynb":
            tiny_notebook(p, "print(x)")
        elif text is None:
            p.mkdir()
        else:
            p.write_bytes(text if isinstance(text, bytes) else text.encode())
    for name, text in SWEEPS.items():
        (tmp_path / "sweeps" / name).mkdir(parents=True)
        (tmp_path / "sweeps" / name / "sweep.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    (tmp_path / "sweeps" / "none").mkdir()
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "tiny_trace.jsonl").write_bytes(TINY)
    blob = hashlib.sha1(f"blob {len(TINY)}\0".encode() + TINY).hexdigest()
    entry = catalog.PublicTrace("tiny", "tiny_trace.jsonl", "https://example.invalid/tiny_trace.jsonl", "CC0", "tests",
                                "two requests", hashlib.sha256(TINY).hexdigest(), blob, len(TINY))
    monkeypatch.setitem(catalog.CATALOG, "tiny", entry)
    monkeypatch.setattr(catalog, "MIRROR_DIR", tmp_path / "no-mirror")
    monkeypatch.setenv("KVLAB_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("KVLAB_TRACE_MIRROR", str(mirror))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def snapshot(root: Path) -> dict:
    """Every path under root with its bytes' digest (None for a folder)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs:
            out[os.path.join(dirpath, n)] = None
        for n in files:
            p = os.path.join(dirpath, n)
            out[p] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


def refused(argv, d, capsys, words) -> str:
    """`kvlab argv` exits 2 with one line holding every word, and the case folder is as it was."""
    argv = [a.replace("{d}", str(d)) if isinstance(a, str) else a for a in argv]
    before = snapshot(d)
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, f"exit {rc}; stderr {err[:500]!r}"
    assert len(lines) == 1 and lines[0].startswith("kvlab: error: ") and "Traceback" not in err, err[:2000]
    for w in words:
        assert w.replace("{d}", str(d)) in lines[0], f"{w!r} not in {lines[0][:600]!r}"
    assert snapshot(d) == before, "the command wrote, changed or left a file"
    return lines[0]


SIM = ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--no-progress", "--trace"]
SERVE = ["--model", "qwen3-8b", "--gpu", "H100"]

# --- the trace readers: the file, the line and the field, whatever command reads the trace -----------------------
READERS = [
    ("zero input", "zero_in.jsonl", ["zero_in.jsonl: line 2: request 2 has 0 input and 10 output tokens: field "
                                     "'input_length' must be at least 1", "zero-length"]),
    ("zero output", "zero_out.jsonl", ["zero_out.jsonl: line 1: request 1 has 1,000 input and 0 output tokens",
                                       "field 'output_length' must be at least 1"]),
    ("zero twice", "zero_twice.jsonl", ["line 2: request 2 has 0 input and 10 output tokens (2 such requests)"]),
    ("time backwards", "back.jsonl", ["back.jsonl: line 2: field 'timestamp': goes backwards"]),
    ("missing field", "nofield.jsonl", ["line 2: field 'output_length': missing"]),
    ("length as text", "strlen.jsonl", ["line 2: field 'input_length'", "'1000'"]),
    ("fractional length", "floatlen.jsonl", ["line 1: field 'output_length'", "2.5"]),
    ("length as a bool", "boollen.jsonl", ["line 1: field 'output_length'", "True"]),
    ("negative time", "negtime.jsonl", ["line 1: field 'timestamp'"]),
    ("NaN time", "nantime.jsonl", ["line 2: field 'timestamp'", "nan"]),
    ("hash count", "hashcount.jsonl", ["line 1: field 'hash_ids': 2 ids for 2000 input tokens"]),
    ("negative hash", "hashneg.jsonl", ["line 1: field 'hash_ids'"]),
    ("JSON nested too deep", "deep.jsonl", ["deep.jsonl: line 1: not a usable JSON record"]),
    ("integer of 5,000 digits", "digits.jsonl", ["digits.jsonl: line 1: not a usable JSON record"]),
    ("a record not an object", "array.jsonl", ["line 1: a record must be a JSON object"]),
    ("not JSON", "notjson.jsonl", ["notjson.jsonl: line 2: not valid JSON"]),
    ("not UTF-8", "latin1.jsonl", ["latin1.jsonl: line 2: not UTF-8 text (byte 0xe9"]),
    ("empty file", "empty.jsonl", ["empty.jsonl: no records"]),
    ("blank lines only", "blank.jsonl", ["blank.jsonl: no records"]),
    ("Azure time backwards", "az_back.csv", ["az_back.csv: line 3: field 'TIMESTAMP': goes backwards"]),
    ("Azure zero context", "az_zero_in.csv", ["az_zero_in.csv: line 3: request 2 has 0 input and 10 output tokens",
                                              "field 'ContextTokens' must be at least 1"]),
    ("Azure zero output", "az_zero_out.csv", ["az_zero_out.csv: line 2: request 1 has 100 input and 0 output",
                                              "field 'GeneratedTokens' must be at least 1"]),
    ("Azure 1_000", "az_underscore.csv", ["line 2: field 'ContextTokens': not a whole number of tokens: '1_000'"]),
    ("Azure +100", "az_sign.csv", ["line 2: field 'ContextTokens'", "'+100'"]),
    ("Azure 100.0", "az_float.csv", ["line 2: field 'ContextTokens'", "'100.0'"]),
    ("Azure not a time", "az_time.csv", ["az_time.csv: line 2: field 'TIMESTAMP': not a date-time"]),
    ("Azure date without time", "az_date_only.csv", ["line 2: field 'TIMESTAMP'"]),
    ("Azure extra column", "az_fields.csv", ["az_fields.csv: line 2: expected 3 fields", "got 4"]),
    ("Azure header", "az_header.csv", ["az_header.csv: line 1: header must be TIMESTAMP,ContextTokens"]),
    ("Azure field over csv's limit", "az_bigfield.csv", ["az_bigfield.csv: line 2: not a CSV record"]),
    ("Azure 60 digits", "az_huge.csv", ["line 2: field 'ContextTokens': must be an integer in [1,"]),
]
COMMANDS = {  # every command that reads a trace, as argv around it
    "simulate": lambda f: SIM + [f],
    "analyze": lambda f: ["analyze", f],
    "serve-sim": lambda f: ["serve-sim", f] + SERVE,
    "plan": lambda f: ["plan", f] + SERVE + ["--slo", "ttft_p99=2"],
}


@pytest.mark.parametrize("desc, name, words", READERS, ids=[c[0] for c in READERS])
def test_trace_readers_name_the_file_line_and_field(desc, name, words, d, capsys):
    refused(["analyze", f"{{d}}/{name}"], d, capsys, words)


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("name, words", [("zero_in.jsonl", ["line 2: request 2 has 0 input", "'input_length'"]),
                                         ("az_zero_out.csv", ["line 2: request 1 has 100 input and 0 output tokens"]),
                                         ("az_back.csv", ["line 3: field 'TIMESTAMP': goes backwards"])])
def test_every_command_sees_the_same_rule(command, name, words, d, capsys):
    # one rule in one place: simulate, analyze, serve-sim and plan refuse the same request with the same words
    refused(COMMANDS[command](f"{{d}}/{name}"), d, capsys, words)


def test_azure_times_are_read_as_utc_and_exactly(d):
    from kvlab.sim.traces import read_azure
    (d / "tz.csv").write_text(f"{AZ}2023-03-26 00:59:59.5,1,1\n2023-03-26 01:00:00.0000001,1,1\n"
                              "2023-03-26T01:00:01Z,1,1\n2023-03-26 02:00:01+01:00,1,1\n")
    t = read_azure(d / "tz.csv")
    assert t.timestamps.tolist() == [0.0, 0.5000001, 1.5, 1.5]  # UTC whatever the machine's zone, to the 7th digit
    (d / "bom.csv").write_bytes(b"\xef\xbb\xbf" + FILES["good.csv"].encode())  # a spreadsheet's byte-order mark
    assert len(read_azure(d / "bom.csv")) == 2


# --- options: every one is used, or refused ----------------------------------------------------------------------
OPTIONS = [
    ("analyze --kv-format without --model", ["analyze", "synthetic", "--kv-format", "fp8_e4m3"],
     ["--kv-format needs --model"]),
    ("analyze --seed on a file", ["analyze", "{d}/good.jsonl", "--seed", "3"], ["--seed seeds the synthetic workload"]),
    ("simulate --seed on a file", SIM + ["{d}/good.jsonl", "--seed", "3"], ["--seed seeds the synthetic workload"]),
    ("analyze an Azure trace", ["analyze", "{d}/good.csv"], ["has no block ids"]),
    ("simulate an Azure trace", SIM + ["{d}/good.csv"], ["has no prefix (block hash) information"]),
    ("analyze --points 1", ["analyze", "synthetic", "--points", "1"], ["points must be an integer >= 2"]),
    ("analyze --points 1e18", ["analyze", "synthetic", "--points", "1e18"], ["points must be an integer <= 10,000"]),
    ("analyze --target nan", ["analyze", "synthetic", "--target", "nan"], ["--target", "finite"]),
    ("analyze --block-tokens 0", ["analyze", "synthetic", "--block-tokens", "0"], ["--block-tokens must be an integer >= 1"]),
    ("analyze --block-tokens 1 (43 million accesses)", ["analyze", "synthetic", "--block-tokens", "1"],
     ["the synthetic workload would make more than 10,000,000 block accesses"]),
    ("simulate --hbm-gb 1e400", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1e400"], ["--hbm-gb", "finite"]),
    ("simulate --hbm-gb -1", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "-1"], ["--hbm-gb must lie in"]),
    ("simulate --dram-gb nan", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--dram-gb", "nan"],
     ["--dram-gb", "finite"]),
    ("simulate --ssd-gb 1e11", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--ssd-gb", "1e11"],
     ["ssd_gb must lie in [0, 1e+09]"]),
    ("simulate --prefill-tps inf", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--prefill-tps", "inf"],
     ["--prefill-tps", "finite"]),
    ("simulate --ttl-s -1", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--ttl-s", "-1"], ["--ttl-s"]),
    ("simulate --gpu unknown", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--gpu", "H9000"], ["'H9000'"]),
    ("simulate --kv-format unknown", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--kv-format", "fp5"],
     ["'fp5'"]),
    ("simulate --model unknown", ["simulate", "--model", "gpt-7", "--hbm-gb", "1"], ["'gpt-7'"]),
    ("simulate --limit 0", SIM + ["synthetic", "--limit", "0"], ["limit must be an integer >= 1"]),
    ("simulate --ttl-s without DRAM", SIM + ["synthetic", "--ttl-s", "60"],
     ["--ttl-s applies to the DRAM tier, which --dram-gb leaves at 0 GB"]),
    ("simulate --dram-policy without DRAM", SIM + ["synthetic", "--dram-policy", "sieve"],
     ["--dram-policy applies to the DRAM tier"]),
    ("simulate --ssd-admission without SSD", SIM + ["synthetic", "--dram-gb", "1", "--ssd-admission", "second"],
     ["--ssd-admission applies to the SSD tier, which --ssd-gb leaves at 0 GB"]),
    ("trace name empty", SIM + [""], ["trace name is empty"]),
    ("trace name with a NUL", SIM + ["a\0b"], ["NUL byte"]),
    ("trace name too long", SIM + ["x" * 5000], ["not a usable path"]),
    ("trace a folder", SIM + ["{d}/adir"], ["adir: is a directory, not a trace file"]),
    ("trace missing", ["analyze", "{d}/missing/none.jsonl"], ["not found: no such file, and not a catalog name"]),
    ("step-time --prefill empty", ["step-time", "qwen3-8b", "--gpu", "H200", "--engine", "vllm", "--prefill", ""],
     ["--prefill ''"]),
    ("step-time --decode empty", ["step-time", "qwen3-8b", "--gpu", "H200", "--engine", "vllm", "--decode", ""],
     ["--decode ''"]),
]


@pytest.mark.parametrize("desc, argv, words", OPTIONS, ids=[c[0] for c in OPTIONS])
def test_options_are_used_or_refused(desc, argv, words, d, capsys):
    refused(argv, d, capsys, words)


def test_a_trace_without_reuse_gets_a_clear_answer(d, capsys):
    (d / "fresh.jsonl").write_text(jl({}, {"timestamp": 1000, "hash_ids": [1, 2]}, {"timestamp": 2000,
                                                                                     "hash_ids": [3, 4]}))
    assert main(["analyze", str(d / "fresh.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "reuse: none - all 6 block accesses are first accesses" in out
    assert "capacity for a token hit rate (blocks): none to size for (the trace has no reuse" in out
    assert main(["analyze", str(d / "fresh.jsonl"), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert a["reuse"]["reuses"] == 0 and a["ceiling"]["token_hit_rate"] == 0.0 and a["targets"] == []
    # a target the user sets is reported once, unreachable by every policy
    assert main(["analyze", str(d / "fresh.jsonl"), "--json", "--target", "0.5", "--target", "0.5"]) == 0
    rows = json.loads(capsys.readouterr().out)["targets"]
    assert {r["target"] for r in rows} == {0.5} and all(r["capacity_blocks"] is None for r in rows)
    assert len(rows) == len({r["policy"] for r in rows})


# --- catalog traces: read from a verified copy only; fetch checks its paths and leaves nothing behind ------------
def _corrupt_copy(d, where):
    p = (d / "data" / "traces" if where == "data" else d / "no-mirror") / "tiny_trace.jsonl"
    p.parent.mkdir(parents=True)
    p.write_text(jl({}))  # a valid trace, but not the published file


@pytest.mark.parametrize("where", ["data", "mirror"])
@pytest.mark.parametrize("command", ["simulate", "analyze", "serve-sim"])
def test_a_copy_that_fails_its_checksum_is_refused(where, command, d, capsys):
    _corrupt_copy(d, where)
    kind = "data folder" if where == "data" else "developer mirror"
    refused(COMMANDS[command]("tiny"), d, capsys,
            [f"tiny_trace.jsonl: the {kind} copy of tiny does not match its published checksum",
             f"expected sha256 {hashlib.sha256(TINY).hexdigest()}", "kvlab traces fetch tiny --force"])


@pytest.mark.parametrize("where", ["data", "mirror", "none"])
def test_traces_list_says_where_each_trace_is_read_from(where, d, capsys):
    if where != "none":
        _corrupt_copy(d, where)
    assert main(["traces", "list"]) == 0
    text = capsys.readouterr().out
    assert main(["traces", "list", "--json"]) == 0
    row = {r["name"]: r for r in json.loads(capsys.readouterr().out)["traces"]}["tiny"]
    line = text.split("  tiny: ")[1].splitlines()[1].strip()
    if where == "none":
        assert row["read_from"] is None and line == "not available: `kvlab traces fetch tiny` downloads it"
    else:
        kind = "data folder" if where == "data" else "developer mirror"
        assert row["read_from_kind"] == kind and row["usable"] is False
        assert line.startswith(f"REFUSED: {row['read_from']} ({kind}) does not match its published checksum")
    assert main(["traces", "fetch", "tiny"]) == 0  # a verified copy in the data folder: read from there from now
    assert ("replaced a saved copy" in capsys.readouterr().out) == (where == "data")
    assert main(["traces", "list", "--json"]) == 0
    row = {r["name"]: r for r in json.loads(capsys.readouterr().out)["traces"]}["tiny"]
    assert row["usable"] and row["read_from"] == str(d / "data" / "traces" / "tiny_trace.jsonl")
    assert main(["analyze", "tiny", "--json"]) == 0 and json.loads(capsys.readouterr().out)["counts"]["requests"] == 2


FETCH = [  # (setup, words)
    ("the file's place is a folder", lambda d: (d / "data/traces/tiny_trace.jsonl").mkdir(parents=True),
     ["cannot save tiny: {d}/data/traces/tiny_trace.jsonl is a folder"]),
    ("its .part is a folder", lambda d: (d / "data/traces/tiny_trace.jsonl.part").mkdir(parents=True),
     ["cannot save tiny: {d}/data/traces/tiny_trace.jsonl.part is a folder"]),
    ("KVLAB_DATA is a file", lambda d: os.environ.__setitem__("KVLAB_DATA", str(d / "afile.txt")),
     ["the data folder (KVLAB_DATA) '{d}/afile.txt/traces' lies under '{d}/afile.txt', which is a file"]),
    ("KVLAB_DATA cannot be made", lambda d: os.environ.__setitem__("KVLAB_DATA", "/proc/kvlab-nowhere"),
     ["the data folder (KVLAB_DATA) '/proc/kvlab-nowhere/traces': cannot write in '/proc'"]),
    ("download fails", lambda d: (d / "mirror/tiny_trace.jsonl").unlink(), ["cannot download tiny from file:"]),
    ("download corrupt", lambda d: (d / "mirror/tiny_trace.jsonl").write_text("{}\n"),
     ["does not match its published checksum", "nothing was saved"]),
    ("the mirror holds a folder", lambda d: os.environ.__setitem__("KVLAB_TRACE_MIRROR", str(d)),
     ["cannot download tiny from file:", "tiny_trace.jsonl"]),
    ("a mirror URL with a control character", lambda d: os.environ.__setitem__("KVLAB_TRACE_MIRROR", "http://\x01x"),
     ["cannot download tiny from http://", "control characters"]),
]


@pytest.mark.parametrize("desc, setup, words", FETCH, ids=[c[0] for c in FETCH])
def test_fetch_checks_paths_first_and_leaves_nothing(desc, setup, words, d, capsys, monkeypatch):
    for k in ("KVLAB_DATA", "KVLAB_TRACE_MIRROR"):
        monkeypatch.setenv(k, os.environ[k])  # restored after the case
    (d / "tiny_trace.jsonl").mkdir()  # for the mirror that is the case folder: the file's name is a folder there
    setup(d)
    refused(["traces", "fetch", "tiny"], d, capsys, words)


# --- sweep and run: output folders checked before any work; a resumed sweep's record checked field by field ------
NB = "{d}/tiny.ipynb"
SWEEP = ["sweep", NB, "--grid", "{d}/grid.json", "--no-progress"]
FOLDERS = [
    ("sweep --out on a file", SWEEP + ["--out", "{d}/afile.txt"],
     ["output folder '{d}/afile.txt' is a file, not a folder; choose another --out"]),
    ("sweep --out under a file", SWEEP + ["--out", "{d}/afile.txt/runs"], ["lies under '{d}/afile.txt'"]),
    ("sweep --out unwritable", SWEEP + ["--out", "/proc/kvlab-nowhere/runs"], ["cannot write in '/proc'"]),
    ("sweep --out empty", SWEEP + ["--out", ""], ["output folder must be a path"]),
    ("sweep --out with a NUL", SWEEP + ["--out", "a\0b"], ["NUL byte"]),
    ("sweep --out too long", SWEEP + ["--out", "x" * 5000], ["not a usable path"]),
    ("sweep --resume and --out", ["sweep", NB, "--resume", "{d}/sweeps/none", "--out", "runs"],
     ["--out and --resume"]),
    ("sweep --workers and --scheduler", SWEEP + ["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"],
     ["--workers sizes a local cluster"]),
    ("sweep --workers 1e18", SWEEP + ["--workers", "1e18"], ["--workers must be at most 256"]),
    ("sweep --workers 0", SWEEP + ["--workers", "0"], ["--workers must be an integer >= 1"]),
    ("sweep --scheduler not an address", SWEEP + ["--scheduler", "nan"], ["scheduler 'nan' is not a dask address"]),
    ("sweep --scheduler empty", SWEEP + ["--scheduler", ""], ["scheduler must be an address"]),
    ("sweep --scheduler port 99999", SWEEP + ["--scheduler", "tcp://127.0.0.1:99999"], ["port lie in 1-65535"]),
    ("sweep --scheduler no host", SWEEP + ["--scheduler", "tcp://:8786"], ["the host must be named"]),
    ("sweep --scheduler ucx", SWEEP + ["--scheduler", "ucx://h:1"], ["over tcp:// or tls://, not ucx://"]),
    ("sweep grid of 10,100 points", ["sweep", NB, "--grid", "{d}/biggrid.json"],
     ["more than 10,000 points (101 x 100 so far)"]),
    ("sweep grid a folder", ["sweep", NB, "--grid", "{d}/adir"], ["grid '{d}/adir'"]),
    ("sweep grid a YAML bomb", ["sweep", NB, "--grid", "{d}/bomb.yaml"],
     ["bomb.yaml: parameter 'e': its values hold more than 100,000 items"]),
    ("sweep grid file of 2 MB", ["sweep", NB, "--grid", "{d}/huge.json"], ["a grid file holds at most 1,048,576 B"]),
    ("sweep grid empty name", ["sweep", NB, "--grid", ""], ["grid must be a path"]),
    ("sweep --resume a file", ["sweep", NB, "--resume", "{d}/afile.txt"], ["resume folder '{d}/afile.txt' is a file"]),
    ("sweep --resume missing", ["sweep", NB, "--resume", "{d}/nothing"],
     ["resume folder '{d}/nothing' is not a folder"]),
    ("sweep --resume no record", ["sweep", NB, "--resume", "{d}/sweeps/none"],
     ["is not a sweep folder (no sweep.json"]),
    ("sweep.json not JSON", ["sweep", NB, "--resume", "{d}/sweeps/not_json"],
     ["{d}/sweeps/not_json/sweep.json: not a readable sweep record"]),
    ("sweep.json not UTF-8", ["sweep", NB, "--resume", "{d}/sweeps/binary"],
     ["{d}/sweeps/binary/sweep.json: not a readable sweep record"]),
    ("sweep.json a list", ["sweep", NB, "--resume", "{d}/sweeps/a_list"], ["sweep.json: not a sweep record", "list"]),
    ("sweep.json without notebook", ["sweep", NB, "--resume", "{d}/sweeps/no_notebook"],
     ["no_notebook/sweep.json: field 'notebook' is missing"]),
    ("sweep.json of another notebook", ["sweep", NB, "--resume", "{d}/sweeps/other_notebook"],
     ["other_notebook/sweep.json: field 'notebook' is '01_kv_bytes_per_token'", "another notebook than 'tiny'"]),
    ("sweep.json grid a list", ["sweep", NB, "--resume", "{d}/sweeps/grid_list"],
     ["grid_list/sweep.json: field 'grid' must be a mapping"]),
    ("sweep.json grid empty values", ["sweep", NB, "--resume", "{d}/sweeps/grid_empty_values"],
     ["grid_empty_values/sweep.json: field 'grid': parameter 'x' has an empty list"]),
    ("sweep.json grid bad name", ["sweep", NB, "--resume", "{d}/sweeps/grid_bad_name"],
     ["grid_bad_name/sweep.json: field 'grid': 'not a name' is not a parameter name"]),
    ("sweep.json without points", ["sweep", NB, "--resume", "{d}/sweeps/no_points"],
     ["no_points/sweep.json: field 'points' is missing"]),
    ("sweep.json grid undeclared", ["sweep", NB, "--resume", "{d}/sweeps/undeclared"],
     ["undeclared/sweep.json: field 'grid': parameter 'y' is not declared by tiny"]),
    ("sweep.json points outside", ["sweep", NB, "--resume", "{d}/sweeps/points_escape"],
     ["points_escape/sweep.json: field 'points' names a folder outside the sweep: '../x'"]),
    ("run a bad parameter", ["run", "01", "-p", "context_tokens", "0"],
     ["01_kv_bytes_per_token: parameter context_tokens must be an integer >= 1, got 0"]),
    ("run an unknown model", ["run", "01", "-p", "model", "gpt-7"],
     ["01_kv_bytes_per_token: parameter model", "gpt-7"]),
    ("run a missing trace", ["run", "07", "-p", "trace", "{d}/missing.jsonl"],
     ["07_tiering_on_traces: parameter trace"]),
    ("sweep a bad point", ["sweep", "01", "--grid", "{d}/grid01.json"],
     ["grid point model=\"qwen3-8b\" context_tokens=0: 01_kv_bytes_per_token: parameter context_tokens must be"]),
    ("run --out on a file", ["run", NB, "--out", "{d}/afile.txt"], ["'{d}/afile.txt' is a file, not a folder"]),
    ("run --out under a file", ["run", NB, "--out", "{d}/afile.txt/runs"], ["lies under '{d}/afile.txt'"]),
    ("run --out unwritable", ["run", NB, "--out", "/proc/kvlab-nowhere"], ["cannot write in '/proc'"]),
    ("run --out empty", ["run", NB, "--out", ""], ["must be a path"]),
    ("run --out with a NUL", ["run", NB, "--out", "a\0b"], ["NUL byte"]),
    ("run --out too long", ["run", NB, "--out", "x" * 5000], ["not a usable path"]),
]


@pytest.mark.parametrize("desc, argv, words", FOLDERS, ids=[c[0] for c in FOLDERS])
def test_output_folders_and_sweep_records(desc, argv, words, d, capsys):
    refused(argv, d, capsys, words)


# --- serve-sim's scheduler knobs and output files (issue 36): contradictions refused before any work ---------------
SSIM = ["serve-sim", "{d}/good.jsonl"] + SERVE + ["--step-time", "unit"]
SCHEDULER = [
    ("block size not dividing the pool", SSIM + ["--pool-tokens", "1000", "--block-size", "16"],
     ["block size 16 does not divide the pool of 1,000 tokens"]),
    ("max_num_batched_tokens below a block", SSIM + ["--max-num-batched-tokens", "8"],
     ["max_num_batched_tokens (8) is below one block (16 tokens)"]),
    ("zero blocks", SSIM + ["--num-blocks", "0"], ["--num-blocks"]),
    ("one block (the null block only)", SSIM + ["--num-blocks", "1"], ["num_blocks must be"]),
    ("both pool sizes", SSIM + ["--num-blocks", "64", "--pool-tokens", "1024"], ["not both"]),
    ("no chunked prefill, budget below max_model_len", SSIM + ["--no-chunked-prefill", "--max-model-len", "4096",
                                                               "--max-num-batched-tokens", "2048"],
     ["without chunked prefill max_num_batched_tokens (2,048) must be at least max_model_len (4,096)"]),
    ("requests-out in a missing folder", SSIM + ["--requests-out", "{d}/nowhere/r.csv"],
     ["--requests-out", "folder {d}/nowhere does not exist"]),
    ("steps-out over an existing file", SSIM + ["--steps-out", "{d}/good.csv"],
     ["--steps-out {d}/good.csv: the file exists"]),
    ("requests-out over an existing file", SSIM + ["--requests-out", "{d}/good.jsonl"], ["the file exists"]),
]


@pytest.mark.parametrize("desc, argv, words", SCHEDULER, ids=[c[0] for c in SCHEDULER])
def test_scheduler_knobs_and_outputs_refused(desc, argv, words, d, capsys):
    refused(argv, d, capsys, words)


def test_serve_sim_writes_requests_and_steps(d, capsys):
    argv = ["serve-sim", str(d / "good.jsonl")] + SERVE + ["--step-time", "unit", "--num-blocks", "256",
                                                           "--requests-out", str(d / "r.csv"),
                                                           "--steps-out", str(d / "s.jsonl")]
    assert main(argv) == 0
    rows = (d / "r.csv").read_text().splitlines()
    assert rows[0] == "id,arrival_s,admitted_s,first_token_s,finish_s,preemptions,prefix_hit_tokens,rejected"
    assert len(rows) == 3 and rows[1].startswith("0,0.0,0.0,")
    steps = [json.loads(x) for x in (d / "s.jsonl").read_text().splitlines()]
    assert steps[0]["time"] == 0.0 and steps[0]["tokens"] == {"0": [1000, 0]} and "free_blocks" in steps[0]
