"""Trace readers on good and malformed input; the synthetic agent workload; the real traces when present."""
import json
import sys

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


def test_trace_path_errors(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        trace_path("no_such_trace.jsonl")
    with pytest.raises(TraceError, match="is a directory, not a trace file"):
        trace_path(tmp_path)
    assert load_trace("synthetic", sessions=5).name == "synthetic"


needs_traces = pytest.mark.skipif(not have_trace("conversation"), reason="Mooncake traces not present "
                                  "(kvlab traces fetch mooncake-conversation, or ../shared/traces)")


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


# --- the public-trace catalog and fetcher: local mirrors only, never the network ------------------------------
import hashlib  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from dataclasses import replace  # noqa: E402

from kvlab.cli import main  # noqa: E402
from kvlab.sim import catalog  # noqa: E402
from kvlab.sim.traces import TRACES_DIR  # noqa: E402


@pytest.fixture
def data(tmp_path, monkeypatch):
    """An empty data folder, no mirror, and any attempt to reach the network refused."""
    monkeypatch.setenv("KVLAB_DATA", str(tmp_path / "data"))
    monkeypatch.delenv("KVLAB_TRACE_MIRROR", raising=False)
    real = urllib.request.urlopen

    def local_only(url, *a, **k):
        if not str(url).startswith("file:"):
            raise urllib.error.URLError("network disabled in tests")
        return real(url, *a, **k)
    monkeypatch.setattr(urllib.request, "urlopen", local_only)
    return tmp_path


@pytest.fixture
def tiny(data, monkeypatch):
    """A generated Mooncake trace in a mirror folder, entered in the catalog with its own checksums."""
    mirror = data / "mirror"
    mirror.mkdir()
    body = "".join(json.dumps(r) + "\n" for r in GOOD).encode()
    (mirror / "tiny_trace.jsonl").write_bytes(body)
    blob = hashlib.sha1(f"blob {len(body)}\0".encode() + body).hexdigest()
    entry = catalog.PublicTrace("tiny", "tiny_trace.jsonl", "https://example.invalid/tiny_trace.jsonl", "CC0",
                                "tests", "three requests", hashlib.sha256(body).hexdigest(), blob, len(body), ("t1",))
    monkeypatch.setitem(catalog.CATALOG, "tiny", entry)
    monkeypatch.setitem(catalog.ALIASES, "t1", "tiny")
    monkeypatch.setenv("KVLAB_TRACE_MIRROR", str(mirror))
    return entry, mirror


def test_fetch_verifies_and_names_resolve(tiny):
    entry, mirror = tiny
    with pytest.raises(TraceError, match=r"'tiny' is not downloaded: run `kvlab traces fetch tiny` \(downloads file:"):
        load_trace("tiny")
    p = catalog.fetch("tiny")
    assert p == catalog.data_dir() / "traces" / "tiny_trace.jsonl" and catalog.verified(entry)
    assert load_trace("tiny").n_accesses == 6 and trace_path("t1") == p  # by name and by alias
    (mirror / "tiny_trace.jsonl").unlink()
    assert catalog.fetch("tiny") == p  # already there and verified: no download


def test_fetch_by_git_blob_when_no_sha256(tiny, monkeypatch):
    entry, _ = tiny
    monkeypatch.setitem(catalog.CATALOG, "tiny", replace(entry, sha256=None))
    assert catalog.fetch("tiny").is_file()
    monkeypatch.setitem(catalog.CATALOG, "tiny", replace(entry, sha256=None, git_blob="0" * 40))
    with pytest.raises(catalog.FetchError, match="expected git blob 0000"):
        catalog.fetch("tiny", force=True)


def test_fetch_refuses_a_corrupt_copy_and_keeps_nothing(tiny):
    entry, mirror = tiny
    (mirror / "tiny_trace.jsonl").write_bytes(b'{"timestamp": 0}\n')
    with pytest.raises(catalog.FetchError, match=r"does not match its published checksum .* nothing was saved"):
        catalog.fetch("tiny")
    assert not catalog.data_dir().exists()  # no file, no .part, not even the folders made for them


def test_offline_says_what_to_download_where(data, capsys):
    with pytest.raises(catalog.FetchError) as e:
        catalog.fetch("mooncake-conversation")
    msg = str(e.value)
    assert "network disabled" in msg and catalog.CATALOG["mooncake-conversation"].url in msg
    assert str(catalog.data_dir() / "traces" / "conversation_trace.jsonl") in msg and "sha256 b8cbb061" in msg
    assert main(["traces", "fetch", "azure-code-2023"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot download azure-code-2023" in err[0] and "save it as" in err[0]


def test_traces_cli_list_and_fetch(tiny, capsys):
    entry, _ = tiny
    assert main(["traces", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["traces"]}
    assert not rows["tiny"]["saved"] and rows["mooncake-conversation"]["licence"] == "Apache-2.0"
    assert main(["traces", "fetch", "t1"]) == 0 and "verified" in capsys.readouterr().out
    assert main(["traces", "list"]) == 0
    out = capsys.readouterr().out
    assert "tiny (also: t1): " in out
    assert f"read from {catalog.local_path(entry)} (data folder, checksum verified)" in out


def test_catalog_urls_pin_commits():
    for t in catalog.CATALOG.values():
        assert t.url.startswith("https://raw.githubusercontent.com/") and len(t.git_blob) == 40
        assert ("/3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/" in t.url) or ("/790921015d50dd6aae7f7e47f39ba0e235ad6b08/"
                                                                          in t.url)
    assert catalog.lookup("conversation").name == "mooncake-conversation" and catalog.lookup("nope") is None


def test_data_dir_default(monkeypatch, tmp_path):
    monkeypatch.delenv("KVLAB_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if sys.platform.startswith("linux"):
        assert catalog.data_dir() == tmp_path / "kvlab"


@pytest.mark.skipif(not (TRACES_DIR / "conversation_trace.jsonl").is_file(), reason="no ../shared/traces mirror")
def test_published_checksums_match_the_local_mirror(data, monkeypatch):
    # the SHA-256 and git blob ids in the catalog are those of the published files (copies in ../shared/traces)
    monkeypatch.setenv("KVLAB_TRACE_MIRROR", TRACES_DIR.as_uri())
    for name in ("mooncake-conversation", "mooncake-synthetic", "azure-code-2023", "azure-conv-2023"):
        t = catalog.get(name)
        assert catalog.digests(TRACES_DIR / t.file) == (t.sha256, t.git_blob)
        assert catalog.fetch(name).stat().st_size == t.size
    assert len(load_trace("mooncake-conversation")) == 12_031
