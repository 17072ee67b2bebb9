"""Public request traces: where each is published, its licence and checksum; fetched into a user data folder.

A clone of kvlab holds no trace data. `fetch(name)` downloads a trace from its pinned source into
`data_dir() / "traces"` (the folder in $KVLAB_DATA, else the platform's cache folder: $XDG_CACHE_HOME/kvlab or
~/.cache/kvlab on Linux, ~/Library/Caches/kvlab on macOS, %LOCALAPPDATA%\\kvlab\\Cache on Windows), verifying it
against its SHA-256 (or, where only the publisher's git blob id is known, against that) before it is kept;
readers then find it by name (`kvlab simulate --trace mooncake-conversation`). $KVLAB_TRACE_MIRROR (a folder or a
URL prefix) fetches the same files from a local mirror instead, checked the same way.

A name is read from the first copy found (`locate`): the data folder's, else a developer's mirror beside the
repository (MIRROR_DIR, ../shared/traces; a user's clone has none). That copy is used only when it matches its
published checksum; one that does not is refused with one line saying which file and how to replace it
(`kvlab traces fetch NAME --force`), never read without a word. `kvlab traces list` shows the same answer.

Sources (each URL pins the commit the checksum was taken from):
  Mooncake FAST'25 traces - github.com/kvcache-ai/Mooncake, FAST25-release/traces/ at commit 3cca71d, Apache-2.0;
    the arXiv technical report's trace is mooncake_trace.jsonl at the repository root of the same commit.
  Azure LLM inference traces 2023 (Splitwise, ISCA'24) - github.com/Azure/AzurePublicDataset, data/, at commit
    7909210, CC-BY-4.0.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..checks import need_choice, need_out_dir
from ..resources import data_dir  # where kvlab keeps downloaded data (one rule for traces and models)
from ..errors import KvlabError

MOONCAKE = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/"
AZURE = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/790921015d50dd6aae7f7e47f39ba0e235ad6b08/"
REPO_ROOT = Path(__file__).resolve().parents[2]
MIRROR_DIR = REPO_ROOT.parent / "shared" / "traces"  # a developer's local mirror only (a user's clone has none)


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
    """The catalog entry for a name, an alias or a published file name (None if none)."""
    name = str(name)
    t = CATALOG.get(ALIASES.get(name, name))
    return t or next((t for t in CATALOG.values() if t.file == name), None)


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


_DIGESTS: dict[tuple, tuple[str, str]] = {}  # (path, size, mtime_ns, inode) -> digests: a file is hashed once


def digests(path: Path) -> tuple[str, str]:
    """(SHA-256, git blob id) of a file."""
    st = Path(path).stat()
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _DIGESTS:
        d = _Digest(st.st_size)
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                d.update(chunk)
        _DIGESTS[key] = d.sha.hexdigest(), d.git.hexdigest()
    return _DIGESTS[key]


def matches(t: PublicTrace, sha256: str, git_blob: str) -> bool:
    """Whether digests are the published file's: its SHA-256 where known, else its git blob id."""
    return sha256 == t.sha256 if t.sha256 else git_blob == t.git_blob


def expected(t: PublicTrace) -> str:
    return f"sha256 {t.sha256}" if t.sha256 else f"git blob {t.git_blob}"


def verified(t: PublicTrace, path: Path | None = None) -> bool:
    """Whether the trace is saved (at `path`, default its local path) and matches its published checksum."""
    p = local_path(t) if path is None else path
    return p.is_file() and matches(t, *digests(p))


@dataclass(frozen=True)
class Copy:
    """Where a catalog trace is read from: the first copy found, and whether it may be read."""

    trace: PublicTrace  # the catalog entry
    path: Path | None  # the copy readers take (None: no copy anywhere)
    where: str  # "data folder" or "developer mirror" ("" when no copy)
    verified: bool  # it matches the published checksum (only then is it read)
    got: str  # what the copy hashes to, in the form `expected` gives ("" when no copy)

    def refusal(self) -> str:
        """The one line that refuses an unverified copy."""
        return (f"{self.path}: the {self.where} copy of {self.trace.name} does not match its published checksum "
                f"(it has {self.got}, expected {expected(self.trace)}); `kvlab traces fetch {self.trace.name} "
                "--force` saves a verified copy in the data folder, or give the file's path to read it as it is")


