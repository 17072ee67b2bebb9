"""Trace readers on good and malformed input; the synthetic agent workload; the real traces when present."""
import json

import numpy as np
import pytest

from kvlab.sim.traces import (TraceError, have_trace, load_trace, read_azure, read_mooncake, synthetic_agent_trace,
                          trace_path)

GOOD = [{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [7, 8]},
        {"timestamp": 1500, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
        {"timestamp": 2000, "input_length": 512, "output_length": 1, "hash_ids": [4]}]


def _write(tmp_path, records, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return p


def test_mooncake_good(tmp_path):
    t = read_mooncake(_write(tmp_path, GOOD))
    assert len(t) == 3 and t.timestamps.tolist() == [0.0, 1.5, 2.0]
    assert t.block_offsets.tolist() == [0, 2, 5, 6]
    assert t.block_ids.tolist() == [0, 1, 0, 1, 2, 3]  # dense, first-appearance order
    assert t.n_blocks == 4 and t.request_of_access.tolist() == [0, 0, 1, 1, 1, 2]


@pytest.mark.parametrize("bad, line, field", [
    ({"timestamp": 0, "input_length": 10, "output_length": 1}, 2, "hash_ids"),
    ({"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}, 2, "input_length"),
    ({"timestamp": 0, "input_length": 10, "output_length": "x", "hash_ids": [1]}, 2, "output_length"),
    ({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, "a"]}, 2, "hash_ids"),
    ({"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1]}, 2, "hash_ids"),
    ({"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}, 2, "timestamp"),
])
def test_mooncake_malformed_names_line_and_field(tmp_path, bad, line, field):
    p = _write(tmp_path, [GOOD[0], bad])
    with pytest.raises(TraceError, match=f"line {line}: field '{field}'"):
        read_mooncake(p)


def test_mooncake_not_json_and_backwards_time(tmp_path):
    with pytest.raises(TraceError, match="line 2: not valid JSON"):
        read_mooncake(_write(tmp_path, [GOOD[0], "{oops"]))
    with pytest.raises(TraceError, match="line 2: field 'timestamp': goes backwards"):
        read_mooncake(_write(tmp_path, [GOOD[1], GOOD[0]]))
    with pytest.raises(TraceError, match="no such trace"):
        read_mooncake(tmp_path / "missing.jsonl")


def test_azure_good_and_malformed(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
                 "2023-11-16 18:17:05.4799600,3180,8\n")
    t = read_azure(p)
    assert t.input_tokens.tolist() == [4808, 3180] and abs(t.timestamps[1] - 1.5) < 1e-6
    assert not t.has_prefixes
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,12x,10\n")
    with pytest.raises(TraceError, match="line 2: field 'ContextTokens'"):
        read_azure(p)
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n")
    with pytest.raises(TraceError, match="line 2: field 'TIMESTAMP'"):
        read_azure(p)
    p.write_text("time,ctx,gen\n")
    with pytest.raises(TraceError, match="line 1: header"):
        read_azure(p)


def test_synthetic_is_seeded_and_agent_shaped():
    a = synthetic_agent_trace(seed=3, sessions=30)
    b = synthetic_agent_trace(seed=3, sessions=30)
    assert np.array_equal(a.block_ids, b.block_ids) and np.array_equal(a.timestamps, b.timestamps)
    assert not np.array_equal(a.block_ids, synthetic_agent_trace(seed=4, sessions=30).block_ids)
    first = a.block_ids[a.block_offsets[:-1]]
    assert (first == first[0]).all()  # every request starts with the shared system prompt's first block
    assert np.all(np.diff(a.timestamps) >= 0)
    # a session's context grows turn by turn, and pauses between its turns vary (tool calls vs approvals)
    s0 = np.flatnonzero(a.session_ids == a.session_ids[0])
    assert np.all(np.diff(a.input_tokens[s0]) > 0)
    with pytest.raises(Exception, match="unknown synthetic workload knob"):
        synthetic_agent_trace(seed=0, sesions=3)


def test_trace_path_errors():
    with pytest.raises(TraceError, match="not found"):
        trace_path("no_such_trace.jsonl")
    assert load_trace("synthetic", sessions=5).name == "synthetic"


needs_traces = pytest.mark.skipif(not have_trace("conversation"), reason="the Mooncake traces are absent (kvlab.sim.traces.TRACES_DIR)")


@needs_traces
def test_real_mooncake_conversation():
    t = load_trace("conversation")
    assert len(t) == 12_031 and t.n_accesses == 288_500
    assert round(t.input_tokens.mean()) == 12_035 and round(t.output_tokens.mean()) == 343  # paper's Table 2


@pytest.mark.skipif(not have_trace("azure_code"), reason="the Azure traces are absent (kvlab.sim.traces.TRACES_DIR)")
def test_real_azure():
    t = load_trace("azure_code")
    assert len(t) > 1000 and not t.has_prefixes and t.timestamps[-1] > 0


def test_session_pauses_and_ttl_exceedance():
    from kvlab.sim.traces import pause_exceeds, session_pauses
    t = synthetic_agent_trace(seed=0, sessions=40)
    p = session_pauses(t)
    assert len(p) == len(t) - len(np.unique(t.session_ids)) and (p >= 0).all()
    share = pause_exceeds(t, [1, 60, 1e9])
    assert share[0] >= share[1] >= share[2] == 0.0 and 0 < share[1] < 1
    assert share[1] == np.mean(p > 60)
