"""The samples of tests/fixtures/kvpress_smollm2*.json, written by kvlab (in its venv; `make oracle-kvpress-quality`).

    python tests/oracles/kvpress_quality_samples.py OUT.jsonl [N] [TOKENS]

N samples of niah_single_2 and N of niah_multikey_1 (kvlab.quality.tasks.generate, seed 0, contexts of TOKENS tokens,
1,024 unless given, as SmolLM2-135M's chat template prefills them), interleaved so that any first 2k samples hold k
of each, with max_new_tokens 32 instead of RULER's 128: the answer is a 7-digit number right after the answer prefix,
and on 2 busy cores a press that makes the model ramble would otherwise spend most of the run decoding text that
cannot matter. A larger N gives the same first samples (a run extended with kvpress_quality.py --start).
Prints the SmolLM2 model folder (converted on first use) for the kvpress run.
"""
import sys

from transformers import AutoTokenizer

from kvlab.hf.pretrained import resolve_model
from kvlab.quality.samples import write_samples
from kvlab.quality.tasks import generate

TASKS = ("niah_single_2", "niah_multikey_1")
SEED, MAX_NEW_TOKENS = 0, 32

if __name__ == "__main__":
    out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
    folder = resolve_model("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(folder)
    sets = [generate(t, tok, tokens, n, SEED, MAX_NEW_TOKENS) for t in TASKS]
    write_samples(out, [s for group in zip(*sets) for s in group], overwrite=True)
    print(folder)
