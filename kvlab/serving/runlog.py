"""What a serving run leaves for a user to look into: one CSV row per request, one JSON line per step.

Files are written only when the run is over, through a temporary name renamed into place, and never over a file
that exists (check_new_file refuses it, and a missing folder, before any work).
"""
from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from ..errors import ParameterError

REQUEST_COLUMNS = ("id", "arrival_s", "admitted_s", "first_token_s", "finish_s", "preemptions", "prefix_hit_tokens",
                   "rejected")


def check_new_file(flag: str, path) -> Path:
    """`path` as a new file: its folder exists, it does not."""
    p = Path(path)
    if p.exists() or p.is_symlink():
        raise ParameterError(f"{flag} {p}: the file exists (kvlab never writes over one)")
    if not p.parent.is_dir():
        raise ParameterError(f"{flag} {p}: folder {p.parent} does not exist")
    return p


def _write(path, text: str) -> None:
    p = check_new_file("output", path)
    tmp = p.with_name(p.name + ".part")
    tmp.write_text(text)
    os.replace(tmp, p)


def _t(x) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else repr(float(x))


def requests_rows(r) -> list[dict]:
    """One dict per request of a ServeResult (times in seconds from the trace's start; empty: never happened)."""
    rows = []
    for i in range(len(r.arrival_s)):
        a = float(r.arrival_s[i])
        rej = bool(r.rejected[i])
        rows.append(dict(id=i, arrival_s=_t(a), admitted_s=_t(a + r.queue_s[i]), first_token_s=_t(a + r.ttft_s[i]),
                         finish_s=_t(a + r.e2e_s[i]),
                         preemptions=int(r.request_preemptions[i]) if r.request_preemptions is not None else "",
                         prefix_hit_tokens=int(r.prefix_hit_tokens[i]) if r.prefix_hit_tokens is not None else "",
                         rejected=int(rej)))
    return rows


def write_requests_csv(path, r) -> None:
    import io
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=REQUEST_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(requests_rows(r))
    _write(path, buf.getvalue())


def write_steps_jsonl(path, r) -> None:
    """One line per step: time (its start), replica, tokens {request: [prefill, decode]}, preempted, free_blocks."""
    if r.steps_log is None:
        raise ParameterError("this run recorded no steps (simulate_serving(..., record_steps=True) does)")
    lines = [json.dumps(dict(time=e["time"], replica=e["replica"], tokens={str(k): v for k, v in e["tokens"].items()},
                             preempted=e["preempted"], free_blocks=e["free_blocks"]), separators=(",", ":"))
             for e in r.steps_log]
    _write(path, "".join(x + "\n" for x in lines))
