"""Small models trained here: data every Python has, long-context tasks, three architectures, one recipe.

Public API (stable; other kvlab modules and notebooks use only these names):

  data     load_corpus(seed=0) -> Corpus      stdlib source + docs of the running interpreter, split by document
             Corpus.windows(split, n, length, seed) -> ids [n, length]; Corpus.text(split, max_bytes) -> str
             Corpus.record() -> dict (python version, sha256, sizes)
           ByteTokenizer (encode / decode, vocab 256); save_tokenizer(path) (AutoTokenizer-loadable)
  tasks    TASKS: "mqar", "needle", "vartrack", "recall", "niah" -> Task(generate(seed, length, **options) -> Sample,
             chance())
             Task.samples(seed, n, length) -> [Sample]; render(sample, encode=None) -> (ids [T], labels [T])
             batch(samples, encode=None) -> (ids [B, T], labels [B, T]); labels are -100 except answer tokens
           score(logits [B, T, V], labels) -> accuracy (an answer counts when all its tokens are right, greedy,
             teacher forced); score_predictions(pred [B, T], labels) -> (right, answers)
  sizes    SIZES ("tiny", "small", "base") -> Size (width, depth, heads: shared by every architecture)
  models   ARCHS ("dense", "mla", "v41"), make_config(arch, size),
           build_model(arch, size, seed) -> a transformers PreTrainedModel (float32)
  v41      KvlabV41Config / KvlabV41ForCausalLM (model_type "kvlab_v41", registered with AutoConfig and
           AutoModelForCausalLM when kvlab.train is imported); to_stack(model, formats) -> kvlab.attention Stack
           with the trained weights (cached prefill / decode in packed KV formats, cache_bytes())
  probe    copy_probe(model, seed, n, length, corpus) -> CopyProbe(first, second, accuracy; gain): a random string
             planted twice inside held-out text at random offset, length and gap, the probe of induction (does the
             model copy from its context at all?); copy_rows(corpus, split, seed, n, length) -> (ids, plans)
  loop     TrainConfig, train(cfg, stop_after=None) -> Result, save(result, path), evaluate(model, corpus, ...),
           load_record(path) -> (TrainConfig, curve, record), retrain(path, steps)
  CHECKPOINTS  data/checkpoints/<name>/ (qwen3-tiny, deepseek-v3-tiny, kvlab-v41-tiny): config.json,
           model.safetensors (bf16), tokenizer.json, loss_curve.json, train_record.json; `make train` rebuilds them

Load a checkpoint the way any transformers model loads (after `import kvlab.train` for the V4.1-like one):
    AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32); AutoTokenizer.from_pretrained(path)
Its KV bytes: `kvlab bytes PATH` (kvlab.layout reads its config.json).
"""
from ..toy import v41  # noqa: F401  (registers model_type "kvlab_v41" with transformers' Auto classes)
from ..toy.data import ByteTokenizer, Corpus, load_corpus, save_tokenizer
from .loop import Result, TrainConfig, evaluate, load_record, retrain, save, train
from .models import ARCHS, build_model, make_config
from .probe import CopyProbe, copy_probe, copy_rows
from ..toy.sizes import SIZES
from ..toy.tasks import TASKS, Sample, batch, get_task, render, score, score_predictions

CHECKPOINTS = "data/checkpoints"  # relative to the repository root (kvlab.models.DATA_DIR / "checkpoints")

__all__ = ["ByteTokenizer", "Corpus", "load_corpus", "save_tokenizer", "Result", "TrainConfig", "evaluate",
           "load_record", "retrain", "save", "train", "ARCHS", "SIZES", "build_model", "make_config", "CopyProbe",
           "copy_probe", "copy_rows", "TASKS",
           "Sample", "batch", "get_task", "render", "score", "score_predictions", "CHECKPOINTS", "checkpoint_dir"]


def checkpoint_dir(name: str):
    """The committed checkpoint directory data/checkpoints/<name> (a Path; it may not exist)."""
    from ..models import DATA_DIR
    return DATA_DIR / "checkpoints" / name
