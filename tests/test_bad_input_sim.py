"""Bad input to the simulator, the analyzer, the trace readers and the fetcher: one clear kvlab error each.

Cases are data, one parametrized test per class. An API case names a call and the message it must raise (a kvlab
exception: a ValueError subclass); a CLI case runs `kvlab ...` and must exit 2 with one line on stderr naming the
problem. Files are written fresh under tmp_path for each case.
"""
import json
import math

import numpy as np
import pytest

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.sim import catalog
from kvlab.sim.analyze import analyze
from kvlab.sim.curves import cache_hits, capacity_for
from kvlab.sim.policies import get_policy
from kvlab.sim.tiering import Tiers, make_tiers, simulate
from kvlab.sim.traces import load_trace, read_azure, read_mooncake, synthetic_agent_trace

REC = {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [7, 8]}


def jl(**over):
    return json.dumps({**REC, **over}) + "\n"


AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
FILES = {  # name -> bytes; "dir" is made a directory
    "bighash.jsonl": jl(hash_ids=[7, 2**63]).encode(),
    "hugein.jsonl": jl(input_length=10**23).encode(),
    "floatout.jsonl": jl(output_length=1e23).encode(),
    "hugetime.jsonl": jl(timestamp=10**400).encode(),
    "binary.jsonl": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)),  # an image, say
    "empty.jsonl": b"",
    "hugeaz.csv": (AZ + "2023-11-16 18:17:03.97,100000000000000000000000000000,10\n").encode(),
    "binary.csv": AZ.encode() + b"\xff\xfe\x00garbage\n",
    "good.jsonl": (jl() + jl(timestamp=5, hash_ids=[7, 9])).encode(),
    "good.csv": (AZ + "2023-11-16 18:17:03.97,100,10\n").encode(),
    "dir": None,
}


@pytest.fixture
def files(tmp_path):
    for name, data in FILES.items():
        p = tmp_path / name
        if data is None:
            p.mkdir()
        else:
            p.write_bytes(data)
    return tmp_path


def check(case, files, capsys):
    """Run one case: ("api", f(files), match) or ("cli", argv with {d} for the files folder, match)."""
    kind, what, match = case
    if kind == "api":
        with pytest.raises(KvlabError, match=match):
            what(files)
        return
    argv = [a.replace("{d}", str(files)) for a in what]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvlab: error:"), err
    assert __import__("re").search(match, err[0]), err[0]


SIM = ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--no-progress", "--trace"]

TRACE_FILES = [  # numbers too large for their type, binary garbage, a folder, an empty file
    ("api", lambda d: read_mooncake(d / "bighash.jsonl"), r"line 1: field 'hash_ids'.*\[0, 2\*\*63\)"),
    ("api", lambda d: read_mooncake(d / "hugein.jsonl"), r"line 1: field 'input_length': must be an integer in"),
    ("api", lambda d: read_mooncake(d / "floatout.jsonl"), r"line 1: field 'output_length'.*got 1e\+23"),
    ("api", lambda d: read_mooncake(d / "hugetime.jsonl"), r"line 1: field 'timestamp'.*\.\.\."),
    ("api", lambda d: read_mooncake(d / "binary.jsonl"), r"line 1: not UTF-8 text \(byte 0x89 at column 1\)"),
    ("api", lambda d: read_mooncake(d / "dir"), r"dir: is a directory, not a trace file"),
    ("api", lambda d: read_mooncake(d / "empty.jsonl"), r"no records"),
    ("api", lambda d: read_azure(d / "hugeaz.csv"), r"line 2: field 'ContextTokens': must be an integer in"),
    ("api", lambda d: read_azure(d / "binary.csv"), r"line 2: not UTF-8 text \(byte 0xff"),
    ("api", lambda d: read_azure(d / "dir"), r"is a directory"),
    ("api", lambda d: load_trace(d / "dir"), r"is a directory, not a trace file"),
    ("api", lambda d: load_trace(d / "good.jsonl", limit=0), r"limit must be an integer >= 1, got 0"),
    ("api", lambda d: read_mooncake(d / "good.jsonl", block_tokens=0), r"block_tokens must be an integer >= 1"),
    ("cli", SIM + ["{d}/bighash.jsonl"], r"field 'hash_ids'"),
    ("cli", SIM + ["{d}/hugein.jsonl"], r"field 'input_length'"),
    ("cli", SIM + ["{d}/binary.jsonl"], r"not UTF-8 text"),
    ("cli", SIM + ["{d}/dir"], r"is a directory, not a trace file"),
    ("cli", SIM + ["{d}/hugeaz.csv"], r"field 'ContextTokens'"),
    ("cli", ["analyze", "{d}/binary.jsonl"], r"not UTF-8 text"),
    ("cli", ["analyze", "{d}/dir"], r"is a directory"),
    ("cli", ["analyze", "{d}/good.csv"], r"has no block ids"),
    ("cli", SIM + ["{d}/good.jsonl", "--limit", "0"], r"limit must be an integer >= 1"),
    ("cli", SIM + ["no-such-trace"], r"not found: no such file, and not a catalog name"),
    ("api", lambda d: load_trace(d / "good.csv", block_tokens=16), r"good.csv is an Azure CSV trace, which has none"),
    ("cli", SIM + ["{d}/good.jsonl", "--block-tokens", "0"], r"--block-tokens must be an integer >= 1"),
    ("cli", SIM + ["{d}/good.jsonl", "--block-tokens", "256"],
     r"line 1: field 'hash_ids': 2 ids for 1000 input tokens; expected ceil\(1000 / 256\) = 4 .*--block-tokens"),
    ("cli", SIM + ["{d}/good.csv", "--block-tokens", "16"], r"Azure CSV trace, which has none \(leave it out\)"),
    ("cli", ["serve-sim", "{d}/good.csv", "--model", "qwen3-8b", "--gpu", "H100", "--block-tokens", "16"],
     r"Azure CSV trace, which has none"),
    ("cli", ["plan", "{d}/good.jsonl", "--model", "qwen3-8b", "--gpu", "H100", "--block-tokens", "300",
             "--slo", "ttft_p99=2"], r"expected ceil\(1000 / 300\) = 4"),
]


