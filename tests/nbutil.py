"""Run a notebook through papermill with parameters and return its recorded results."""
from __future__ import annotations

from pathlib import Path

from kvlab.nb.record import read_results
from kvlab.nb.runner import kernel_name, resolve


def run_notebook(name: str, out_dir: Path, **params) -> dict:
    """Execute notebooks/<name>*.ipynb with `params` into out_dir; return its recorded results."""
    import papermill as pm

    path = resolve([name])[0]
    out = Path(out_dir) / path.name
    pm.execute_notebook(str(path), str(out), parameters=params, kernel_name=kernel_name(), cwd=str(path.parent),
                        progress_bar=False)
    return read_results(out)
