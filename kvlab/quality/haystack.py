"""Haystacks for long-context tasks, and needles placed in them at chosen depths.

Two kinds of filler, both offline:
  * noise: RULER's repeated noise sentences (NVIDIA/RULER, scripts/data/synthetic/niah.py and
    variable_tracking.py, `type_haystack == 'noise'`: the five sentences below repeated, one block per line). Its
    unit is one sentence: a haystack of n sentences is n // 5 full lines and a last line of n % 5 sentences, so the
    length can be fitted to a token target within a sentence (about 5 tokens).
  * prose: real English text that ships with every Python installation, CPython's documentation topics
    (`pydoc_data/topics.py`, the text `help()` shows; PSF License Agreement), cleaned to prose paragraphs. RULER
    uses Paul Graham's essays, which it downloads; this one is on the machine already, never downloaded. Its unit is
    one word (as RULER's essay haystack: `haystack[:num_haystack]` words), cut into sentences at which needles go.
    The text is the running Python's documentation, so the same seed gives the same prose on the same Python version;
    `prose_source()` names the file, the version and the cleaned text's SHA-256 for the record.

`place` inserts needles between a haystack's units at fractional depths and reports where each landed.
"""
from __future__ import annotations

import functools
import hashlib
import re
import sys
from dataclasses import dataclass

NOISE = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")
PROSE_LICENSE = "PSF License Agreement (Python documentation, CPython's Lib/pydoc_data/topics.py)"

_WORD = re.compile(r"[A-Za-z][a-z]*(?:['’][a-z]+)?[,.;:]?")  # a plain English word, maybe with punctuation
_NOT_PROSE = re.compile(r"::=|>>>|\+-{3}|\||[*=\-~^]{4,}|://|/usr/")  # grammar, doctest, tables, headings, URLs
_META = re.compile(r"(New|Changed|Added) in version|Deprecated since|See also")
_SENTENCE_END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bcf\.)(?<!\bvs\.)(?<=[.!?])\s+(?=[A-Z\"(])")


def noise_lines(sentences: int) -> list[str]:
    """RULER's noise haystack of `sentences` sentences: full blocks of the five, one per line, then a partial line."""
    full, rest = divmod(sentences, len(NOISE))
    lines = [" ".join(NOISE)] * full
    return lines + [" ".join(NOISE[:rest])] if rest else lines


def _clean(paragraph: str) -> str | None:
    """One paragraph of the documentation as a line of prose, or None when it is not prose (code, grammar, tables,
    headings, lists, version notes, fragments)."""
    lines = [ln for ln in paragraph.split("\n") if ln.strip()]
    if not lines or len({len(ln) - len(ln.lstrip(" ")) for ln in lines}) != 1:
        return None  # code and nested blocks change indentation
    text = re.sub(r"\s+", " ", " ".join(ln.strip() for ln in lines)).strip()
    words = text.split()
    if (len(words) < 8 or not text.endswith(".") or not text[0].isupper() or _NOT_PROSE.search(text)
            or _META.match(text) or sum(bool(_WORD.fullmatch(w)) for w in words) < 0.75 * len(words)):
        return None
    text = re.sub(r"\*(\S(?:[^*]*\S)?)\*", r"\1", text)  # reST emphasis *word* -> word
    return re.sub(r" ?\[\d+\]", "", text)  # footnote marks


@functools.cache
def prose_sentences() -> tuple[str, ...]:
    """The cleaned documentation prose as sentences, in the file's order, each paragraph once."""
    from pydoc_data.topics import topics  # the stdlib's help() text; shipped with CPython

    paragraphs = dict.fromkeys(p for text in topics.values() for raw in re.split(r"\n[ \t]*\n", text)
                               if (p := _clean(raw)))
    return tuple(s for p in paragraphs for s in _SENTENCE_END.split(p))


@functools.cache
def prose_source() -> dict:
    """Where the prose comes from, for the record: file, Python version, licence, size and the SHA-256 of the
    cleaned sentences (joined by newlines)."""
    import pydoc_data.topics as t

    sents = prose_sentences()
    return {"file": t.__file__, "python": sys.version.split()[0], "license": PROSE_LICENSE, "sentences": len(sents),
            "words": sum(len(s.split()) for s in sents),
            "sha256": hashlib.sha256("\n".join(sents).encode()).hexdigest()}


def prose(start: int, words: int) -> list[str]:
    """`words` words of the prose from sentence `start` on (wrapping around at the end), as sentences; the last one
    is cut where the word count ends, as RULER cuts its essay haystack."""
    sents, out, left, i = prose_sentences(), [], words, start
    while left > 0:
        w = sents[i % len(sents)].split()
        out.append(" ".join(w[:left]))
        left -= len(w)
        i += 1
    return out


@dataclass(frozen=True)
class Needle:
    """A text to put into a haystack."""
    depth: float  # where: 0 = before the first unit, towards 1 = after the last ([0, 1))
    text: str  # what


def place(units: list[str], needles: list[Needle], joiner: str) -> tuple[str, list[int]]:
    """`units` joined by `joiner`, each needle inserted as a unit of its own at slot floor(depth x (len(units) + 1))
    (slot k: after k units; needles in one slot keep their order); returns the text and each needle's character
    offset in it."""
    slots = len(units) + 1
    order = sorted(range(len(needles)), key=lambda j: (min(int(needles[j].depth * slots), slots - 1), j))
    pieces, where, k = [], {}, 0
    for j in order:
        slot = min(int(needles[j].depth * slots), slots - 1)
        pieces += units[k:slot]
        k = slot
        where[j] = len(pieces)
        pieces.append(needles[j].text)
    pieces += units[k:]
    starts, pos = [], 0
    for p in pieces:
        starts.append(pos)
        pos += len(p) + len(joiner)
    return joiner.join(pieces), [starts[where[j]] for j in range(len(needles))]
