"""Where kvlab's files are: its data and notebooks, read as package data through importlib.resources.

The repository keeps data/ and notebooks/ at its top level, the one place people look and edit. kvlab/data and
kvlab/notebooks are symbolic links to them, so a checkout (editable install, PYTHONPATH) reads them in place, and
setuptools follows the links when it builds an sdist or a wheel, which therefore carry real copies
(`[tool.setuptools.package-data]` in pyproject.toml). No copy is ever committed, so none can drift.
"""
from __future__ import annotations

import os
import sys
from importlib.resources import files
from pathlib import Path


def package_dir(name: str) -> Path:
    """The folder kvlab/<name> ("data", "notebooks") as a filesystem path.

    Falls back to the repository's top-level folder where the link did not survive (a checkout made without
    symlink support keeps it as a small text file)."""
    here = files("kvlab") / name
    if isinstance(here, Path) and here.is_dir():
        return here
    top = Path(__file__).resolve().parent.parent / name
    return top if top.is_dir() else Path(str(here))


def data_dir() -> Path:
    """Where kvlab keeps data it downloads or builds (traces, converted models): $KVLAB_DATA, else the platform's
    per-user cache folder + kvlab ($XDG_CACHE_HOME/kvlab or ~/.cache/kvlab on Linux, ~/Library/Caches/kvlab on
    macOS, %LOCALAPPDATA%\\kvlab\\Cache on Windows)."""
    env = os.environ.get("KVLAB_DATA")
    if env:
        return Path(env).expanduser()
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "kvlab"
    if os.name == "nt":
        return Path(os.environ.get("LOCALAPPDATA", home / "AppData" / "Local")) / "kvlab" / "Cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "kvlab"
