"""Evaluation on long-context tasks: what compression costs in answers, kept apart from the cache that compresses.

What lives here (it may use kvlab.hf's public API, never its internals, and never kvlab.train):
  samples   Sample, kvpress's dataset columns (context, question, answer_prefix, answer, max_new_tokens) plus task /
            depth / id metadata; task files (JSONL) read and written with validation at the boundary.
  scoring   RULER's string matching: a generation is right when it contains the answer (every reference of a list).
  prompt    the prompt split as kvpress's pipeline splits it (chat template or BOS), and the protocol that says
            where the question goes: question-agnostic (default, kvpress's) or question-aware.
  haystack  offline filler: RULER's noise sentences and CPython's documentation prose; needles placed at depths.
  tasks     the task registry and the loop that sizes each sample to a token target for a real tokenizer, seeded.
  ruler     RULER's tasks (niah single / multikey / multivalue / multiquery, variable tracking, common words).
Next, from another engineer: the evaluation loop (prefill the context, compress, read the question, generate
greedily, score) and the accuracy-bytes frontier.
"""
from . import ruler  # noqa: F401  (registers RULER's tasks in kvlab.quality.tasks.TASKS)
