"""A GGUF checkpoint turned into an ordinary transformers model folder, once, so later loads take seconds.

transformers reads GGUF files itself (`from_pretrained(folder, gguf_file=name)`, with the `gguf` package): it
dequantizes every tensor to float32 on each load (about 25 s for SmolLM2-135M on 2 cores) and the model it returns
refuses `save_pretrained` (its GGUF quantizer is not serializable). This module loads once and writes what an
ordinary checkpoint holds: config.json (without the GGUF `quantization_config`, so nothing needs `gguf` later),
model.safetensors (float32, each tied tensor stored once under its first name), the tokenizer and the generation
config. Reading the folder back gives the same weights bit for bit (tests/test_pretrained.py).

The weights are the GGUF's dequantized values: a 4-bit GGUF gives a slightly different model from the BF16
original (said in each registry entry, kvlab.hf.pretrained).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from ..errors import KvlabError

GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file (ggml's gguf.md)
WEIGHTS = "model.safetensors"


class ModelSourceError(KvlabError):
    """A model source that cannot be used: not GGUF, not installed, a checksum that differs, a failed conversion."""


def is_gguf(path: Path) -> bool:
    """Whether `path` is a file that starts with GGUF's magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_config(path: Path):
    """The transformers config a GGUF file describes (its metadata only: no tensor is read)."""
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ModelSourceError(f"{path}: transformers cannot read this GGUF file's config ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with each storage once (tied weights keep their first name, the input embedding),
    contiguous, as safetensors stores them."""
    out, seen = {}, set()
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().contiguous()
    return out


def convert_gguf(path: Path, dest: Path) -> None:
    """Dequantize the GGUF file `path` into the new model folder `dest` (config, float32 weights, tokenizer)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src, name = str(path.parent), path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(src, gguf_file=name, local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as e:
        raise ModelSourceError(f"{path}: transformers cannot load this GGUF file ({_first_line(e)})") from None
    config = model.config
    if hasattr(config, "quantization_config"):  # the GGUF quantizer: the folder's weights are plain float32
        del config.quantization_config
    config.architectures = [type(model).__name__]
    dest.mkdir(parents=True)
    config.save_pretrained(dest)
    model.generation_config.save_pretrained(dest)
    tok.save_pretrained(dest)
    save_file(unique_state(model), str(dest / WEIGHTS), metadata={"format": "pt"})
