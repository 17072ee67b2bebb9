"""Scoring a generated text against a sample's answer, as RULER scores it.

RULER (NVIDIA/RULER) normalizes the prediction in scripts/eval/evaluate.py, `postprocess_pred` (strip; every
control character U+0000-U+001F replaced by a newline; strip again), and its metrics in
scripts/eval/synthetic/constants.py compare lower-cased strings: a reference counts when `ref.lower()` is a
substring of `pred.lower()`. `string_match_all` (niah, variable tracking, common words) scores a sample by the share
of its references found; `string_match_part` (QA) by whether any is found; both report the mean over samples in
percent, rounded to 2 decimals. kvlab does the same, with one reading for the answer: a string is one reference (a
list is several; RULER's references are always lists).

kvpress's evaluation of RULER (NVIDIA/kvpress, evaluation/benchmarks/ruler/calculate_metrics.py) scores alike but
deletes control characters instead of turning them into newlines, so "12\\n34" holds "1234" there and not here; the
two agree on every text without control characters inside it (tests/fixtures/quality_oracle.json records both).
"""
from __future__ import annotations

import re

from ..errors import SampleError

_CONTROL = re.compile(r"[\x00-\x1f]")


def normalize(text: str) -> str:
    """A generated text as RULER compares it: stripped, control characters as newlines, stripped, lower-cased."""
    if not isinstance(text, str):
        raise SampleError(f"the generated text must be a string, got {type(text).__name__}")
    return _CONTROL.sub("\n", text.strip()).strip().lower()


def references(answer) -> tuple[str, ...]:
    """An answer's references: a string is one, a list or tuple of strings several (none empty)."""
    refs = (answer,) if isinstance(answer, str) else answer
    if not isinstance(refs, (list, tuple)) or not refs or not all(isinstance(r, str) and r for r in refs):
        raise SampleError(f"an answer is a non-empty string or a non-empty list of them, got {answer!r:.60}")
    return tuple(refs)


def found(text: str, answer) -> list[bool]:
    """For each reference of `answer`, whether the generated text contains it (RULER's comparison)."""
    pred = normalize(text)
    return [r.lower() in pred for r in references(answer)]


def is_right(text: str, answer) -> bool:
    """Right when the generated text contains the answer: for a list, every reference."""
    return all(found(text, answer))


def match_all(text: str, answer) -> float:
    """RULER's string_match_all for one sample, as a share: references found / references."""
    hits = found(text, answer)
    return sum(1.0 if h else 0.0 for h in hits) / len(hits)


def match_part(text: str, answer) -> float:
    """RULER's string_match_part for one sample: 1.0 when any reference is found, else 0.0."""
    return 1.0 if any(found(text, answer)) else 0.0


def _mean_percent(scores: list[float]) -> float:
    if not scores:
        raise SampleError("no predictions to score")
    return round(sum(scores) / len(scores) * 100, 2)


def string_match_all(texts, answers) -> float:
    """RULER's string_match_all over samples: mean share of references found, in percent, rounded to 2 decimals."""
    texts, answers = list(texts), list(answers)
    if len(texts) != len(answers):
        raise SampleError(f"{len(texts)} predictions for {len(answers)} answers")
    return _mean_percent([match_all(t, a) for t, a in zip(texts, answers)])


def string_match_part(texts, answers) -> float:
    """RULER's string_match_part over samples: share of samples with any reference found, in percent, 2 decimals."""
    texts, answers = list(texts), list(answers)
    if len(texts) != len(answers):
        raise SampleError(f"{len(texts)} predictions for {len(answers)} answers")
    return _mean_percent([match_part(t, a) for t, a in zip(texts, answers)])
