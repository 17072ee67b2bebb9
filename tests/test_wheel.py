"""kvlab as a package: a wheel (built from the tree, and from the sdist) installed into a fresh virtual environment
works from a folder outside the source tree, with the catalog, hardware, weights, claims and notebooks inside it.

The fresh environment gets kvlab from the wheel alone; its dependencies (numpy, torch, ...) are borrowed from the
running interpreter's site-packages through a .pth file, so the test needs no network and no multi-GB install.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(".git", ".venv", "runs", "build", "dist", "*.egg-info", "__pycache__",
                              ".ipynb_checkpoints", ".pytest_cache")


def _run(cmd, cwd, timeout=300, env=None):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=env or _clean_env())
    assert r.returncode == 0, \
        f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-4000:]}"
    return r.stdout


def _clean_env() -> dict:
    """No PYTHONPATH (the checkout must not leak in), one thread."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _have_setuptools() -> bool:
    """setuptools>=77 here: build with it (no network), the sdist included; else pip's isolated build, wheel only."""
    try:
        import setuptools
        return int(setuptools.__version__.split(".")[0]) >= 77
    except ImportError:
        return False


def _repo_files(folder: str, pattern: str) -> set[str]:
    base = ROOT / folder
    return {f"kvlab/{folder}/{p.relative_to(base).as_posix()}" for p in base.glob(pattern)
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(base).parts)}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """{"tree": wheel built from a copy of the source tree, "sdist": wheel built from the sdist of that copy}."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=SKIP)
    py = sys.executable
    isolation = ["--no-build-isolation"] if _have_setuptools() else []
    _run([py, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", tmp / "from-tree", src], cwd=tmp)
    out = {"tree": next((tmp / "from-tree").glob("kvlab-*.whl"))}
    if _have_setuptools():  # the sdist is built in-process by this environment's setuptools
        _run([py, "-c", f"from setuptools import build_meta as b; b.build_sdist({str(tmp / 'sdist')!r})"], cwd=src)
        sdist = next((tmp / "sdist").glob("kvlab-*.tar.gz"))
        _run([py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "from-sdist", sdist],
             cwd=tmp)
        out["sdist"] = next((tmp / "from-sdist").glob("kvlab-*.whl"))
    return out


def _venv_with(wheel: Path, where: Path) -> Path:
    """A fresh venv holding kvlab from `wheel` only; the running interpreter's packages serve as its dependencies."""
    venv.EnvBuilder(with_pip=False).create(where)
    py = where / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index", wheel], cwd=where)
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=where).strip())
    parent = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_kvlab_test_deps.pth").write_text("\n".join(sorted(parent)) + "\n")  # plain paths: no .pth of theirs runs
    return where / "bin"


@pytest.mark.parametrize("source", ["tree", "sdist"])
def test_wheel_carries_every_data_file_and_notebook(wheels, source):
    if source not in wheels:
        pytest.skip("setuptools>=77 is not installed here: the sdist is not built (pip builds only wheels)")
    names = set(zipfile.ZipFile(wheels[source]).namelist())
    expected = _repo_files("data", "**/*") | _repo_files("notebooks", "[0-9][0-9]_*.ipynb")
    assert "kvlab/data/models/qwen3-8b.json" in expected and "kvlab/data/claims.json" in expected
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"


@pytest.mark.parametrize("source", ["tree", "sdist"])
def test_installed_wheel_works_outside_the_tree(wheels, source, tmp_path):
    if source not in wheels:
        pytest.skip("setuptools>=77 is not installed here: the sdist is not built (pip builds only wheels)")
    bin_ = _venv_with(wheels[source], tmp_path / "venv")
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([bin_ / "python", "-c", "import kvlab, kvlab.models as m, kvlab.nb.runner as r; "
                  "print(kvlab.__file__); print(m.DATA_DIR); print(r.NOTEBOOK_DIR)"], cwd=work).split()
    for p in where:  # kvlab, its data and its notebooks all come from the fresh environment, as real folders
        assert Path(p).is_relative_to(tmp_path / "venv"), p
    assert not Path(where[1]).is_symlink() and (Path(where[1]) / "models" / "qwen3-8b.json").is_file()

    models = _run([bin_ / "kvlab", "models"], cwd=work)
    assert "qwen3-8b" in models and "147,456" in models and "deepseek-v4.1-flash" in models
    assert json.loads(_run([bin_ / "kvlab", "bytes", "qwen3-8b", "--json"], cwd=work))["bytes_per_token"] == 147456
    claims = _run([bin_ / "kvlab", "claims"], cwd=work)
    assert "holds" in claims and len(claims.splitlines()) > 10
    if source == "tree":  # the shipped notebooks run: `kvlab run` on the environment's own kernel, into ./runs
        env = _clean_env() | {"KVLAB_KERNEL": "python3"}
        _run([bin_ / "kvlab", "run", "01"], cwd=work, env=env)
        results = json.loads((work / "runs" / "latest" / "results.json").read_text())
        assert results["notebooks"]["01_kv_bytes_per_token"]["results"]["bytes_per_token"] == 147456
