"""Training: one seeded recipe for every architecture, so their quality compares at equal budget.

Each step sees `batch_tokens` tokens at one sequence length: the length curriculum `stages` (short rows first:
induction heads form far sooner in short rows) or, without stages, `lengths` in rotation. A step's rows are natural
text (random windows of the corpus' train split), copy rows (text with a random string planted twice at a random
offset, length and gap: kvlab.train.probe) and rows of the long-context tasks. The loss is the text cross-entropy
(every next byte) + `copy_weight` x the copy rows' every-byte loss + `task_weight` x the task loss on answer tokens +
`task_dense` x the task rows' every-byte loss (dense supervision: the question repeats the key it looks up), plus any
auxiliary loss the model returns (the V4.1-like indexer's). AdamW with linear warm-up and cosine decay; gradients
clipped. Every batch comes from seeds derived from (seed, step), and the weights from torch.manual_seed(seed): two
runs of one config on one machine and thread count give the same curve; across CPUs the floats drift, so curves are
compared with a tolerance. Records written before a field existed load with `LEGACY`'s value for it (the recipe of
that time), so a committed checkpoint's first steps rerun as they were.

`train(cfg)` returns a `Result`; `save(result, path)` writes save_pretrained's config.json + safetensors
(cast to `cfg.save_dtype`), tokenizer files, loss_curve.json and train_record.json (its "volatile" part —
wall time, threads, date — differs between runs; everything else is reproducible). The record's "final" is the last
evaluation (float32) with, under the save dtype's name, the same evaluation of the saved weights computing in it.
"""
from __future__ import annotations

import copy
import json
import math
import pickle
import random
import time
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from pathlib import Path

import torch
import torch.nn.functional as F

from ..checks import need_choice, need_int, need_number
from ..errors import ParameterError
from ..toy import tasks as T
from ..toy.data import load_corpus, save_tokenizer
from ..toy.sizes import SIZES
from .models import ARCHS, NAMES, build_model, count_parameters
from .probe import copy_probe, copy_rows

CURVE_FILE = "loss_curve.json"
RECORD_FILE = "train_record.json"


Stage = tuple[int, int]  # (until_step, length): steps before until_step train at this sequence length

