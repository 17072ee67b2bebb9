"""Strip volatile metadata (papermill timings, execution dates) from executed notebooks, outputs kept.

Usage: python -m kvlab.nb.nbclean NOTEBOOK [...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def clean(path: str | Path) -> None:
    p = Path(path)
    nb = json.loads(p.read_text())
    pm = nb.get("metadata", {}).get("papermill")
    if pm is not None:
        nb["metadata"]["papermill"] = {k: v for k, v in pm.items()
                                       if k in ("parameters",) and not k.endswith("_path")}
    for cell in nb.get("cells", []):
        md = cell.get("metadata", {})
        md.pop("papermill", None)
        md.pop("execution", None)
    p.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    for a in sys.argv[1:]:
        clean(a)
