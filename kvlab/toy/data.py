"""Training text every Python installation has, and the byte-level tokenizer.

The corpus is read from the running interpreter, never copied into the repository:
  code  the standard library's ``*.py`` files under ``sysconfig.get_paths()["stdlib"]`` (subpackages
        included; tests, site-packages, the generated ``encodings`` tables and build config left out);
  docs  the language reference text that ``help()`` shows (``pydoc_data.topics``, one document per
        topic) and the docstrings of the built-in C modules (module, then each public member with its
        signature, via ``inspect``).
Each document goes to train or held-out by a seeded hash of its name, so held-out perplexity is measured
on files the model never saw. `Corpus.sha256` fingerprints the text and `Corpus.python` names the
interpreter it came from; both go into every checkpoint's training record.

Tokens are bytes (vocabulary 256, no special tokens): nothing to train or ship, and `save_tokenizer`
writes an equivalent ``tokenizer.json`` so `transformers.AutoTokenizer` loads a checkpoint's tokenizer
the same way as a Hub model's.
"""
from __future__ import annotations

import hashlib
import inspect
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from ..checks import need_choice, need_int, need_number

VOCAB = 256  # byte-level: one token per byte value
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "encodings",
             "pydoc_data"}  # pydoc_data is read as docs, not code
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # object reprs in docstrings: volatile, dropped


# --- tokenizer --------------------------------------------------------------------------------------
class ByteTokenizer:
    """Text <-> token ids, one id per UTF-8 byte (ids 0-255)."""

    vocab_size = VOCAB

    def encode(self, text: str | bytes) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else bytes(text))

    def decode(self, ids) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def __call__(self, text: str | bytes) -> torch.Tensor:
        """ids [T] as a long tensor."""
        return torch.tensor(self.encode(text), dtype=torch.long)


def save_tokenizer(path: str | Path) -> None:
    """Write tokenizer.json + tokenizer_config.json: a byte-level tokenizer with id == byte value, loadable
    by `transformers.AutoTokenizer` (a BPE without merges over GPT-2's byte-to-character alphabet)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = ByteLevel.alphabet()  # the 256 printable stand-ins, one per byte value
    by_byte = _bytes_to_unicode()
    assert sorted(alphabet) == sorted(by_byte.values())
    vocab = {by_byte[b]: b for b in range(VOCAB)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=1 << 30).save_pretrained(str(path))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the alphabet of tokenizers' ByteLevel)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


# --- corpus -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Document:
    """One file or doc page of the corpus."""

    name: str  # "code:asyncio/tasks.py", "docs:topic:assignment", "docs:module:math"
    text: str  # its text


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def code_documents() -> list[Document]:
    """The standard library's .py files (sorted by path)."""
    root = stdlib_root()
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if SKIP_DIRS.intersection(rel.parts[:-1]) or rel.parts[0].startswith("config-"):
            continue
        try:
            text = p.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out.append(Document(f"code:{rel.as_posix()}", text))
    return out


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def docs_documents() -> list[Document]:
    """help()'s language reference topics and the built-in C modules' docstrings."""
    out = []
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a Python built without the docs data
        topics = {}
    for key in sorted(topics):
        out.append(Document(f"docs:topic:{key}", topics[key].strip() + "\n"))
    for name in sorted(sys.builtin_module_names):
        mod = __import__(name)
        parts = [f"Module {name}\n\n{inspect.getdoc(mod) or ''}\n"]
        for attr in sorted(a for a in dir(mod) if not a.startswith("_")):
            # the pristine original where the module keeps one (sys.__excepthook__ ...): test runners swap hooks
            obj = getattr(mod, f"__{attr}__", None) or getattr(mod, attr, None)
            # the module's own functions and classes only
            own = (inspect.isbuiltin(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", None) == name
            doc = inspect.getdoc(obj) if own else None
            if doc:
                parts.append(f"{name}.{attr}{_signature(obj)}\n    " + doc.replace("\n", "\n    ") + "\n")
        text = ADDRESS.sub("", "\n".join(parts))
        if len(text) > 200:
            out.append(Document(f"docs:module:{name}", text))
    return out


def _heldout(name: str, seed: int, fraction: float) -> bool:
    """A stable, seeded coin per document name (independent of what else the corpus holds)."""
    h = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big")
    return h / 2**64 < fraction


@dataclass(frozen=True)
class Corpus:
    """The natural-text corpus, split by document into train and held-out."""

    train: bytes  # training documents, concatenated (each followed by a blank line)
    heldout: bytes  # held-out documents, concatenated
    train_docs: int  # documents in train
    heldout_docs: int  # documents held out
    sha256: str  # hash of every document's name and text, in order
    python: str  # interpreter version the text came from (platform.python_version())
    split_seed: int  # seed of the train / held-out coin
    heldout_fraction: float  # probability a document is held out
    names: tuple[str, ...] = field(default=(), repr=False)  # held-out document names

    def split(self, which: str) -> bytes:
        need_choice("split", which, ("train", "heldout"))
        return self.train if which == "train" else self.heldout

    def text(self, which: str = "heldout", max_bytes: int | None = None) -> str:
        """A split as text (e.g. for a Hub model's own tokenizer), optionally its first `max_bytes`."""
        data = self.split(which)
        max_bytes = len(data) if max_bytes is None else need_int("max_bytes", max_bytes, 1)
        return data[:max_bytes].decode("utf-8", errors="ignore")

    def windows(self, which: str, n: int, length: int, seed: int) -> torch.Tensor:
        """`n` windows of `length` bytes at seeded random offsets of a split: ids [n, length]."""
        need_int("n", n, 1)
        need_int("length", length, 2)
        data = self.split(which)
        if len(data) <= length:
            raise ValueError(f"the {which} split holds {len(data)} bytes, fewer than a window of {length}")
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, len(data) - length, (n,), generator=g)
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return torch.stack([buf[s:s + length] for s in starts.tolist()]).long()

    def record(self) -> dict:
        """What a checkpoint records about its data."""
        return dict(python=self.python, sha256=self.sha256, train_bytes=len(self.train),
                    heldout_bytes=len(self.heldout), train_docs=self.train_docs, heldout_docs=self.heldout_docs,
                    split_seed=self.split_seed, heldout_fraction=self.heldout_fraction)


@lru_cache(maxsize=4)
def load_corpus(seed: int = 0, heldout_fraction: float = 0.1, sources: tuple[str, ...] = ("code", "docs")) -> Corpus:
    """Read the corpus from this interpreter and split it (cached per arguments)."""
    import platform
    need_int("seed", seed)
    need_number("heldout_fraction", heldout_fraction, 0.0, 1.0, lo_open=True)
    for s in sources:
        need_choice("source", s, ("code", "docs"))
    docs = (code_documents() if "code" in sources else []) + (docs_documents() if "docs" in sources else [])
    h = hashlib.sha256()
    train, held, names = [], [], []
    for d in docs:
        h.update(d.name.encode() + b"\0" + d.text.encode("utf-8", errors="replace") + b"\0")
        blob = d.text.encode("utf-8", errors="replace") + b"\n\n"
        if _heldout(d.name, seed, heldout_fraction):
            held.append(blob)
            names.append(d.name)
        else:
            train.append(blob)
    return Corpus(b"".join(train), b"".join(held), len(train), len(held), h.hexdigest(), platform.python_version(),
                  seed, heldout_fraction, tuple(names))
