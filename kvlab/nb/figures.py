"""The README's pictures: figures taken from a run's executed notebooks into docs/figures/, captions from its results.

`python -m kvlab.nb.figures` (`make figures`) reads runs/latest (running the notebooks it lacks through
`kvlab.nb.runner` first), writes each figure's PNG exactly as the notebook rendered it, and rewrites the README block
between FIGURES_START and FIGURES_END: one image and one line per figure, the line's numbers read from the run's
recorded results. A figure whose notebook does not exist (a trimmed checkout) is left out until it does; the next
`make figures` adds it.
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

FIGURES_START = "<!-- figures: written by `make figures` (kvlab/nb/figures.py); edit captions there -->"
FIGURES_END = "<!-- /figures -->"
SWEEP_START, SWEEP_END = "<!-- sweep: ", "<!-- /sweep -->"  # the README's example sweep table (--sweep DIR)


@dataclass(frozen=True)
class Figure:
    """One README picture."""

    file: str  # docs/figures/<file>.png
    notebook: str  # notebook prefix ("01")
    marker: str  # text in the source of the cell that draws it ("" : the notebook's first figure)
    what: str  # the line under it: what it shows
    figures: Callable[[dict], str] = lambda r: ""  # a sentence of numbers from the notebook's recorded results

    def caption(self, results: dict) -> str:
        try:
            numbers = self.figures(results)
        except (KeyError, TypeError, ValueError):  # a notebook that records other names: the line alone
            numbers = ""
        return f"{self.what}{': ' + numbers if numbers else ''} (notebook {self.notebook})."


def _fewest(r: dict) -> str:
    """The methods reaching the notebook's target at the first context on the model measured with every setting (the
    one with the most methods recorded), fewest bytes first, as shares of its BF16 bytes ('' when none is recorded)."""
    need = r.get("fewest_bytes_for_target") or {}
    models = [k.split("|")[0] for k in need]
    model = max(dict.fromkeys(models), key=models.count, default="")
    ref = next((v for k, v in r["held_bytes"].items() if k.startswith(f"{model}|bf16|")), None)
    got = sorted((v, k.split("|", 1)[1]) for k, v in need.items() if k.startswith(f"{model}|") and v is not None)
    if not ref or not got:
        return ""

    def setting(method: str, held: int) -> str:  # the budget (and format) that got there, from the bytes it held
        return next((k.split("|")[1] for k, v in r["held_bytes"].items()
                     if k.startswith(f"{model}|{method}") and v == held), method)
    return (f"; fewest bytes reaching accuracy 0.9 at the first context on {model}: "
            + ", ".join(f"{setting(m, v)} {v / ref:.2f} of BF16" for v, m in got[:4]))


def _vllm_admits(r: dict) -> str:
    """'; at 131,072 tokens vLLM admits m1 N1 (held M1), ...' from notebook 06's H200 grid ('' when none is recorded)."""
    got = [(k.split("|")[0], k.split("|")[2], v) for k, v in (r.get("vllm_sessions_per_gpu") or {}).items()
           if k.split("|")[1] == "H200" and v is not None]
    if not got:
        return ""
    tokens = min(int(t) for _, t, _ in got)
    return f"; at {tokens:,} tokens vLLM admits " + ", ".join(
        f"{m} {v} (held: {r['sessions_per_gpu'][f'{m}|H200|{t}']})" for m, t, v in got if int(t) == tokens)


def _n(v) -> str:
    if isinstance(v, float):
        return f"{v:,.6g}" if abs(v) >= 1000 else f"{v:.3g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


