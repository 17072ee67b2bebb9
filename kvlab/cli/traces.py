"""`kvlab traces list | fetch NAME`: the public request traces, downloaded and verified into the data folder."""
from __future__ import annotations

import json


def cmd_list(args) -> int:
    from ..sim import catalog
    rows = catalog.status()
    if args.json:
        print(json.dumps(dict(data_dir=str(catalog.data_dir()), traces=rows), indent=2))
        return 0
    print(f"data folder: {catalog.data_dir() / 'traces'} (set KVLAB_DATA to move it)")
    for r in rows:
        state = "verified" if r["verified"] else ("saved, checksum differs" if r["saved"] else "not downloaded")
        size = f"{r['size'] / 1e6:,.1f} MB" if r["size"] else "size unknown"
        alias = f" (also: {', '.join(r['aliases'])})" if r["aliases"] else ""
        check = f"sha256 {r['sha256']}" if r["sha256"] else f"git blob {r['git_blob']}"
        print(f"  {r['name']}{alias}: {state}; {size}; {r['licence']}")
        print(f"      {r['description']}")
        print(f"      {r['url']}")
        print(f"      {check}")
    return 0


def cmd_fetch(args) -> int:
    from ..sim import catalog
    names = list(catalog.CATALOG) if args.name == "all" else [args.name]
    for n in names:
        t = catalog.get(n)
        print(f"{t.name}: {catalog.fetch(n, force=args.force)} (verified, {catalog.expected(t)})")
    return 0


def register(sub) -> None:
    from ..sim.catalog import ALIASES, CATALOG
    m = sub.add_parser("traces", help="public request traces: list them, fetch one into the data folder")
    s = m.add_subparsers(dest="traces_command", required=True, parser_class=type(m))
    ls = s.add_parser("list", help="the catalog: source, licence, checksum, and whether each is downloaded")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
    f = s.add_parser("fetch", help="download a trace from its pinned source, verify its checksum, keep it")
    f.add_argument("name", choices=list(CATALOG) + list(ALIASES) + ["all"], metavar="NAME",
                   help=f"one of {', '.join(CATALOG)} (or an alias), or all")
    f.add_argument("--force", action="store_true", help="download again even when a verified copy is saved")
    f.set_defaults(func=cmd_fetch)
