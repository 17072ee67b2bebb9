"""Public request traces: where each is published, its licence and checksum; fetched into a user data folder.

A clone of kvlab holds no trace data. `fetch(name)` downloads a trace from its pinned source into
`data_dir() / "traces"` (the folder in $KVLAB_DATA, else the platform's cache folder: $XDG_CACHE_HOME/kvlab or
~/.cache/kvlab on Linux, ~/Library/Caches/kvlab on macOS, %LOCALAPPDATA%\\kvlab\\Cache on Windows), verifying it
against its SHA-256 (or, where only the publisher's git blob id is known, against that) before it is kept;
readers then find it by name (`kvlab simulate --trace mooncake-conversation`). $KVLAB_TRACE_MIRROR (a folder or a
URL prefix) fetches the same files from a local mirror instead, checked the same way.

Sources (each URL pins the commit the checksum was taken from):
  Mooncake FAST'25 traces - github.com/kvcache-ai/Mooncake, FAST25-release/traces/ at commit 3cca71d, Apache-2.0;
    the arXiv technical report's trace is mooncake_trace.jsonl at the repository root of the same commit.
  Azure LLM inference traces 2023 (Splitwise, ISCA'24) - github.com/Azure/AzurePublicDataset, data/, at commit
    7909210, CC-BY-4.0.
"""
from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..checks import need_choice
from ..resources import data_dir  # where kvlab keeps downloaded data (one rule for traces and models)
from ..errors import KvlabError

MOONCAKE = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/"
AZURE = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/790921015d50dd6aae7f7e47f39ba0e235ad6b08/"


class FetchError(KvlabError):
    """A trace that cannot be downloaded or does not match its published checksum."""


@dataclass(frozen=True)
class PublicTrace:
    """One published trace file."""

    name: str  # catalog name, e.g. "mooncake-conversation"
    file: str  # file name as published (and as saved)
    url: str  # download address at a pinned commit
    licence: str  # the publisher's licence
    source: str  # repository and folder, for citations
    description: str  # what it holds
    sha256: str | None  # SHA-256 of the published file (None: not known here; git_blob checks it)
    git_blob: str  # git's blob id (SHA-1 of "blob <size>\0" + content) at the pinned commit
    size: int | None = None  # bytes, where known
    aliases: tuple[str, ...] = ()  # older short names that still work


CATALOG: dict[str, PublicTrace] = {t.name: t for t in (
    PublicTrace("mooncake-conversation", "conversation_trace.jsonl",
                MOONCAKE + "FAST25-release/traces/conversation_trace.jsonl", "Apache-2.0",
                "kvcache-ai/Mooncake FAST25-release/traces", "Kimi conversation requests over one hour: 12,031 "
                "requests, 512-token prefix-chained block hashes (FAST'25 Table 2)",
                "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
                "5a371794b81d7fc7487ec8a02a2c631bcc7fbdf8", 3_029_533, ("conversation",)),
    PublicTrace("mooncake-synthetic", "synthetic_trace.jsonl",
                MOONCAKE + "FAST25-release/traces/synthetic_trace.jsonl", "Apache-2.0",
                "kvcache-ai/Mooncake FAST25-release/traces", "requests built from ShareGPT, L-Eval and LooGLE with "
                "Poisson arrivals: 3,993 requests, 512-token block hashes (FAST'25 Table 2)",
                "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
                "e4838049c0dcfc358a5f24ab08251279475cba94", 1_136_313, ("mooncake_synthetic",)),
    PublicTrace("mooncake-toolagent", "toolagent_trace.jsonl",
                MOONCAKE + "FAST25-release/traces/toolagent_trace.jsonl", "Apache-2.0",
                "kvcache-ai/Mooncake FAST25-release/traces", "Kimi tool-and-agent requests over one hour: 23,608 "
                "requests, 512-token block hashes (FAST'25 Table 2)", None,
                "b765599d1e0828b37f68d481563c385d3c11de54"),
    PublicTrace("mooncake-arxiv", "mooncake_trace.jsonl", MOONCAKE + "mooncake_trace.jsonl", "Apache-2.0",
                "kvcache-ai/Mooncake (repository root; later FAST25-release/arxiv-trace)", "the trace released "
                "with Mooncake's arXiv report (its Table 1 hit rates), 512-token block hashes", None,
                "d68d1c6ce27b35a168edc235d36d0202d233f0f2"),
    PublicTrace("azure-code-2023", "AzureLLMInferenceTrace_code.csv", AZURE + "data/AzureLLMInferenceTrace_code.csv",
                "CC-BY-4.0", "Azure/AzurePublicDataset data/ (AzureLLMInferenceDataset2023)", "coding-assistant "
                "requests: arrival time, context and generated tokens (no prefix information)",
                "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
                "62bd8109d0f2b1bc48206d397ecca48d8de03aab", 320_117, ("azure_code",)),
    PublicTrace("azure-conv-2023", "AzureLLMInferenceTrace_conv.csv", AZURE + "data/AzureLLMInferenceTrace_conv.csv",
                "CC-BY-4.0", "Azure/AzurePublicDataset data/ (AzureLLMInferenceDataset2023)", "conversation "
                "requests: arrival time, context and generated tokens (no prefix information)",
                "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
                "5b9219f2caf93bbbf95ec29894e206115658e235", 719_188, ("azure_conv",)),
)}
ALIASES = {a: t.name for t in CATALOG.values() for a in t.aliases}