FIGURES = [
    Figure("catalog", "01", "across the catalog and number formats",
           "KV bytes per token of every catalog model, in its own storage format and in each compared number format",
           lambda r: f"Qwen3-8B stores {_n(r['bytes_per_token'])} B per token, DeepSeek V4.1-Flash "
                     f"{_n(r['catalog_bytes_per_token']['deepseek-v4.1-flash'])}"),
    Figure("deepseek-890", "02", "ways, against",
           "DeepSeek V4.1-Flash's KV bytes per token against V4-Flash counted in BF16, in its storage format and as "
           "vLLM lays it out (unpadded, page-padded)",
           lambda r: f"{_n(r['bytes_per_token'])} B against {_n(min(r['baseline_bytes_per_token'].values()))} to "
                     f"{_n(max(r['baseline_bytes_per_token'].values()))} B"),
    Figure("real-frontier", "10", "plot_frontier(",
           "Memory against quality on real pretrained models, offline: SmolLM2-135M (every layer full attention) "
           "beside Gemma-3-270M (5 of every 6 layers sliding over 512 tokens): accuracy on RULER's single needle at "
           "1,024 tokens (Wilson 95%), answered greedily under kvpress's protocol, against the bytes each format "
           "and press held once the context was in the cache (measured = predicted; on Gemma a press compresses the "
           "full-attention layers alone)",
           lambda r: "BF16 " + ", ".join(f"{k.split('|')[0]} {v:.2f} (n = {r['samples_answered'][k]})"
                                         for k, v in r["bf16_accuracy"].items())
           + "; a quarter of the bytes: " + "; ".join(
               f"{m}: " + ", ".join(f"{k.split('|')[1]} {v}" for k, v in r["quarter_bytes_verdicts"].items()
                                   if k.split("|")[0] == m)
               for m in dict.fromkeys(k.split("|")[0] for k in r["quarter_bytes_verdicts"]))),
    Figure("frontier", "08", "memory / quality frontier",
           "Memory against quality on the small models trained here to retrieve: needle-in-a-haystack accuracy "
           "(Wilson 95%) and perplexity change against BF16 (paired bootstrap 95%) against the bytes each format, "
           "window, pooling and eviction press really holds, at 1,024 and 2,048 tokens",
           lambda r: "BF16 niah accuracy " + ", ".join(
               f"{k.split('|')[0]} {v:.2f} at {k.split('|')[2]}" for k, v in r["accuracy"].items()
               if k.split("|")[1] == "bf16") + "; costing nothing measurable: " + (
               ", ".join(k.replace("|", " ", 1).rsplit("|", 1)[0] + f" @{k.rsplit('|', 1)[1]}"
                         for k in r["costs_nothing_measurable"]) or "none")
           + _fewest(r)
           + ("; every kvlab cache held exactly the bytes kvlab predicts" if r["held_equals_predicted"] is True
              else "; held bytes differ from kvlab's prediction")),
    Figure("needle-heatmap", "08", "needle_heatmap(",
           "Needle-in-a-haystack accuracy by context length and needle depth, per setting, measured on the dense "
           "model (1,024 tokens is its training length)",
           lambda r: "mean accuracy at 1,024 tokens " + ", ".join(
               f"{k.split('|')[1]} {v:.2f}" for k, v in r["heatmap_mean_accuracy"].items()
               if k.endswith("|1024")) + f" ({r['heatmap_samples_per_cell']} samples a cell)"),
    Figure("gpus-needed", "09", "GPUs meeting",
           "The fewest GPUs meeting a TTFT / TPOT target on the synthetic agent trace at 16 x its users, per model "
           "and KV format, from kvlab's serving simulator on roofline step times (an estimate; a lower bound for the "
           "MoE models, whose weights need TP 4 on an H200)",
           lambda r: ", ".join(f"{k} {v}" for k, v in r["gpus_needed"].items() if v is not None)),
    Figure("sessions-per-gpu", "06", "sessions per GPU (log)",
           "Sessions that fit on one GPU per model, GPU and session length, weights and bounded state counted: bars "
           "what a session holds while decoding, black marks what vLLM admits by what a request reserves at "
           "admission (vLLM 0.33's own planning rules, checked against its code), where vLLM serves that length",
           lambda r: "at 1M tokens an H200 holds " + ", ".join(
               f"{m} {r['sessions_per_gpu'][f'{m}|H200|1000000']}"
               for m in ("qwen3-8b", "deepseek-v4-flash", "deepseek-v4.1-flash")) + _vllm_admits(r)),
    Figure("hit-rate", "07", "prefix_hit_curve",
           "Prefix-hit share of prompt tokens against LRU cache capacity on a request trace, one curve per model",
           lambda r: "90% of the best hit rate takes " + ", ".join(
               f"{_n(gb)} GB for {m}" for m, gb in sorted(r["gb_for_90pct_of_max_hit"].items(), key=lambda kv: kv[1])
               if gb is not None)),
]


def notebook_figure(path: Path, marker: str) -> bytes | None:
    """The first PNG output of the first code cell whose source contains `marker` (any figure when empty)."""
    nb = json.loads(Path(path).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] != "code" or marker not in "".join(cell["source"]):
            continue
        for out in cell.get("outputs", []):
            png = out.get("data", {}).get("image/png")
            if png:
                return base64.b64decode("".join(png) if isinstance(png, list) else png)
    return None


def _run_results(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "results.json").read_text())["notebooks"]
    except (OSError, ValueError, KeyError):
        return {}