@pytest.mark.parametrize("case", TRACE_FILES, ids=lambda c: str(c[1])[:60] if c[0] == "cli" else None)
def test_trace_files(case, files, capsys):
    check(case, files, capsys)


TIER_NUMBERS = [  # budgets too large for a block count, NaN or infinite, zero-size blocks
    ("api", lambda d: make_tiers("qwen3-8b", 1e20), r"hbm_gb must lie in \[0, 1e\+09\], got 1e\+20"),
    ("api", lambda d: make_tiers("qwen3-8b", 1e300), r"hbm_gb must lie in"),
    ("api", lambda d: make_tiers("qwen3-8b", 1, math.inf), r"dram_gb must be a finite number"),
    ("api", lambda d: make_tiers("qwen3-8b", 1, ssd_gb=math.nan), r"ssd_gb must be a finite number"),
    ("api", lambda d: make_tiers("qwen3-8b", 1, 1, ttl_s=math.nan), r"ttl_s must be a finite number|ttl_s must"),
    ("api", lambda d: make_tiers("qwen3-8b", 1, 1, ttl_s=0), r"ttl_s must lie in \(0"),
    ("api", lambda d: make_tiers("qwen3-8b", 1, block_tokens=0), r"block_tokens must be an integer >= 1, got 0"),
    ("api", lambda d: make_tiers("qwen3-8b", 1, block_tokens=2.5), r"block_tokens must be an integer, got 2.5"),
    ("api", lambda d: make_tiers("qwen3-8b", 1, prefill_tokens_per_s=math.nan), r"prefill_tokens_per_s must be"),
    ("api", lambda d: Tiers(512, 100, (1, 0, 0), (1.0, 1.0, 1.0), math.nan), r"ttl_s must be"),
    ("api", lambda d: Tiers(512, 100, (1, -1, 0), (1.0, 1.0, 1.0)), r"dram capacity \(blocks\) must be an integer >= 0"),
    ("api", lambda d: Tiers(0, 100, (1, 0, 0), (1.0, 1.0, 1.0)), r"block_tokens must be an integer >= 1"),
    ("cli", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1e20"], r"hbm.gb must lie in \[0, 1e\+\d\d\].*1e20"),
    ("cli", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1e10"],
    r"--hbm-gb 1e\+10 is more than H100's memory"),  # checked before the trace is read
    ("cli", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1e300"], r"hbm.gb must lie in"),
    ("cli", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--dram-gb", "inf"], r"dram.gb .*(finite|lie in)"),
    ("cli", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--ttl-s", "nan"], r"--ttl-s must be a finite number|--ttl-s must lie in"),
    ("cli", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--ttl-s", "0"], r"--ttl-s must lie in \(0"),
    ("cli", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--prefill-tps", "0"], r"--prefill-tps must lie in \(0"),
]


@pytest.mark.parametrize("case", TIER_NUMBERS)
def test_tier_numbers(case, files, capsys):
    check(case, files, capsys)


WORKLOAD = [  # the synthetic workload's knobs: rates, probabilities, counts
    ("api", lambda d: synthetic_agent_trace(session_rate_per_s=-1.0), r"session_rate_per_s must lie in \(0"),
    ("api", lambda d: synthetic_agent_trace(session_rate_per_s=math.nan), r"session_rate_per_s must be a finite"),
    ("api", lambda d: synthetic_agent_trace(tool_call_prob=1.5), r"tool_call_prob must lie in \[0, 1\], got 1.5"),
    ("api", lambda d: synthetic_agent_trace(tool_call_prob=-0.1), r"tool_call_prob must lie in \[0, 1\]"),
    ("api", lambda d: synthetic_agent_trace(turns=0.5), r"turns must lie in \[1"),
    ("api", lambda d: synthetic_agent_trace(sessions=0), r"sessions must be an integer >= 1, got 0"),
    ("api", lambda d: synthetic_agent_trace(sessions=2.5), r"sessions must be an integer"),
    ("api", lambda d: synthetic_agent_trace(block_tokens=0), r"block_tokens must be an integer >= 1"),
    ("api", lambda d: synthetic_agent_trace(human_pause_median_s=0.0), r"human_pause_median_s must lie in \(0"),
    ("api", lambda d: synthetic_agent_trace(tool_pause_s=math.inf), r"tool_pause_s must be a finite"),
    ("api", lambda d: synthetic_agent_trace(seed=-1), r"seed must be an integer >= 0, got -1"),
    ("api", lambda d: synthetic_agent_trace(sesions=3), r"unknown synthetic workload knob 'sesions'"),
    ("api", lambda d: load_trace("synthetic", limit=-3), r"limit must be an integer >= 1, got -3"),
]


@pytest.mark.parametrize("case", WORKLOAD)
def test_synthetic_workload(case, files, capsys):
    check(case, files, capsys)


def test_limit_applies_to_the_synthetic_trace(capsys):
    # once ignored: --limit now cuts the synthetic workload like any trace
    assert len(load_trace("synthetic", limit=7, sessions=20)) == 7
    assert main(["simulate", "--trace", "synthetic", "--model", "qwen3-8b", "--hbm-gb", "1", "--limit", "5",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 5


POLICIES = [  # policies, admissions, capacities, targets, analyzer and fetcher arguments
    ("api", lambda d: cache_hits(synthetic_agent_trace(sessions=2), "mru", [5]), r"policy must be one of lru"),
    ("api", lambda d: cache_hits(synthetic_agent_trace(sessions=2), "s3fifo", [12]),
     r"S3-FIFO needs a capacity of at least 20 blocks"),
    ("api", lambda d: cache_hits(synthetic_agent_trace(sessions=2), "lru", [-1]), r"capacity \(blocks\) must be"),
    ("api", lambda d: cache_hits(synthetic_agent_trace(sessions=2), "lru", [np.nan]), r"capacities must be integers"),
    ("api", lambda d: capacity_for(synthetic_agent_trace(sessions=2), "lru", math.nan), r"target must be a finite"),
    ("api", lambda d: get_policy("belady")(10), r"Belady is offline"),
    ("api", lambda d: simulate(synthetic_agent_trace(sessions=2), Tiers(512, 1, (30, 0, 0), (1.0, 1.0, 1.0)), "lru",
                               admission="sometimes"), r"admission must be one of all, second"),
    ("api", lambda d: analyze(load_trace(d / "good.csv")), r"has no block ids"),
    ("api", lambda d: analyze(synthetic_agent_trace(sessions=2), points=1), r"points must be an integer >= 2"),
    ("api", lambda d: analyze(synthetic_agent_trace(sessions=2), targets=[2.0]), r"target must lie in \[0, 1\]"),
    ("api", lambda d: catalog.fetch("mooncake-conversations"), r"trace must be one of mooncake-conversation"),
    ("cli", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1", "--policy", "mru"], r"invalid choice: 'mru'"),
    ("cli", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "0.001"], r"hbm_gb 0.001 holds no block: one block is "
     r"75,497,472 B \(512 tokens of qwen3-8b\)"),
    ("cli", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "0.5", "--policy", "s3fifo"],
     r"hbm tier: S3-FIFO needs a capacity of at least 20"),
    ("cli", ["analyze", "synthetic", "--points", "1"], r"points must be an integer >= 2"),
    ("cli", ["analyze", "synthetic", "--target", "1.5"], r"--target must lie in \[0(\.0)?, 1(\.0)?\]"),
    ("cli", ["analyze", "synthetic", "--block-tokens", "0"], r"--block-tokens must be an integer >= 1, got .0."),
    ("cli", ["analyze", "synthetic", "--model", "no-such-model"], r"no-such-model"),
    ("cli", ["traces", "fetch", "nope"], r"invalid choice: 'nope'"),
]


@pytest.mark.parametrize("case", POLICIES)
def test_policy_and_analyzer_arguments(case, files, capsys):
    check(case, files, capsys)