def lookup(name: str) -> PublicTrace | None:
    """The catalog entry for a name or an alias (None if neither)."""
    name = str(name)
    return CATALOG.get(ALIASES.get(name, name))


def get(name: str) -> PublicTrace:
    t = lookup(name)
    if t is None:
        need_choice("trace", name, list(CATALOG) + list(ALIASES), error=FetchError)
    return t


def local_path(t: PublicTrace) -> Path:
    """Where `fetch` saves (and readers look for) a trace."""
    return data_dir() / "traces" / t.file


def source_url(t: PublicTrace) -> str:
    """The download address: the pinned URL, or the same file under $KVLAB_TRACE_MIRROR (folder or URL prefix)."""
    m = os.environ.get("KVLAB_TRACE_MIRROR")
    if not m:
        return t.url
    if "://" not in m:
        return Path(m).expanduser().resolve().joinpath(t.file).as_uri()
    return m.rstrip("/") + "/" + t.file


class _Digest:
    """SHA-256 and git's blob SHA-1 of a stream, fed chunk by chunk (the blob header needs the size first)."""

    def __init__(self, size: int):
        self.sha = hashlib.sha256()
        self.git = hashlib.sha1(f"blob {size}\0".encode())

    def update(self, chunk: bytes):
        self.sha.update(chunk)
        self.git.update(chunk)


def digests(path: Path) -> tuple[str, str]:
    """(SHA-256, git blob id) of a file."""
    d = _Digest(path.stat().st_size)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            d.update(chunk)
    return d.sha.hexdigest(), d.git.hexdigest()


def matches(t: PublicTrace, sha256: str, git_blob: str) -> bool:
    """Whether digests are the published file's: its SHA-256 where known, else its git blob id."""
    return sha256 == t.sha256 if t.sha256 else git_blob == t.git_blob


def expected(t: PublicTrace) -> str:
    return f"sha256 {t.sha256}" if t.sha256 else f"git blob {t.git_blob}"


def verified(t: PublicTrace, path: Path | None = None) -> bool:
    """Whether the trace is saved (at `path`, default its local path) and matches its published checksum."""
    p = local_path(t) if path is None else path
    return p.is_file() and matches(t, *digests(p))


def fetch(name: str, force: bool = False, timeout_s: float = 60.0) -> Path:
    """Download a catalog trace into the data folder, verified, and return its path (already there and verified:
    no download unless `force`). Raises FetchError (one line: what to download, from where, to where)."""
    t = get(name)
    dest = local_path(t)
    if not force and verified(t, dest):
        return dest
    url = source_url(t)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FetchError(f"cannot create the data folder {dest.parent} ({e.strerror}); set KVLAB_DATA to a "
                         "writable folder") from None
    tmp = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp, open(tmp, "wb") as out:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                out.write(chunk)
    except (urllib.error.URLError, OSError, ValueError) as e:
        tmp.unlink(missing_ok=True)
        reason = getattr(e, "reason", None) or getattr(e, "strerror", None) or e
        raise FetchError(f"cannot download {t.name} from {url} ({reason}); offline? download that file by hand "
                         f"and save it as {dest} ({expected(t)})") from None
    sha, blob = digests(tmp)
    if not matches(t, sha, blob):
        tmp.unlink(missing_ok=True)
        raise FetchError(f"{t.name} from {url} does not match its published checksum (got sha256 {sha}, "
                         f"expected {expected(t)}); nothing was saved")
    os.replace(tmp, dest)
    return dest


def status() -> list[dict]:
    """One row per catalog trace: name, aliases, licence, source URL, local path and whether it is saved and
    verified."""
    rows = []
    for t in CATALOG.values():
        p = local_path(t)
        rows.append(dict(name=t.name, aliases=list(t.aliases), file=t.file, size=t.size, licence=t.licence,
                         url=t.url, sha256=t.sha256, git_blob=t.git_blob, path=str(p),
                         saved=p.is_file(), verified=verified(t, p), description=t.description))
    return rows
