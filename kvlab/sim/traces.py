"""Request traces: Mooncake JSONL and Azure CSV readers, and a seeded synthetic agent workload.

A `Trace` holds per-request arrays plus, when the trace has prefix information, each request's
block ids in CSR form (block_offsets, block_ids). Mooncake (kvcache-ai/Mooncake FAST25-release
traces, Apache-2.0) gives one hash id per 512-token block, each standing for the block and all
before it, so a shared leading run of ids is a reusable prefix. Azure's 2023 LLM inference traces
(Azure/AzurePublicDataset, CC-BY-4.0) give arrivals and lengths only. Trace files are never copied
into the repository: `kvlab traces fetch NAME` downloads them, verified, into the user's data folder
(kvlab.sim.catalog: the folder in $KVLAB_DATA, else the user's cache folder), where readers find them by name;
an explicit path always works; the synthetic generator stands in otherwise. A user's clone has no other trace
folder: TRACES_DIR (../shared/traces beside the repository) is only a developer's local mirror, looked in when it
happens to exist, and tests fall back to generated traces without it. A catalog name is read from the first copy
found (`catalog.locate`) and only when it matches its published checksum; a copy that does not is refused, naming it.

The readers are the one gate every command's trace passes (`kvlab simulate`, `analyze`, `serve-sim`, `plan`, the
notebooks): each record is checked where it is read, and a bad one is refused with the file, the line and the field.
Their rules: a request has at least one prompt token and one output token (a zero-length request has nothing to
prefill or generate, and would be served with a throughput: refused, not dropped, so every command sees the same
requests); arrival times never go backwards (refused, not sorted); numbers fit their types.
"""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from . import catalog
from ..checks import cdiv, need_int, need_number, need_path
from ..errors import KvlabError, ParameterError

