"""Evaluation samples in kvpress's dataset columns, and task files that hold them (JSONL, one sample per line).

The columns are those kvpress's evaluation reads from a dataset row (NVIDIA/kvpress, evaluation/evaluate.py and
its benchmarks' create_huggingface_dataset.py): context, question, answer_prefix, answer (a string, or a list of
strings that must all appear), max_new_tokens. kvlab adds optional metadata: task, depth, id. A task file is UTF-8,
one JSON object per line with those keys (the optional ones absent or null; blank lines are skipped); anything
else is refused at the boundary with one SampleError naming the file, the line and the field.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..checks import need_int, need_number
from ..errors import SampleError

COLUMNS = ("context", "question", "answer_prefix", "answer", "max_new_tokens")  # kvpress's, all required
OPTIONAL = ("task", "depth", "id")  # kvlab's metadata
MAX_NEW_TOKENS = 65_536  # the most tokens a sample may ask for
MAX_ANSWERS = 1_024  # the most references one answer may list


def _need_text(field: str, value, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise SampleError(f"field {field!r} must be a string, got {type(value).__name__} {value!r:.60}")
    if not empty and not value.strip():
        raise SampleError(f"field {field!r} is empty")
    return value


def _need_answer(value) -> str | tuple[str, ...]:
    if isinstance(value, str):
        return _need_text("answer", value, empty=False)
    if not isinstance(value, (list, tuple)):
        raise SampleError(f"field 'answer' must be a string or a list of strings, got {type(value).__name__} "
                          f"{value!r:.60}")
    if not value:
        raise SampleError("field 'answer' is an empty list")
    if len(value) > MAX_ANSWERS:
        raise SampleError(f"field 'answer' lists {len(value):,} references (at most {MAX_ANSWERS:,})")
    return tuple(_need_text(f"answer[{i}]", v, empty=False) for i, v in enumerate(value))


@dataclass(frozen=True)
class Sample:
    """One evaluation sample: a context to compress, a question about it, and the answer the generation must hold."""
    context: str  # the text prefilled and compressed (non-empty)
    question: str  # read after the compressed context ("" when it is already inside the context)
    answer_prefix: str  # read after the question and the chat template's suffix; the generated text continues it
    answer: str | tuple[str, ...]  # the reference, or references that must all appear (a list is kept as a tuple)
    max_new_tokens: int  # the most tokens generated for it (greedy), 1 .. MAX_NEW_TOKENS
    task: str | None = None  # the task that generated it (kvlab.quality.tasks) or the user's label
    depth: float | None = None  # where the asked needle starts: its character offset / len(context), in [0, 1]
    id: str | int | None = None  # the sample's name within its set

    def __post_init__(self):
        _need_text("context", self.context, empty=False)
        _need_text("question", self.question)
        _need_text("answer_prefix", self.answer_prefix)
        object.__setattr__(self, "answer", _need_answer(self.answer))
        need_int("field 'max_new_tokens'", self.max_new_tokens, 1, MAX_NEW_TOKENS, error=SampleError)
        if self.task is not None:
            _need_text("task", self.task, empty=False)
        if self.depth is not None:
            need_number("field 'depth'", self.depth, 0.0, 1.0, error=SampleError)
        if self.id is not None and (isinstance(self.id, bool) or not isinstance(self.id, (str, int))):
            raise SampleError(f"field 'id' must be a string or an integer, got {type(self.id).__name__} "
                              f"{self.id!r:.60}")

    @property
    def answers(self) -> tuple[str, ...]:
        """The references as a tuple (one for a string answer)."""
        return (self.answer,) if isinstance(self.answer, str) else self.answer

    def to_dict(self) -> dict:
        """The sample as a task file's row: kvpress's columns, then the metadata that is set."""
        row = {c: getattr(self, c) for c in COLUMNS}
        row["answer"] = self.answer if isinstance(self.answer, str) else list(self.answer)
        row.update({c: getattr(self, c) for c in OPTIONAL if getattr(self, c) is not None})
        return row


def sample_from_dict(row) -> Sample:
    """A Sample from a task file's row (a dict): every column present, no unknown one, each value checked."""
    if not isinstance(row, dict):
        raise SampleError(f"a JSON {type(row).__name__} where a sample (a JSON object) belongs")
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise SampleError(f"missing column{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))} "
                          f"(a sample has {', '.join(COLUMNS)}; optional {', '.join(OPTIONAL)})")
    unknown = [c for c in row if c not in COLUMNS + OPTIONAL]
    if unknown:
        raise SampleError(f"unknown column{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))} "
                          f"(a sample has {', '.join(COLUMNS)}; optional {', '.join(OPTIONAL)})")
    return Sample(**row)


def read_samples(path: str | os.PathLike) -> list[Sample]:
    """The samples of a task file; any problem raises one SampleError naming the file, the line and the field."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SampleError(f"{path}: cannot read the task file: {e.strerror or e}") from None
    samples = []
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        where = f"{path}:{n}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SampleError(f"{where}: not UTF-8 text (a task file is JSONL: one JSON object per line)") from None
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise SampleError(f"{where}: not JSON ({e.msg} at column {e.colno}); a task file is JSONL: one JSON "
                              "object per line") from None
        try:
            samples.append(sample_from_dict(row))
        except SampleError as e:
            raise SampleError(f"{where}: {e}") from None
    if not samples:
        raise SampleError(f"{path}: the task file holds no samples")
    return samples


def dumps(samples) -> str:
    """Samples as JSONL text: one object per line, keys in column order, non-ASCII kept (deterministic bytes)."""
    lines = []
    for i, s in enumerate(samples):
        if not isinstance(s, Sample):
            raise SampleError(f"samples[{i}] is a {type(s).__name__}, not a Sample")
        lines.append(json.dumps(s.to_dict(), ensure_ascii=False, allow_nan=False) + "\n")
    return "".join(lines)


def write_samples(path: str | os.PathLike, samples, *, overwrite: bool = False) -> Path:
    """Write samples as a task file; an existing file is kept unless `overwrite` (written whole or not at all)."""
    path = Path(path)
    text = dumps(samples)
    if not text:
        raise SampleError(f"{path}: no samples to write")
    if path.exists() and not overwrite:
        raise SampleError(f"{path}: the file exists (pass overwrite=True to replace it)")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SampleError(f"{path}: cannot write the task file: {e.strerror or e}") from None
    return path