# short rows first (64-token rows until the copy head has formed), then up to the evaluation length
RECIPE_STAGES: tuple[Stage, ...] = ((2000, 64), (2600, 128), (3200, 256), (3600, 512), (4000, 1024))
# values of fields a record written before they existed implies (the recipe of that time)
LEGACY = {"stages": (), "copy_fraction": 0.0, "task_dense": 0.0, "beta2": 0.95, "copy_weight": 1.0,
          "eval_tasks": ("mqar", "needle", "vartrack"), "copy_span": (0.125, 0.5), "task_min_length": 16,
          "copy_short": 0, "edge_fraction": 0.0, "edge_min_length": 1024,
          "eval_depth_samples": 0, "eval_copy_strings": 8}


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Defaults: the recipe of the committed checkpoints (issue 20: models that retrieve; measured
    in docs/training-notes.md): at 1 CPU thread about 31 min dense, 44 min MLA, 75 min V4.1-like."""

    arch: str = "dense"  # one of models.ARCHS
    size: str = "tiny"  # one of sizes.SIZES
    steps: int = 4000  # optimizer steps
    batch_tokens: int = 4096  # tokens per step (rows = batch_tokens // length)
    lengths: tuple[int, ...] = (128, 256, 512)  # without stages: sequence length of step i is lengths[i % len]
    stages: tuple[Stage, ...] = RECIPE_STAGES  # length curriculum (until_step, length), increasing; last one holds
    copy_fraction: float = 0.5  # share of each step's rows that are copy rows (kvlab.train.mix)
    copy_weight: float = 1.0  # weight of the copy rows' every-token loss
    copy_span: tuple[float, float] = (0.125, 0.5)  # planted string length, as fractions of the row (uniform)
    copy_short: int = 64  # the shortest planted string is at most this many bytes (0: no cap), so long rows still
    #                      practise short look-backs
    task_fraction: float = 0.25  # share of each step's rows given to the tasks
    tasks: tuple[str, ...] = ("niah", "recall", "niah", "recall", "vartrack", "mqar")  # task rows, in rotation
    task_min_length: int = 128  # rows shorter than this carry no task (their task share goes to copy rows)
    edge_fraction: float = 1.0  # share of the niah rows of at least edge_min_length tokens whose asked fact sits in
    #                             the first or last tenth of the filler (uniform depth otherwise)
    edge_min_length: int = 1024  # the shortest row that edge_fraction applies to
    task_weight: float = 1.0  # weight of the task loss (answer tokens) beside the text loss
    task_dense: float = 1.0  # weight of a task row's every-token loss (dense supervision of its copied spans)
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # learning rate at the end of the cosine
    warmup: int = 100  # linear warm-up steps
    beta2: float = 0.98  # AdamW's second-moment decay (beta1 0.9)
    weight_decay: float = 0.1  # AdamW decoupled weight decay (matrices only)
    grad_clip: float = 1.0  # global gradient-norm clip
    seed: int = 0  # weights, data order and task samples
    corpus_seed: int = 0  # train / held-out split of the corpus
    eval_every: int = 250  # steps between evaluations (and at the end)
    eval_windows: int = 16  # held-out text windows per evaluation
    eval_samples: int = 32  # samples per task per evaluation
    eval_length: int = 1024  # tokens per held-out window, task sample and copy-probe row at evaluation
    eval_tasks: tuple[str, ...] = ("niah", "recall", "mqar", "needle", "vartrack")  # tasks scored at evaluation
    eval_depth_samples: int = 8  # niah samples per depth decile (0: no depth sweep)
    eval_copy_strings: int = 16  # copy-probe strings per evaluation
    device: str = "cpu"  # torch device ("cuda" scales up)
    save_dtype: str = "bfloat16"  # dtype of the saved weights ("float32" keeps them exact)

    def __post_init__(self):
        need_choice("arch", self.arch, ARCHS)
        need_choice("size", self.size, SIZES)
        need_int("steps", self.steps, 1)
        for n in ("batch_tokens", "warmup", "eval_every", "eval_windows", "eval_samples", "eval_length",
                  "eval_depth_samples", "eval_copy_strings", "task_min_length", "copy_short",
                  "edge_min_length"):
            need_int(n, getattr(self, n), 0 if n in ("warmup", "eval_depth_samples", "copy_short") else 1)
        if not self.lengths and not self.stages:
            raise ParameterError("lengths (or stages) must name at least one sequence length")
        prev = 0
        for until, n in self.stages:
            need_int("stage until_step", until, prev + 1)
            prev = until
        for n in tuple(self.lengths) + tuple(n for _, n in self.stages):
            need_int("length", n, 16)
            if n > self.batch_tokens:
                raise ParameterError(f"length {n} is more than batch_tokens = {self.batch_tokens}")
            if self.batch_tokens // n >= 1000:
                raise ParameterError(f"{self.batch_tokens // n} rows of {n} a step: at most 999 (row seeds)")
        need_number("task_fraction", self.task_fraction, 0.0, 1.0)
        need_number("copy_fraction", self.copy_fraction, 0.0, 1.0)
        need_number("edge_fraction", self.edge_fraction, 0.0, 1.0)
        if self.task_fraction + self.copy_fraction > 1.0:
            raise ParameterError("task_fraction + copy_fraction is more than 1")
        for t in self.tasks + self.eval_tasks:
            need_choice("task", t, T.TASKS)
        if self.task_fraction > 0 and not self.tasks:
            raise ParameterError("task_fraction > 0 needs at least one task")
        for n in ("lr", "min_lr", "task_weight", "task_dense", "copy_weight", "weight_decay", "grad_clip"):
            need_number(n, getattr(self, n), 0.0)
        need_number("beta2", self.beta2, 0.0, 1.0, lo_open=True)
        lo, hi = self.copy_span
        if not 0.0 < need_number("copy_span", lo) <= need_number("copy_span", hi) < 0.5 + 1e-9:
            raise ParameterError(f"copy_span = {self.copy_span}: need 0 < shortest <= longest <= 0.5")
        need_choice("save_dtype", self.save_dtype, ("bfloat16", "float32"))

    @property
    def name(self) -> str:
        """Checkpoint directory name: <architecture stem>-<size>."""
        return f"{NAMES[self.arch]}-{self.size}"

    @property
    def tokens(self) -> int:
        """Tokens seen in training (whole rows per step)."""
        return sum(self.batch_tokens // self.length(i) * self.length(i) for i in range(self.steps))

    @property
    def max_length(self) -> int:
        """Longest training row."""
        return max(tuple(self.lengths if not self.stages else ()) + tuple(n for _, n in self.stages))

    def length(self, step: int) -> int:
        """Sequence length of step `step`: its stage's, or lengths cycled when there are no stages."""
        if not self.stages:
            return self.lengths[step % len(self.lengths)]
        return next((n for until, n in self.stages if step < until), self.stages[-1][1])

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        p = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * min(1.0, p)))

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("lengths", "tasks", "eval_tasks", "copy_span"):
            d[k] = list(d[k])
        d["stages"] = [list(s) for s in self.stages]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = {**LEGACY, **d}
        for k in ("lengths", "tasks", "eval_tasks", "copy_span"):
            d[k] = tuple(d[k])
        d["stages"] = tuple(tuple(s) for s in d["stages"])
        return cls(**d)