REPO_ROOT = catalog.REPO_ROOT
TRACES_DIR = catalog.MIRROR_DIR  # a developer's local mirror only (a user's clone has none)
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake hashes 512-token blocks (FAST'25 traces README)
MAX_TOKENS = 2**40  # largest prompt or output length accepted from a trace (token sums stay exact in int64)
MAX_HASH = 2**63  # hash ids are stored as int64
MAX_SYNTHETIC_ACCESSES = 10_000_000  # block accesses the synthetic workload may make (its default makes 85,156)


class TraceError(KvlabError):
    """A trace file that is missing or malformed (the message names the line and field)."""


@dataclass
class Trace:
    """Requests in arrival order."""

    name: str  # file name or "synthetic"
    timestamps: np.ndarray  # [R] arrival, seconds from the first request
    input_tokens: np.ndarray  # [R] prompt tokens
    output_tokens: np.ndarray  # [R] generated tokens
    block_offsets: np.ndarray | None  # [R + 1] request r's blocks are block_ids[off[r]:off[r+1]]; None: no prefixes
    block_ids: np.ndarray | None  # [A] dense block ids 0..n_blocks-1, prefix-chained
    block_tokens: int = MOONCAKE_BLOCK_TOKENS  # tokens per hashed block
    session_ids: np.ndarray | None = None  # [R] session of each request (synthetic traces)
    source: str = ""  # where the data comes from, with its licence

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def has_prefixes(self) -> bool:
        return self.block_ids is not None

    @property
    def n_accesses(self) -> int:
        return 0 if self.block_ids is None else len(self.block_ids)

    @property
    def n_blocks(self) -> int:
        return 0 if self.block_ids is None or not len(self.block_ids) else int(self.block_ids.max()) + 1

    @property
    def request_of_access(self) -> np.ndarray:
        """[A] request index of every block access."""
        return np.repeat(np.arange(len(self)), np.diff(self.block_offsets))

    def head(self, n: int) -> "Trace":
        """The first n requests (block ids re-densified)."""
        n = min(n, len(self))
        off = blocks = None
        if self.has_prefixes:
            off = self.block_offsets[: n + 1].copy()
            blocks = _dense(self.block_ids[: off[-1]])
        sid = None if self.session_ids is None else self.session_ids[:n].copy()
        return Trace(self.name, self.timestamps[:n].copy(), self.input_tokens[:n].copy(),
                     self.output_tokens[:n].copy(), off, blocks, self.block_tokens, sid, self.source)

    def summary(self) -> dict:
        d = dict(name=self.name, requests=len(self), duration_s=float(self.timestamps[-1] - self.timestamps[0])
                 if len(self) else 0.0, mean_input_tokens=float(self.input_tokens.mean()) if len(self) else 0.0,
                 mean_output_tokens=float(self.output_tokens.mean()) if len(self) else 0.0)
        if self.has_prefixes:
            d.update(block_accesses=self.n_accesses, distinct_blocks=self.n_blocks)
        return d


def need_prefixes(trace: Trace) -> None:
    """Refuse anything but a Trace with block ids: the cache simulators follow prefix-chained blocks."""
    if not isinstance(trace, Trace):
        raise ParameterError(f"expected a Trace, got {type(trace).__name__}")
    if not trace.has_prefixes:
        raise ParameterError(f"trace {trace.name!r} has no prefix (block hash) information: it cannot drive "
                             "the tiering simulator (Azure traces give arrivals and lengths only)")


def access_tokens(trace: Trace, req: np.ndarray) -> np.ndarray:
    """[A] tokens each block access stands for (the last block of a request may be partial); req: [A] request
    of each access (`Trace.request_of_access`)."""
    B = trace.block_tokens
    tok = np.full(trace.n_accesses, B, np.int64)
    off = trace.block_offsets
    n = np.diff(off)
    last = off[1:][n > 0] - 1
    tok[last] = trace.input_tokens[n > 0] - (n[n > 0] - 1) * B
    return tok


def block_stream(ids, block_tokens: int = 1, name: str = "blocks") -> Trace:
    """A plain stream of block ids as a trace of one-block requests (every access its own request, arriving one
    second apart): the shape libCacheSim sees, so each policy's hits can be held against it."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ParameterError(f"block ids must be a 1-D array of integers, got {ids.dtype} of shape {ids.shape}")
    n = len(ids)
    return Trace(name, np.arange(n, dtype=np.float64), np.full(n, block_tokens, np.int64), np.ones(n, np.int64),
                 np.arange(n + 1, dtype=np.int64), _dense(ids.astype(np.int64)), block_tokens,
                 source="a block stream")


def _dense(ids: np.ndarray) -> np.ndarray:
    """Map arbitrary ids to 0..k-1 in order of first appearance."""
    uniq, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    return rank[inv]


def _bad(path, line: int, field: str, msg: str):
    raise TraceError(f"{path}: line {line}: field {field!r}: {msg}")


def _length(v, path, line, field):
    """A request's token count as read: an integer in [0, MAX_TOKENS] (a zero is refused by `_Empty`, which counts
    them first)."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKENS:
        _bad(path, line, field, f"must be an integer in [1, {MAX_TOKENS:,}], got {_short(v)}")
    return v


class _Empty:
    """Zero-length requests of one file: the first (its line, its record) and how many, refused once the file is
    read (see the module docstring for why)."""

    def __init__(self, path: Path):
        self.path, self.first, self.count = path, None, 0

    def see(self, line: int, record: int, n_in: int, n_out: int, fields: tuple[str, str]) -> None:
        if n_in == 0 or n_out == 0:
            self.count += 1
            if self.first is None:
                self.first = (line, record, n_in, n_out, fields[0] if n_in == 0 else fields[1])

    def check(self) -> None:
        if self.first is None:
            return
        line, record, n_in, n_out, field = self.first
        more = f" ({self.count:,} such requests)" if self.count > 1 else ""
        raise TraceError(f"{self.path}: line {line}: request {record:,} has {n_in:,} input and {n_out:,} output "
                         f"tokens{more}: field {field!r} must be at least 1 (a zero-length request has nothing to "
                         "prefill or generate: an engine serves no empty prompt and generates at least one token, "
                         "so kvlab refuses it)")


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _open_trace(path) -> Path:
    path = need_path("trace", path, TraceError)
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, not a trace file")
    if not path.is_file():
        raise TraceError(f"{path}: " + ("not a regular file, not a trace file" if path.exists() else
                                        "no such trace file"))
    return path


