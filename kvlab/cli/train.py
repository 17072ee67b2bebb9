"""`kvlab train`: train the small models from scratch and save them as checkpoint directories."""
from __future__ import annotations

import json
from dataclasses import replace

from .args import count

CHECKPOINTS = "data/checkpoints"  # where `make train` writes (relative to the repository root)


def register(sub) -> None:
    # kvlab.train imports transformers (seconds): its names are checked when the command runs, not here
    p = sub.add_parser("train", help="train small dense / MLA / V4.1-like models on stdlib text and long-context tasks")
    p.add_argument("arch", nargs="*", default=["all"], metavar="ARCH",
                   help="architectures: dense, mla, v41 (kvlab.train.models.ARCHS) or all (default all)")
    p.add_argument("--size", default="tiny",
                   help="size preset: tiny (1 CPU thread: 31 min dense, 44 min MLA, 75 min V4.1-like), small, base "
                        "(kvlab.toy.sizes.SIZES)")
    p.add_argument("--steps", type=count("--steps"), default=None,
                   help="optimizer steps (default: the recipe's, kvlab.train.TrainConfig.steps)")
    p.add_argument("--batch-tokens", type=count("--batch-tokens"), default=None,
                   help="tokens per step (default: the recipe's, TrainConfig.batch_tokens)")
    p.add_argument("--eval-every", type=count("--eval-every"), default=None,
                   help="steps between evaluations (default: the recipe's, TrainConfig.eval_every; only what is "
                        "recorded changes, not the training)")
    p.add_argument("--seed", type=count("--seed"), default=0)
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    p.add_argument("--threads", type=count("--threads"), default=None,
                   help="torch CPU threads (1 reproduces a reference run bit for bit on one machine)")
    p.add_argument("--out", default=CHECKPOINTS, help=f"parent directory of the checkpoints (default {CHECKPOINTS})")
    p.add_argument("--state", default=None, metavar="DIR",
                   help="keep each run resumable in DIR/<name>.pt (written at every evaluation); a run whose state is "
                        "there continues from it, bit for bit (make train: runs/train-state)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print each run's final figures as JSON")
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    from pathlib import Path

    import torch

    from ..checks import need_choice
    from ..errors import ParameterError
    from ..train.loop import TrainConfig, save, train
    from ..train.models import ARCHS
    archs = list(ARCHS) if args.arch in (["all"], []) else args.arch
    for a in archs:
        need_choice("arch", a, ARCHS)
    if 0 in (args.steps, args.batch_tokens, args.threads, args.eval_every):
        raise ParameterError("--steps, --batch-tokens, --threads and --eval-every must be at least 1")
    if args.device != "cpu":
        try:
            torch.empty(0, device=args.device)
        except (RuntimeError, AssertionError) as e:
            raise ParameterError(f"--device {args.device} is not usable here: {str(e).splitlines()[0]}") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    over = {k: v for k, v in (("steps", args.steps), ("batch_tokens", args.batch_tokens),
                              ("eval_every", args.eval_every)) if v is not None}
    rows = []
    for a in archs:
        cfg = replace(TrainConfig(arch=a, size=args.size, seed=args.seed, device=args.device), **over)
        state = Path(args.state) / f"{cfg.name}.pt" if args.state else None
        r = train(cfg, progress=not args.quiet, state=state)
        path = save(r, Path(args.out) / cfg.name)
        row = {"name": cfg.name, "path": str(path), "parameters": r.record["parameters"],
               "wall_s": r.record["volatile"]["wall_s"], "final_text_loss": r.curve["text_loss"][-1],
               **{k: v for k, v in r.final.items() if k != "step"}}
        rows.append(row)
        if not args.json:
            print(f"{row['name']}: {row['parameters']:,} parameters, {row['wall_s']:.0f} s, held-out "
                  f"{row['heldout_loss']:.3f} nats/byte, " + ", ".join(f"{k} {v:.2f}" for k, v in row["tasks"].items())
                  + f" -> {path}")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0
