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


def tiny_notebook(path: Path, *bodies: str) -> Path:
    """A notebook at `path`: a `parameters` cell declaring `x: int = 1`, then one code cell per body (python3 kernel)."""
    import nbformat
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("x: int = 1  # a parameter")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params] + [nbformat.v4.new_code_cell(b) for b in bodies]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return Path(path)