def locate(t: PublicTrace, mirror: str | Path | None = None) -> Copy:
    """The copy a reader takes for `t`: the data folder's, else the mirror's (default MIRROR_DIR), checked against
    the published checksum."""
    m = MIRROR_DIR if mirror is None else Path(mirror)
    for where, p in (("data folder", local_path(t)), ("developer mirror", m / t.file)):
        if p.is_file():
            sha, blob = digests(p)
            got = f"sha256 {sha}" if t.sha256 else f"git blob {blob}"
            return Copy(t, p, where, matches(t, sha, blob), got)
    return Copy(t, None, "", False, "")


def _check_destination(t: PublicTrace, dest: Path) -> Path:
    """Before any download: the data folder can take the file, and neither the file nor its .part is a folder or
    anything but a plain file kvlab may replace. Returns the .part path."""
    need_out_dir("the data folder (KVLAB_DATA)", dest.parent, FetchError)
    tmp = dest.with_name(dest.name + ".part")
    for p in (dest, tmp):
        if p.is_symlink() or (p.exists() and not p.is_file()):
            what = "a folder" if p.is_dir() and not p.is_symlink() else "not a plain file"
            raise FetchError(f"cannot save {t.name}: {p} is {what}; move it away or set KVLAB_DATA to another "
                             "folder")
    return tmp


def fetch(name: str, force: bool = False, timeout_s: float = 60.0) -> Path:
    """Download a catalog trace into the data folder, verified, and return its path (already there and verified:
    no download unless `force`; a saved copy that fails its checksum is replaced). Every path is checked before the
    download starts, and a failed download leaves nothing behind. Raises FetchError (one line: what to download,
    from where, to where)."""
    t = get(name)
    dest = local_path(t)
    tmp = _check_destination(t, dest)
    if not force and verified(t, dest):
        return dest
    url = source_url(t)
    made = [q for q in (dest.parent, *dest.parent.parents) if not os.path.lexists(q)]  # folders this call makes
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FetchError(f"cannot create the data folder {dest.parent} ({e.strerror}); set KVLAB_DATA to a "
                         "writable folder") from None
    try:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp, open(tmp, "wb") as out:
                for chunk in iter(lambda: resp.read(1 << 20), b""):
                    out.write(chunk)
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or getattr(e, "strerror", None) or e
            raise FetchError(f"cannot download {t.name} from {url} ({reason}); offline? download that file by hand "
                             f"and save it as {dest} ({expected(t)})") from None
        sha, blob = digests(tmp)
        if not matches(t, sha, blob):
            raise FetchError(f"{t.name} from {url} does not match its published checksum (got sha256 {sha}, "
                             f"expected {expected(t)}); nothing was saved")
        os.replace(tmp, dest)
    finally:
        if tmp.is_file() and not tmp.is_symlink():  # a download cut short or refused: no .part left behind
            tmp.unlink()
        if not dest.is_file():  # nor the folders made for it
            for q in made:
                try:
                    q.rmdir()
                except OSError:
                    break
    return dest


def status(mirror: str | Path | None = None) -> list[dict]:
    """One row per catalog trace: name, aliases, licence, source URL, where `fetch` saves it (path, saved,
    verified) and where readers take it from (read_from, read_from_kind, usable: verified there)."""
    rows = []
    for t in CATALOG.values():
        p = local_path(t)
        c = locate(t, mirror)
        rows.append(dict(name=t.name, aliases=list(t.aliases), file=t.file, size=t.size, licence=t.licence,
                         url=t.url, sha256=t.sha256, git_blob=t.git_blob, path=str(p),
                         saved=p.is_file(), verified=verified(t, p), description=t.description,
                         read_from=None if c.path is None else str(c.path), read_from_kind=c.where or None,
                         usable=c.verified, checksum=None if c.path is None else c.got))
    return rows
