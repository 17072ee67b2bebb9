"""A model's config.json by its Hugging Face Hub id (`Qwen/Qwen3-8B`), through huggingface_hub and its cache.

`read_hub_config("ORG/NAME")` resolves config.json through huggingface_hub: from the local cache first
($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub: models--ORG--NAME/refs/main ->
snapshots/<sha>/config.json) -- a released model's config does not change, and a cached one is read without a
network round trip -- and otherwise, unless offline (HF_HUB_OFFLINE=1), from the Hub, with the token in HF_TOKEN
for gated repositories (huggingface_hub's retry messages are kept off the terminal). The environment is read at each call, so a test (or a notebook) may point HF_HOME at its own
cache. Every failure -- offline and not cached, no network, a gated or missing repository -- is one
UnknownModelError naming the repository and what to do.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import ConfigError, UnknownModelError

TRUE = {"1", "ON", "YES", "TRUE"}


def cache_dir() -> Path:
    """The hub cache huggingface_hub would use, from the environment as it is now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in TRUE


def read_hub_config(repo_id: str, revision: str | None = None) -> dict:
    """The config.json of Hub model `repo_id` (cache first; the Hub unless offline), as a dict."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub import errors as hub_errors
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        raise UnknownModelError(f"{repo_id}: reading a model by its Hub id needs huggingface_hub "
                                "(pip install huggingface_hub), or give a config.json path") from None
    cache = cache_dir()
    try:
        try:  # the cache first: no network round trip for a config that is already here
            path = hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=str(cache),
                                   local_files_only=True)
        except hub_errors.EntryNotFoundError:
            if offline():
                raise
            with _quiet():
                path = hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=str(cache),
                                       token=os.environ.get("HF_TOKEN") or None)
    except hub_errors.GatedRepoError:
        raise UnknownModelError(f"{repo_id} is a gated model: accept its licence on huggingface.co and set HF_TOKEN "
                                "to a token that may read it (or give a config.json path)") from None
    except hub_errors.RepositoryNotFoundError:
        raise UnknownModelError(f"{repo_id}: no such model on the Hugging Face Hub (a private one needs HF_TOKEN); "
                                "check the id, or give a catalog name or a config.json path") from None
    except hub_errors.RevisionNotFoundError:
        raise UnknownModelError(f"{repo_id}: revision {revision!r} not found on the Hub") from None
    except hub_errors.EntryNotFoundError:
        if offline():
            raise UnknownModelError(f"{repo_id}: config.json is not in the Hugging Face cache ({cache}) and "
                                    "HF_HUB_OFFLINE=1 forbids fetching it; run once online, or give a config.json "
                                    "path") from None
        raise UnknownModelError(f"{repo_id}: config.json could not be fetched from the Hugging Face Hub and is not in "
                                f"the cache ({cache}); check the network, or give a config.json path") from None
    except hub_errors.HfHubHTTPError as e:
        raise UnknownModelError(f"{repo_id}: the Hugging Face Hub refused config.json ({str(e).splitlines()[0][:120]})"
                                ) from None
    except (OSError, ValueError) as e:  # no network, a broken cache, an id the Hub refuses
        raise UnknownModelError(f"{repo_id}: config.json could not be read from the Hub or the cache ({cache}): "
                                f"{str(e).splitlines()[0][:160] if str(e) else type(e).__name__}") from None
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise ConfigError(f"{repo_id}: the cached config.json ({path}) is not readable JSON ({str(e)[:120]})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{repo_id}: config.json must hold a JSON object")
    cfg.setdefault("_source", f"{repo_id} config.json on the Hugging Face Hub (huggingface_hub cache {cache})")
    return cfg


class _quiet:
    """huggingface_hub's own log lines (retries, warnings) off while kvlab reports the outcome in one line."""

    def __enter__(self):
        import logging
        self.logger = logging.getLogger("huggingface_hub")
        self.level = self.logger.level
        self.logger.setLevel(logging.CRITICAL)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)
        return False