def _open_bytes(path: Path):
    try:
        return path.open("rb")
    except OSError as e:
        raise TraceError(f"{path}: cannot read it ({e.strerror or e})") from None


def _text_lines(path: Path, f):
    """(line number, text) of a binary file, each line decoded as UTF-8 (a binary file is refused by line; a
    leading byte-order mark is dropped)."""
    for ln, raw in enumerate(f, 1):
        try:
            yield ln, raw.decode("utf-8-sig" if ln == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(f"{path}: line {ln}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                             "a trace is a Mooncake JSONL or an Azure CSV file") from None


def read_mooncake(path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS, limit: int | None = None) -> Trace:
    """Read a Mooncake JSONL trace, validating every record (line number and field in each error)."""
    path = _open_trace(path)
    block_tokens = need_int("block_tokens", block_tokens, 1)
    limit = None if limit is None else need_int("limit", limit, 1)
    ts, inp, out, offs, ids = [], [], [], [0], []
    empty = _Empty(path)
    with _open_bytes(path) as f:
        for ln, raw in _text_lines(path, f):
            if limit is not None and len(ts) >= limit:
                break
            if not raw.strip():
                continue
            try:
                r = json.loads(raw)
            except json.JSONDecodeError as e:
                raise TraceError(f"{path}: line {ln}: not valid JSON ({e.msg})") from None
            except (ValueError, RecursionError) as e:  # an integer of more than 4,300 digits, nesting too deep
                raise TraceError(f"{path}: line {ln}: not a usable JSON record ({str(e)[:80]})") from None
            if not isinstance(r, dict):
                raise TraceError(f"{path}: line {ln}: a record must be a JSON object")
            for k in ("timestamp", "input_length", "output_length", "hash_ids"):
                if k not in r:
                    _bad(path, ln, k, "missing")
            t = r["timestamp"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < 1e18 or (
                    isinstance(t, float) and not math.isfinite(t)):
                _bad(path, ln, "timestamp", f"must be a number of milliseconds in [0, 1e18), got {_short(t)}")
            if ts and t / 1000 < ts[-1]:
                _bad(path, ln, "timestamp", f"goes backwards ({t} ms after {ts[-1] * 1000:g} ms)")
            n_in = _length(r["input_length"], path, ln, "input_length")
            n_out = _length(r["output_length"], path, ln, "output_length")
            empty.see(ln, len(ts) + 1, n_in, n_out, ("input_length", "output_length"))
            h = r["hash_ids"]
            if not isinstance(h, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < MAX_HASH
                                                  for x in h):
                _bad(path, ln, "hash_ids", "must be a list of integers in [0, 2**63)")
            if len(h) != cdiv(n_in, block_tokens):
                _bad(path, ln, "hash_ids", f"{len(h)} ids for {n_in} input tokens; expected "
                     f"ceil({n_in} / {block_tokens}) = {cdiv(n_in, block_tokens)} (a trace hashed in blocks of "
                     f"another size: give that size as block_tokens, --block-tokens in the CLI)")
            ts.append(t / 1000)
            inp.append(n_in)
            out.append(n_out)
            ids.extend(h)
            offs.append(len(ids))
    empty.check()
    if not ts:
        raise TraceError(f"{path}: no records")
    t0 = ts[0]
    return Trace(path.name, np.array(ts) - t0, np.array(inp, np.int64), np.array(out, np.int64),
                 np.array(offs, np.int64), _dense(np.array(ids, np.int64)), block_tokens,
                 source="kvcache-ai/Mooncake FAST25-release/traces (Apache-2.0)")


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_AZURE_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_DIGITS = re.compile(r"\d+")


def _azure_time(text: str, path, line) -> int:
    """Nanoseconds since 1970 of an Azure TIMESTAMP ('2023-11-16 18:17:03.9799600'; no zone: UTC), an integer, so
    that differences stay exact to the file's last digit."""
    m = _AZURE_TIME.fullmatch(text.strip())
    try:
        if m is None:
            raise ValueError
        t = datetime.fromisoformat(m[1] + (m[3] or "").replace("Z", "+00:00"))
    except ValueError:
        _bad(path, line, "TIMESTAMP", f"not a date-time like 2023-11-16 18:17:03.97: {_short(text)}")
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return (t - _EPOCH) // timedelta(seconds=1) * 10**9 + int((m[2] or "0").ljust(9, "0"))


def read_azure(path: str | Path, limit: int | None = None) -> Trace:
    """Read an Azure LLM inference trace CSV (arrivals and lengths; no prefix information)."""
    path = _open_trace(path)
    limit = None if limit is None else need_int("limit", limit, 1)
    ns, inp, out = [], [], []
    empty = _Empty(path)
    with _open_bytes(path) as f:
        rows = csv.reader(line for _, line in _text_lines(path, f))
        try:
            header = next(rows, None)
            if header is None or tuple(h.strip() for h in header) != AZURE_COLUMNS:
                raise TraceError(f"{path}: line 1: header must be {','.join(AZURE_COLUMNS)}, got {_short(header)}")
            for row in rows:
                ln = rows.line_num
                if limit is not None and len(ns) >= limit:
                    break
                if not row:
                    continue
                if len(row) != 3:
                    raise TraceError(f"{path}: line {ln}: expected 3 fields ({','.join(AZURE_COLUMNS)}), "
                                     f"got {len(row)}")
                t = _azure_time(row[0], path, ln)
                if ns and t < ns[-1]:
                    _bad(path, ln, "TIMESTAMP", f"goes backwards ({row[0].strip()} is before the line above's; "
                         "kvlab reads arrivals in file order and does not sort them)")
                vals = []
                for k, v in zip(AZURE_COLUMNS[1:], row[1:]):
                    if not _DIGITS.fullmatch(v.strip()):
                        _bad(path, ln, k, f"not a whole number of tokens: {_short(v)}")
                    vals.append(_length(int(v) if len(v.strip()) <= 40 else v.strip(), path, ln, k))
                empty.see(ln, len(ns) + 1, vals[0], vals[1], AZURE_COLUMNS[1:])
                ns.append(t)
                inp.append(vals[0])
                out.append(vals[1])
        except csv.Error as e:  # a field over csv's size limit, a stray quote
            raise TraceError(f"{path}: line {rows.line_num}: not a CSV record ({e})") from None
    empty.check()
    if not ns:
        raise TraceError(f"{path}: no records")
    t = np.array([float(x - ns[0]) for x in ns]) / 1e9  # seconds from the first request, exact to the nanosecond
    return Trace(path.name, t, np.array(inp, np.int64), np.array(out, np.int64), None, None,
                 source="Azure/AzurePublicDataset AzureLLMInferenceTrace 2023 (CC-BY-4.0)")


def trace_path(name: str | Path, traces_dir: str | Path | None = None) -> Path:
    """A trace by explicit path (read as it is), or by catalog name, alias or published file name (`kvlab traces
    list`: mooncake-conversation, conversation, ...) from the first copy `catalog.locate` finds - the data folder
    where `kvlab traces fetch` saves it ($KVLAB_DATA or the user's cache folder), else `traces_dir` (by default
    TRACES_DIR, a developer's local mirror that a user's clone lacks) - and only when that copy matches its
    published checksum."""
    if str(name) == "":
        raise TraceError("trace name is empty: give a path, a catalog name (kvlab traces list) or 'synthetic'")
    p = need_path("trace", name, TraceError)
    if p.is_dir():
        raise TraceError(f"{p}: is a directory, not a trace file")
    if p.is_file():
        return p
    t = catalog.lookup(str(name))
    d = Path(traces_dir) if traces_dir is not None else catalog.MIRROR_DIR
    if t is not None:
        c = catalog.locate(t, d)
        if c.path is None:
            raise TraceError(f"trace {str(name)!r} is not downloaded: run `kvlab traces fetch {t.name}` (downloads "
                             f"{catalog.source_url(t)} to {catalog.local_path(t)})")
        if not c.verified:
            raise TraceError(c.refusal())
        return c.path
    if p.name == str(name) and (d / p.name).is_file():  # a file of the mirror's own, outside the catalog
        return d / p.name
    if p.exists():
        raise TraceError(f"{p}: not a regular file, not a trace file")
    raise TraceError(f"trace {str(name)!r} not found: no such file, and not a catalog name "
                     f"({', '.join(catalog.CATALOG)}; see `kvlab traces list`); or use 'synthetic'")


def have_trace(name: str, traces_dir: str | Path | None = None) -> bool:
    try:
        trace_path(name, traces_dir)
        return True
    except TraceError:
        return False


def load_trace(name: str | Path, limit: int | None = None, seed: int = 0, **synthetic) -> Trace:
    """'synthetic' (seeded generator, keyword arguments passed on), or a Mooncake .jsonl / Azure .csv trace by path
    or catalog name (`block_tokens=` gives a Mooncake file's hashing block size); `limit` keeps the first requests."""
    limit = None if limit is None else need_int("limit", limit, 1)
    if str(name) == "synthetic":
        tr = synthetic_agent_trace(seed=seed, **synthetic)
        return tr if limit is None else tr.head(limit)
    block_tokens = synthetic.pop("block_tokens", None)
    if synthetic:
        raise ParameterError(f"{sorted(synthetic)[0]!r} applies to the synthetic workload only, not to a trace file")
    p = trace_path(name)
    if p.suffix == ".csv":
        if block_tokens is not None:
            raise ParameterError(f"block_tokens ({block_tokens!r}) is the hashing block size of a Mooncake trace's "
                                 f"hash_ids; {p.name} is an Azure CSV trace, which has none (leave it out)")
        return read_azure(p, limit)
    return read_mooncake(p, MOONCAKE_BLOCK_TOKENS if block_tokens is None else block_tokens, limit=limit)


# --- synthetic agent workload ----------------------------------------------------------------------
@dataclass(frozen=True)
class AgentWorkload:
    """Knobs of the synthetic agent workload (all token counts are means of the drawn values)."""

    sessions: int = 200  # agent sessions
    session_rate_per_s: float = 0.2  # Poisson arrivals of new sessions
    system_prompt_tokens: int = 3_000  # shared by every session
    toolsets: int = 4  # distinct tool-schema sets; each session uses one
    tool_schema_tokens: int = 2_000  # per toolset, shared by the sessions that use it
    turns: float = 10.0  # mean model calls per session (geometric)
    first_user_tokens: int = 1_500  # the task statement
    output_tokens: int = 300  # mean generated tokens per call
    tool_result_tokens: int = 1_200  # mean tokens a tool call appends
    user_tokens: int = 200  # mean tokens a human turn appends
    tool_call_prob: float = 0.75  # a call is followed by a tool call; otherwise by a human approval / reply
    tool_pause_s: float = 4.0  # mean pause while a tool runs (exponential)
    human_pause_median_s: float = 60.0  # median human approval time (log-normal)
    human_pause_sigma: float = 1.2  # log-normal shape of human pauses
    max_context: int = 131_072  # a session ends once its context would pass this
    block_tokens: int = MOONCAKE_BLOCK_TOKENS  # tokens per hashed block

    def __post_init__(self):
        for k, lo in (("sessions", 1), ("system_prompt_tokens", 0), ("toolsets", 0), ("tool_schema_tokens", 0),
                      ("first_user_tokens", 0), ("output_tokens", 0), ("tool_result_tokens", 0), ("user_tokens", 0),
                      ("max_context", 1), ("block_tokens", 1)):
            need_int(f"synthetic workload {k}", getattr(self, k), lo, MAX_TOKENS)
        need_number("synthetic workload session_rate_per_s", self.session_rate_per_s, 0.0, lo_open=True)
        need_number("synthetic workload turns", self.turns, 1.0, 1e6)
        need_number("synthetic workload tool_call_prob", self.tool_call_prob, 0.0, 1.0)
        need_number("synthetic workload tool_pause_s", self.tool_pause_s, 0.0)
        need_number("synthetic workload human_pause_median_s", self.human_pause_median_s, 0.0, lo_open=True)
        need_number("synthetic workload human_pause_sigma", self.human_pause_sigma, 0.0, 100.0)


def synthetic_agent_trace(seed: int = 0, workload: AgentWorkload | None = None, **overrides) -> Trace:
    """A seeded agent workload: shared system prompt + tool schemas, growing history, tool calls and human
    approvals that pause a session for a drawn time (so both prefix reuse and TTL expiry happen).

    Block ids follow Mooncake's convention: a full block's id names its content and everything before it,
    so blocks inside the system prompt are shared by all sessions, blocks inside the tool schemas by the
    sessions with that toolset, and history blocks by the turns of one session; a partly filled last block
    gets a fresh id each time (its content changes as the history grows)."""
    need_int("seed", seed, 0)
    w = workload or AgentWorkload()
    if overrides:
        from dataclasses import replace
        bad = [k for k in overrides if k not in AgentWorkload.__dataclass_fields__]
        if bad:
            raise ParameterError(f"unknown synthetic workload knob {bad[0]!r}")
        w = replace(w, **overrides)
    rng = np.random.default_rng(seed)
    B = w.block_tokens
    shared = w.system_prompt_tokens
    keys: dict[tuple, int] = {}
    reqs = []  # (time, session, input, output, blocks)
    start = 0.0
    fresh = 0
    made = 0  # block accesses so far
    for s in range(w.sessions):
        start += rng.exponential(1 / w.session_rate_per_s)
        tools = int(rng.integers(w.toolsets)) if w.toolsets else 0
        prefix_end = shared + (w.tool_schema_tokens if w.toolsets else 0)
        ctx = prefix_end + max(1, int(rng.exponential(w.first_user_tokens)))
        n_turns = int(rng.geometric(1 / w.turns))
        t = start
        for _ in range(n_turns):
            if ctx > w.max_context:
                break
            n_ctx_blocks = cdiv(ctx, B)
            made += n_ctx_blocks
            if made > MAX_SYNTHETIC_ACCESSES:  # before the memory goes: 1-token blocks would make 43 million
                raise ParameterError(f"the synthetic workload would make more than {MAX_SYNTHETIC_ACCESSES:,} block "
                                     f"accesses ({w.sessions:,} sessions of blocks of {B:,} tokens); raise "
                                     "block_tokens or lower sessions")
            out = max(1, int(rng.exponential(w.output_tokens)))
            blocks = []
            for k in range(n_ctx_blocks):
                end = (k + 1) * B
                if end > ctx:  # partial last block: content still changing
                    key = ("p", fresh)
                    fresh += 1
                elif end <= shared:
                    key = ("s", k)
                elif end <= prefix_end:
                    key = ("t", tools, k)
                else:
                    key = ("u", s, k)
                blocks.append(keys.setdefault(key, len(keys)))
            reqs.append((t, s, ctx, out, blocks))
            if rng.random() < w.tool_call_prob:
                t += rng.exponential(w.tool_pause_s)
                ctx += out + max(1, int(rng.exponential(w.tool_result_tokens)))
            else:
                t += rng.lognormal(math.log(w.human_pause_median_s), w.human_pause_sigma)
                ctx += out + max(1, int(rng.exponential(w.user_tokens)))
    reqs.sort(key=lambda r: r[0])
    offs = np.cumsum([0] + [len(r[4]) for r in reqs])
    ids = np.fromiter((b for r in reqs for b in r[4]), np.int64, int(offs[-1]))
    ts = np.array([r[0] for r in reqs])
    return Trace("synthetic", ts - ts[0], np.array([r[2] for r in reqs], np.int64),
                 np.array([r[3] for r in reqs], np.int64), offs.astype(np.int64), _dense(ids), B,
                 np.array([r[1] for r in reqs], np.int64), source=f"kvlab synthetic agent workload, seed {seed}")


def session_pauses(trace: Trace) -> np.ndarray:
    """[P] seconds between consecutive requests of the same session (needs session ids)."""
    if trace.session_ids is None:
        raise ParameterError(f"trace {trace.name!r} has no session ids")
    order = np.lexsort((trace.timestamps, trace.session_ids))
    s, t = trace.session_ids[order], trace.timestamps[order]
    same = s[1:] == s[:-1]
    return (t[1:] - t[:-1])[same]


def pause_exceeds(trace: Trace, ttls_s) -> np.ndarray:
    """Share of a session's follow-up turns whose preceding pause is longer than each TTL."""
    p = np.sort(session_pauses(trace))
    return 1.0 - np.searchsorted(p, np.asarray(ttls_s, float), side="right") / max(len(p), 1)
