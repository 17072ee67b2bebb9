"""Training: one seeded recipe for every architecture, so their quality compares at equal budget.

Each step sees `batch_tokens` tokens: rows of natural text (random windows of the corpus' train split) and
rows of the long-context tasks, at a sequence length that cycles through `lengths`. The loss is the text
cross-entropy (every next byte) plus the task cross-entropy on answer tokens only (their contexts are
random by construction), plus any auxiliary loss the model returns (the V4.1-like indexer's). AdamW with
linear warm-up and cosine decay; gradients clipped. Every batch comes from seeds derived from (seed, step),
and the weights from torch.manual_seed(seed): two runs of one config on one machine and thread count give
the same curve; across CPUs the floats drift, so curves are compared with a tolerance.

`train(cfg)` returns a `Result`; `save(result, path)` writes save_pretrained's config.json + safetensors
(cast to `cfg.save_dtype`), tokenizer files, loss_curve.json and train_record.json (its "volatile" part —
wall time, threads, date — differs between runs; everything else is reproducible).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..checks import need_choice, need_int, need_number
from ..errors import ParameterError
from . import tasks as T
from .data import load_corpus, save_tokenizer
from .models import ARCHS, NAMES, build_model, count_parameters
from .probe import copy_probe
from .sizes import SIZES

CURVE_FILE = "loss_curve.json"
RECORD_FILE = "train_record.json"


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Defaults: a few minutes per model on 2 CPU cores."""

    arch: str = "dense"  # one of models.ARCHS
    size: str = "tiny"  # one of sizes.SIZES
    steps: int = 600  # optimizer steps
    batch_tokens: int = 2048  # tokens per step (rows = batch_tokens // length)
    lengths: tuple[int, ...] = (128, 256, 512)  # sequence length of step i: lengths[i % len(lengths)]
    task_fraction: float = 0.5  # share of each step's rows given to the tasks
    tasks: tuple[str, ...] = ("mqar", "needle", "mqar", "vartrack")  # task rows take these in rotation (MQAR twice)
    task_weight: float = 1.0  # weight of the task loss beside the text loss
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # learning rate at the end of the cosine
    warmup: int = 50  # linear warm-up steps
    weight_decay: float = 0.1  # AdamW decoupled weight decay (matrices only)
    grad_clip: float = 1.0  # global gradient-norm clip
    seed: int = 0  # weights, data order and task samples
    corpus_seed: int = 0  # train / held-out split of the corpus
    eval_every: int = 200  # steps between evaluations (and at the end)
    eval_windows: int = 16  # held-out text windows per evaluation
    eval_samples: int = 32  # samples per task per evaluation
    eval_length: int = 256  # tokens per held-out window and task sample at evaluation
    device: str = "cpu"  # torch device ("cuda" scales up)
    save_dtype: str = "bfloat16"  # dtype of the saved weights ("float32" keeps them exact)

    def __post_init__(self):
        need_choice("arch", self.arch, ARCHS)
        need_choice("size", self.size, SIZES)
        need_int("steps", self.steps, 1)
        for n in ("batch_tokens", "warmup", "eval_every", "eval_windows", "eval_samples", "eval_length"):
            need_int(n, getattr(self, n), 0 if n == "warmup" else 1)
        if not self.lengths:
            raise ParameterError("lengths must name at least one sequence length")
        for n in self.lengths:
            need_int("length", n, 16)
            if n > self.batch_tokens:
                raise ParameterError(f"length {n} is more than batch_tokens = {self.batch_tokens}")
        need_number("task_fraction", self.task_fraction, 0.0, 1.0)
        for t in self.tasks:
            need_choice("task", t, T.TASKS)
        if self.task_fraction > 0 and not self.tasks:
            raise ParameterError("task_fraction > 0 needs at least one task")
        for n in ("lr", "min_lr", "task_weight", "weight_decay", "grad_clip"):
            need_number(n, getattr(self, n), 0.0)
        need_choice("save_dtype", self.save_dtype, ("bfloat16", "float32"))

    @property
    def name(self) -> str:
        """Checkpoint directory name: <architecture stem>-<size>."""
        return f"{NAMES[self.arch]}-{self.size}"

    @property
    def tokens(self) -> int:
        """Tokens seen in training (whole rows per step)."""
        return sum(self.batch_tokens // self.length(i) * self.length(i) for i in range(self.steps))

    def length(self, step: int) -> int:
        return self.lengths[step % len(self.lengths)]

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        p = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * min(1.0, p)))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["lengths"], d["tasks"] = list(self.lengths), list(self.tasks)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        d["lengths"], d["tasks"] = tuple(d["lengths"]), tuple(d["tasks"])
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
def step_batch(cfg: TrainConfig, corpus, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step `step`'s batch: ids [R, L], labels [R, L] (IGNORE where not learned) and is_task [R]."""
    length = cfg.length(step)
    rows = cfg.batch_tokens // length
    n_task = round(rows * cfg.task_fraction) if cfg.tasks else 0
    ids = [corpus.windows("train", rows - n_task, length, seed=_seed(cfg.seed, step, 0))] if rows > n_task else []
    labels = [ids[0].clone()] if ids else []
    for j in range(n_task):
        task = T.TASKS[cfg.tasks[(step * n_task + j) % len(cfg.tasks)]]
        i, lab = T.render(task.training_sample(_seed(cfg.seed, step, j + 1), length))
        ids.append(i[None])
        labels.append(lab[None])
    is_task = torch.arange(rows) >= rows - n_task
    return torch.cat(ids), torch.cat(labels), is_task


def _seed(seed: int, step: int, j: int) -> int:
    return (seed * 1_000_003 + step) * 1009 + j  # distinct per (seed, step, row) for any realistic sizes


def losses(logits: torch.Tensor, labels: torch.Tensor, is_task: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(text loss, task loss): mean next-token cross-entropy over text rows and over task answers (nats)."""
    lp = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=T.IGNORE,
                         reduction="none").view(labels.shape[0], -1)  # [R, L - 1]
    m = (labels[:, 1:] != T.IGNORE).float()
    out = []
    for rows in (~is_task, is_task):
        w = m[rows]
        out.append((lp[rows] * w).sum() / w.sum() if w.sum() > 0 else logits.new_zeros(()))
    return out[0], out[1]


# --- evaluation ---------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, corpus, windows: int = 16, samples: int = 32, length: int = 512, seed: int = 12345,
             tasks=tuple(T.TASKS), device: str | torch.device = "cpu", batch: int = 8) -> dict:
    """Held-out text loss (nats per byte), each task's accuracy and the copy probe's gain (kvlab.train.probe: how
    much a repeated random string's second copy is easier, nats per byte), on seeded held-out material (seeds
    apart from training's: task samples from `seed`, text windows from the held-out split)."""
    for k, v in (("windows", windows), ("samples", samples), ("batch", batch)):
        need_int(k, v, 1)
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
        right = count = 0
        ss = T.get_task(name).samples(seed, samples, length)
        for i in range(0, samples, batch):
            ids, lab = T.batch(ss[i:i + batch])
            r, c = T.score_predictions(_logits(model, ids.to(device)).argmax(-1).cpu(), lab)
            right, count = right + r, count + c
        out["tasks"][name] = right / count
    out["copy_gain"] = copy_probe(model, seed, device=device).gain
    model.train(was)
    return out


def _logits(model, ids):
    return model(input_ids=ids, use_cache=False).logits


# --- training -----------------------------------------------------------------------------------------
def train(cfg: TrainConfig, stop_after: int | None = None, progress: bool = True, evaluate_final: bool = True) -> Result:
    """Train `cfg` from scratch. `stop_after` ends after that many steps with the schedule of the full run
    (so a short rerun reproduces the start of a committed curve)."""
    steps = cfg.steps if stop_after is None else min(cfg.steps, need_int("stop_after", stop_after, 1))
    corpus = load_corpus(cfg.corpus_seed)
    dev = torch.device(cfg.device)
    model = build_model(cfg.arch, cfg.size, cfg.seed).to(dev)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    curve = {"step": [], "lr": [], "text_loss": [], "task_loss": [], "aux_loss": [], "eval": []}
    from tqdm.auto import tqdm
    bar = tqdm(range(steps), desc=f"train {cfg.name}", unit="step", disable=not progress)
    t0 = time.perf_counter()
    for step in bar:
        ids, labels, is_task = step_batch(cfg, corpus, step)
        lr = cfg.lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        out = model(input_ids=ids.to(dev), use_cache=False)
        text, task = losses(out.logits, labels.to(dev), is_task.to(dev))
        aux = getattr(out, "aux_loss", None)
        loss = text + cfg.task_weight * task + (aux if aux is not None else 0.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        for k, v in (("step", step), ("lr", lr), ("text_loss", text.item()), ("task_loss", task.item()),
                     ("aux_loss", 0.0 if aux is None else aux.item())):
            curve[k].append(v)
        bar.set_postfix(text=f"{curve['text_loss'][-1]:.3f}", task=f"{curve['task_loss'][-1]:.3f}")
        last = step + 1 == steps
        if (step + 1) % cfg.eval_every == 0 or (last and evaluate_final):
            ev = evaluate(model, corpus, cfg.eval_windows, cfg.eval_samples, cfg.eval_length, device=dev)
            curve["eval"].append({"step": step + 1, **ev})
            bar.write(f"step {step + 1}: held-out {ev['heldout_loss']:.3f} nats/byte; " +
                      ", ".join(f"{k} {v:.2f}" for k, v in ev["tasks"].items()) +
                      f"; copy gain {ev['copy_gain']:.2f} nats/byte")
    wall = time.perf_counter() - t0
    model.eval()
    record = _record(cfg, corpus, model, steps, wall)
    final = curve["eval"][-1] if curve["eval"] else {}
    return Result(model, cfg, curve, record, final)


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