def collect(run_dir: Path, runs_root: Path, log=print) -> dict[str, tuple[Path, dict]]:
    """notebook prefix -> (executed notebook, recorded results) for every figure whose notebook exists; notebooks
    that the run lacks (or that failed there) are run now, into a new run under runs_root."""
    from .runner import list_notebooks, run_notebooks

    have = {p.stem[:2]: p.stem for p in list_notebooks()}
    wanted = sorted({f.notebook for f in FIGURES if f.notebook in have})
    results = _run_results(run_dir)
    found = {}
    for n in wanted:
        stem = have[n]
        if results.get(stem, {}).get("status") == "ok" and (run_dir / f"{stem}.ipynb").is_file():
            found[n] = (run_dir / f"{stem}.ipynb", results[stem]["results"])
    missing = [n for n in wanted if n not in found]
    if missing:
        log(f"figures: running {', '.join(have[n] for n in missing)} (not in {run_dir})")
        new_dir, runs = run_notebooks(missing, out_root=runs_root, log=log)
        for r in runs:
            if r.status != "ok":
                raise SystemExit(f"figures: {r.name} failed ({r.error}); see {new_dir}")
            found[r.name[:2]] = (Path(r.output), r.results)
    return found


def write(run_dir: Path, out_dir: Path, readme: Path | None, runs_root: Path, log=print) -> list[Path]:
    found = collect(run_dir, runs_root, log)
    out_dir.mkdir(parents=True, exist_ok=True)
    written, block = [], []
    for f in FIGURES:
        if f.notebook not in found:
            log(f"figures: {f.file}: notebook {f.notebook} does not exist yet; its slot stays empty")
            continue
        path, results = found[f.notebook]
        png = notebook_figure(path, f.marker) or notebook_figure(path, "")
        if png is None:
            raise SystemExit(f"figures: {path} has no figure")
        target = out_dir / f"{f.file}.png"
        target.write_bytes(png)
        written.append(target)
        rel = target.resolve().relative_to(readme.resolve().parent) if readme else target
        block += [f"![{f.file}]({rel.as_posix()})", f"*{f.caption(results)}*", ""]
        log(f"figures: {target} from {path}")
    if readme is not None:
        text = readme.read_text()
        if FIGURES_START not in text or FIGURES_END not in text:
            raise SystemExit(f"figures: {readme} has no figures block ({FIGURES_START} ... {FIGURES_END})")
        head, rest = text.split(FIGURES_START, 1)
        tail = rest.split(FIGURES_END, 1)[1]
        readme.write_text(head + FIGURES_START + "\n" + "\n".join(block) + FIGURES_END + tail)
    return written


def sweep_table(folder: Path, width: int = 40) -> str:
    """A sweep's table as Markdown: parameters, status and the recorded results short enough to read."""
    import pandas as pd

    df = pd.read_csv(Path(folder) / "results.csv", keep_default_na=False, dtype=str)
    df = df.drop(columns=[c for c in ("error", "folder") if c in df.columns])
    df = df[[c for c in df.columns if df[c].str.len().max() <= width]]

    def cell(v: str) -> str:
        return f"{int(v):,}" if v.lstrip("-").isdigit() else (v or '""')

    rows = [" | ".join(df.columns), " | ".join("---" for _ in df.columns)]
    rows += [" | ".join(cell(v) for v in r) for r in df.itertuples(index=False)]
    return "\n".join(f"| {r} |" for r in rows)


def write_sweep(folder: Path, readme: Path) -> None:
    """Rewrite the README's sweep block with the table of the sweep in `folder`."""
    text = readme.read_text()
    if SWEEP_START not in text or SWEEP_END not in text:
        raise SystemExit(f"figures: {readme} has no sweep block ({SWEEP_START}... {SWEEP_END})")
    head, rest = text.split(SWEEP_START, 1)
    command, rest = rest.split("\n", 1)
    tail = rest.split(SWEEP_END, 1)[1]
    readme.write_text(f"{head}{SWEEP_START}{command}\n{sweep_table(folder)}\n{SWEEP_END}{tail}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvlab.nb.figures", description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/latest", help="run folder to take figures from (default runs/latest)")
    ap.add_argument("--out", default="docs/figures", help="folder for the PNGs (default docs/figures)")
    ap.add_argument("--readme", default="README.md", help="README whose figures block is rewritten ('' : none)")
    ap.add_argument("--sweep", metavar="DIR", help="instead: put the table of the sweep in DIR into the README")
    ap.add_argument("--grid", metavar="DIR", help="instead: print the accuracy grid of a `kvlab sweep 10` in DIR as "
                                                  "Markdown (docs/quality.md's grids)")
    args = ap.parse_args(argv)
    if args.grid:
        from .real_quality import grid_markdown
        print(grid_markdown(Path(args.grid)))
        return 0
    if args.sweep:
        write_sweep(Path(args.sweep), Path(args.readme))
        return 0
    run_dir = Path(args.run)
    write(run_dir, Path(args.out), Path(args.readme) if args.readme else None, run_dir.parent,
          log=lambda m: print(m, file=sys.stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
