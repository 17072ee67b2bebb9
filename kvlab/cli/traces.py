"""`kvlab traces list | fetch NAME`: the public request traces, downloaded and verified into the data folder.

The listing says, for each trace, the copy a command would read (the data folder's, else a developer's mirror) and
whether it matches its published checksum: only a verified copy is read, an unverified one is refused.
"""
from __future__ import annotations

import json


def _state(r: dict) -> str:
    """Where a command reads the trace from, in words."""
    if r["read_from"] is None:
        return f"not available: `kvlab traces fetch {r['name']}` downloads it"
    if r["usable"]:
        return f"read from {r['read_from']} ({r['read_from_kind']}, checksum verified)"
    return (f"REFUSED: {r['read_from']} ({r['read_from_kind']}) does not match its published checksum; "
            f"`kvlab traces fetch {r['name']} --force` saves a verified copy in the data folder")


def cmd_list(args) -> int:
    from ..sim import catalog
    rows = catalog.status()
    if args.json:
        print(json.dumps(dict(data_dir=str(catalog.data_dir()), mirror=str(catalog.MIRROR_DIR), traces=rows),
                         indent=2))
        return 0
    mirror = catalog.MIRROR_DIR
    print(f"data folder: {catalog.data_dir() / 'traces'} (set KVLAB_DATA to move it); developer mirror: {mirror} "
          f"({'present' if mirror.is_dir() else 'absent'}); a name is read from the first of the two that holds it")
    for r in rows:
        size = f"{r['size'] / 1e6:,.1f} MB" if r["size"] else "size unknown"
        alias = f" (also: {', '.join(r['aliases'])})" if r["aliases"] else ""
        check = f"sha256 {r['sha256']}" if r["sha256"] else f"git blob {r['git_blob']}"
        print(f"  {r['name']}{alias}: {size}; {r['licence']}")
        print(f"      {_state(r)}")
        print(f"      {r['description']}")
        print(f"      {r['url']}")
        print(f"      {check}")
    return 0


def cmd_fetch(args) -> int:
    from ..sim import catalog
    names = list(catalog.CATALOG) if args.name == "all" else [args.name]
    for n in names:
        t = catalog.get(n)
        dest = catalog.local_path(t)
        stale = dest.is_file() and not dest.is_symlink() and not catalog.verified(t, dest)
        path = catalog.fetch(n, force=args.force)
        note = "; replaced a saved copy that did not match it" if stale else ""
        print(f"{t.name}: {path} (verified, {catalog.expected(t)}{note})")
    return 0


def register(sub) -> None:
    from ..sim.catalog import ALIASES, CATALOG
    m = sub.add_parser("traces", help="public request traces: list them, fetch one into the data folder")
    s = m.add_subparsers(dest="traces_command", required=True, parser_class=type(m))
    ls = s.add_parser("list", help="the catalog: source, licence, checksum, and the copy each is read from")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
    f = s.add_parser("fetch", help="download a trace from its pinned source, verify its checksum, keep it")
    f.add_argument("name", choices=list(CATALOG) + list(ALIASES) + ["all"], metavar="NAME",
                   help=f"one of {', '.join(CATALOG)} (or an alias), or all")
    f.add_argument("--force", action="store_true", help="download again even when a verified copy is saved")
    f.set_defaults(func=cmd_fetch)