@dataclass
class Result:
    """A trained model with its curve and record."""

    model: torch.nn.Module  # float32, on cfg.device
    config: TrainConfig  # how it was trained
    curve: dict  # per-step losses and learning rates; evaluations
    record: dict  # reproducible facts (and a "volatile" part)
    final: dict = field(default_factory=dict)  # last evaluation


# --- batches ------------------------------------------------------------------------------------------
TEXT, COPY, TASK = 0, 1, 2  # row kinds


def step_batch(cfg: TrainConfig, corpus, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step `step`'s batch: ids [R, L], labels [R, L] (IGNORE where not learned) and each row's kind [R] (TEXT,
    COPY, TASK). Text and copy rows are labelled everywhere, task rows on their answers."""
    length = cfg.length(step)
    rows = cfg.batch_tokens // length
    tasks_here = bool(cfg.tasks) and cfg.task_fraction > 0 and length >= cfg.task_min_length
    task_rows = rows * Fraction(str(cfg.task_fraction)) if tasks_here else Fraction(0)  # task rows a step, on average
    n_task = _share(step, task_rows)
    copy_share = cfg.copy_fraction + (0 if tasks_here else cfg.task_fraction)
    n_copy = min(rows - n_task, _share(step, rows * Fraction(str(copy_share))))
    n_text = rows - n_task - n_copy
    first_task = math.floor(step * task_rows)  # task rows of earlier steps at this rate: the rotation goes on
    ids = [corpus.windows("train", n_text, length, seed=_seed(cfg.seed, step, 0))] if n_text else []
    if n_copy:
        lo, hi = (max(2, int(f * length)) for f in cfg.copy_span)
        lo = min(lo, cfg.copy_short) if cfg.copy_short else lo
        span = (min(lo, (length - 1) // 2), min(hi, (length - 1) // 2))
        ids.append(copy_rows(corpus, "train", _seed(cfg.seed, step, 999), n_copy, length, span=span)[0])
    labels = [x.clone() for x in ids]
    for j in range(n_task):
        task = T.TASKS[cfg.tasks[(first_task + j) % len(cfg.tasks)]]
        seed = _seed(cfg.seed, step, j + 1)
        i, lab = T.render(task.training_sample(seed, length, **_edge(cfg, task.name, seed, length)))
        ids.append(i[None])
        labels.append(lab[None])
    kind = torch.tensor([TEXT] * n_text + [COPY] * n_copy + [TASK] * n_task)
    return torch.cat(ids), torch.cat(labels), kind


def _edge(cfg: TrainConfig, task: str, seed: int, length: int) -> dict:
    """A niah training row's depth option: with probability edge_fraction (rows of edge_min_length tokens or more),
    a depth in the first or last tenth of the filler, where a needle is farthest from or nearest to its question."""
    if task != "niah" or not cfg.edge_fraction or length < cfg.edge_min_length:
        return {}
    rng = random.Random(f"edge:{seed}")
    if rng.random() >= cfg.edge_fraction:
        return {}
    d = rng.uniform(0.0, 0.1)
    return {"depth": d if rng.random() < 0.5 else 1.0 - d}


def _share(step: int, per_step: Fraction) -> int:
    """Rows of one kind at `step` when a step holds `per_step` of them on average: the whole number when it is one,
    else floor((step + 1) x) - floor(step x), so few rows a step (2 rows of 2,048 tokens) still keep every share over
    consecutive steps instead of rounding one away."""
    return math.floor((step + 1) * per_step) - math.floor(step * per_step)


def _seed(seed: int, step: int, j: int) -> int:
    return (seed * 1_000_003 + step) * 1009 + j  # distinct per (seed, step, row) for any realistic sizes


def losses(logits: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor, kind: torch.Tensor) -> dict:
    """Mean next-token cross-entropies (nats): "text" over text rows, "copy" over copy rows, "task" over task
    answers, "dense" over every token of the task rows."""
    lp = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(),
                         reduction="none").view(ids.shape[0], -1)  # [R, L - 1]
    answer = (labels[:, 1:] != T.IGNORE).float()
    every = torch.ones_like(answer)
    out = {}
    for name, rows, m in (("text", kind == TEXT, every), ("copy", kind == COPY, every), ("task", kind == TASK, answer),
                          ("dense", kind == TASK, every)):
        w = m[rows]
        out[name] = (lp[rows] * w).sum() / w.sum() if w.sum() > 0 else logits.new_zeros(())
    return out


# --- evaluation ---------------------------------------------------------------------------------------
DECILES = tuple((i + 0.5) / 10 for i in range(10))  # niah depths of the sweep: the middle of each decile


@torch.no_grad()
def evaluate(model, corpus, windows: int = 16, samples: int = 32, length: int = 512, seed: int = 12345,
             tasks=tuple(T.TASKS), device: str | torch.device = "cpu", batch: int = 8, depth_samples: int = 0,
             copy_strings: int = 8) -> dict:
    """Held-out text loss (nats per byte), each task's accuracy, niah's accuracy per depth decile (when
    `depth_samples` > 0) and the copy probe (kvlab.train.probe: gain in nats per byte, accuracy), on seeded held-out
    material (seeds apart from training's: task samples from `seed`, text windows from the held-out split)."""
    for k, v in (("windows", windows), ("samples", samples), ("batch", batch), ("copy_strings", copy_strings)):
        need_int(k, v, 1)
    need_int("depth_samples", depth_samples, 0)
    was = model.training
    model.eval()
    x = corpus.windows("heldout", windows, length, seed)
    tot, n = 0.0, 0
    for i in range(0, windows, batch):
        xb = x[i:i + batch].to(device)
        lg = _logits(model, xb)
        tot += F.cross_entropy(lg[:, :-1].flatten(0, 1).float(), xb[:, 1:].flatten(), reduction="sum").item()
        n += xb[:, 1:].numel()
    out = {"heldout_loss": tot / n, "tasks": {}}
    for name in tasks:
        out["tasks"][name] = _accuracy(model, T.get_task(name).samples(seed, samples, length), device, batch)
    if depth_samples:
        niah = T.get_task("niah")
        out["niah_depth"] = [_accuracy(model, niah.samples(seed + 1 + i, depth_samples, length, depth=d), device,
                                       batch) for i, d in enumerate(DECILES)]
    probe = copy_probe(model, seed, n=copy_strings, length=length, corpus=corpus, device=device, batch=batch)
    out["copy_gain"], out["copy_accuracy"] = probe.gain, probe.accuracy
    model.train(was)
    return out


def _accuracy(model, samples, device, batch) -> float:
    right = count = 0
    for i in range(0, len(samples), batch):
        ids, lab = T.batch(samples[i:i + batch])
        r, c = T.score_predictions(_logits(model, ids.to(device)).argmax(-1).cpu(), lab)
        right, count = right + r, count + c
    return right / count


def _logits(model, ids):
    return model(input_ids=ids, use_cache=False).logits


# --- training -----------------------------------------------------------------------------------------
def train(cfg: TrainConfig, stop_after: int | None = None, progress: bool = True, evaluate_final: bool = True,
          log=None, state: str | Path | None = None, state_every: int = 0) -> Result:
    """Train `cfg` from scratch. `stop_after` ends after that many steps with the schedule of the full run
    (so a short rerun reproduces the start of a committed curve); `log(evaluation)` is called after each
    evaluation (e.g. to follow a long run). `state`: a file that keeps the run resumable (weights, optimizer, curve,
    step; written every `state_every` steps, 0: at evaluations, and at the end); a run started with an existing state
    file of the same config continues from it, with the same curve and weights as an uninterrupted run."""
    steps = cfg.steps if stop_after is None else min(cfg.steps, need_int("stop_after", stop_after, 1))
    need_int("state_every", state_every, 0)
    corpus = load_corpus(cfg.corpus_seed)
    dev = torch.device(cfg.device)
    model = build_model(cfg.arch, cfg.size, cfg.seed).to(dev)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, cfg.beta2))
    curve = {"step": [], "lr": [], "length": [], "text_loss": [], "copy_loss": [], "task_loss": [], "dense_loss": [],
             "aux_loss": [], "eval": []}
    start, before = 0, 0.0  # first step to run, wall seconds of the run so far
    if state is not None and Path(state).exists():
        start, before, curve = load_state(state, cfg, model, opt)
        if start > steps:
            raise ParameterError(f"{state}: the saved run is at step {start}, past the {steps} steps asked")
    from tqdm.auto import tqdm
    bar = tqdm(range(start, steps), desc=f"train {cfg.name}", unit="step", disable=not progress, initial=start,
               total=steps)
    t0 = time.perf_counter() - before
    for step in bar:
        ids, labels, kind = step_batch(cfg, corpus, step)
        lr = cfg.lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        out = model(input_ids=ids.to(dev), use_cache=False)
        ls = losses(out.logits, ids.to(dev), labels.to(dev), kind.to(dev))
        aux = getattr(out, "aux_loss", None)
        loss = ls["text"] + cfg.copy_weight * ls["copy"] + cfg.task_weight * ls["task"] + \
            cfg.task_dense * ls["dense"] + (aux if aux is not None else 0.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        for k, v in (("step", step), ("lr", lr), ("length", ids.shape[1]), ("text_loss", ls["text"].item()),
                     ("copy_loss", ls["copy"].item()), ("task_loss", ls["task"].item()),
                     ("dense_loss", ls["dense"].item()), ("aux_loss", 0.0 if aux is None else aux.item())):
            curve[k].append(v)
        bar.set_postfix(text=f"{curve['text_loss'][-1]:.3f}", task=f"{curve['task_loss'][-1]:.3f}")
        last = step + 1 == steps
        if (step + 1) % cfg.eval_every == 0 or (last and evaluate_final):
            ev = evaluate(model, corpus, cfg.eval_windows, cfg.eval_samples, cfg.eval_length, tasks=cfg.eval_tasks,
                          device=dev, depth_samples=cfg.eval_depth_samples, copy_strings=cfg.eval_copy_strings)
            since = len(curve["step"]) - (curve["eval"][-1]["step"] if curve["eval"] else 0)
            means = {f"train_{k}": sum(curve[k][-since:]) / since for k in ("text_loss", "copy_loss", "task_loss")}
            curve["eval"].append({"step": step + 1, "wall_s": round(time.perf_counter() - t0, 1), **means, **ev})
            if log is not None:
                log(curve["eval"][-1])
            bar.write(f"step {step + 1}: held-out {ev['heldout_loss']:.3f} nats/byte; " +
                      ", ".join(f"{k} {v:.2f}" for k, v in ev["tasks"].items()) +
                      f"; copy gain {ev['copy_gain']:.2f} nats/byte, accuracy {ev['copy_accuracy']:.2f}")
        if state is not None and (last or (step + 1) % (state_every or cfg.eval_every) == 0):
            save_state(state, cfg, model, opt, curve, step + 1, time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    model.eval()
    record = _record(cfg, corpus, model, steps, wall)
    final = dict(curve["eval"][-1]) if curve["eval"] else {}
    if evaluate_final and cfg.save_dtype != "float32":  # the saved weights, computing in their dtype (BF16 cache)
        low = copy.deepcopy(model).to(getattr(torch, cfg.save_dtype))
        final[cfg.save_dtype] = evaluate(low, corpus, cfg.eval_windows, cfg.eval_samples, cfg.eval_length,
                                         tasks=cfg.eval_tasks, device=dev, depth_samples=cfg.eval_depth_samples,
                                         copy_strings=cfg.eval_copy_strings)
    return Result(model, cfg, curve, record, final)


def save_state(path: str | Path, cfg: TrainConfig, model, opt, curve: dict, step: int, wall: float) -> Path:
    """Write a run's resumable state (atomically: a run stopped while writing keeps the previous state)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"config": cfg.to_dict(), "step": step, "wall_s": wall, "curve": curve, "model": model.state_dict(),
                "optimizer": opt.state_dict()}, tmp)
    tmp.replace(path)
    return path


def load_state(path: str | Path, cfg: TrainConfig, model, opt) -> tuple[int, float, dict]:
    """Load a state written by save_state into `model` and `opt`: (next step, wall seconds so far, curve)."""
    try:
        saved = torch.load(Path(path), map_location="cpu", weights_only=False)
        saved_cfg = saved["config"]
    except (OSError, RuntimeError, KeyError, TypeError, EOFError, pickle.UnpicklingError) as e:
        raise ParameterError(f"{path}: not a kvlab training state ({str(e).splitlines()[0]})") from None
    now = cfg.to_dict()
    if saved_cfg != now:
        diff = sorted(k for k in set(saved_cfg) | set(now) if saved_cfg.get(k) != now.get(k))
        raise ParameterError(f"{path}: saved by a run with other settings ({', '.join(diff)}); "
                             "resume it with the same settings or remove the file")
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    return int(saved["step"]), float(saved["wall_s"]), saved["curve"]


def _record(cfg, corpus, model, steps, wall) -> dict:
    import platform

    import transformers

    from .. import __version__ as kvlab_version
    return {
        "name": cfg.name,
        "config": cfg.to_dict(),
        "steps_run": steps,
        "tokens": sum(cfg.batch_tokens // cfg.length(i) * cfg.length(i) for i in range(steps)),
        "parameters": count_parameters(model),
        "model_type": model.config.model_type,
        "corpus": corpus.record(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "kvlab": kvlab_version},
        "volatile": {"wall_s": round(wall, 1), "threads": torch.get_num_threads(), "device": str(cfg.device),
                     "machine": platform.machine(), "date": time.strftime("%Y-%m-%d")},
    }


def save(result: Result, path: str | Path) -> Path:
    """Write the checkpoint directory: weights (safetensors, cfg.save_dtype), config, tokenizer, curve, record."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = result.model
    dtype = getattr(torch, result.config.save_dtype)
    model.to(dtype).save_pretrained(str(path), safe_serialization=True)
    model.to(torch.float32)
    save_tokenizer(path)
    record = {**result.record, "final": result.final}
    (path / CURVE_FILE).write_text(json.dumps(_round(result.curve), indent=1) + "\n")
    (path / RECORD_FILE).write_text(json.dumps(_round(record), indent=2) + "\n")
    return path


def _round(x, digits: int = 6):
    """Floats to `digits` significant digits: the files stay small and diff cleanly."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: _round(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v, digits) for v in x]
    return x


def load_record(path: str | Path) -> tuple[TrainConfig, dict, dict]:
    """(config, curve, record) of a saved checkpoint directory."""
    path = Path(path)
    try:
        record = json.loads((path / RECORD_FILE).read_text())
        curve = json.loads((path / CURVE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ParameterError(f"{path}: not a kvlab training checkpoint ({e})") from None
    return TrainConfig.from_dict(record["config"]), curve, record


def retrain(path: str | Path, steps: int, progress: bool = False) -> tuple[Result, dict]:
    """Rerun the first `steps` steps of a saved checkpoint's recipe: (result, the saved curve)."""
    need_int("steps", steps, 1)
    cfg, curve, _ = load_record(path)
    return train(cfg, stop_after=steps, progress=progress, evaluate_final=False), curve


def default_configs(size: str = "tiny", **overrides) -> list[TrainConfig]:
    """One config per architecture with the same budget."""
    return [replace(TrainConfig(arch=a, size=size), **overrides) for a in ARCHS]
