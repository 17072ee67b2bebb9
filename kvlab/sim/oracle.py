"""libCacheSim as the oracle: a block stream through libCacheSim's own policy, for tests and benchmarks.

libCacheSim (PyPI `libcachesim`, Python bindings of the C simulator of cache research; kvlab's optional `oracle`
extra, wheels for Linux x86-64 only) is the field's reference implementation of the policies in
kvlab.sim.policies. Blocks are unit-size objects, the capacity is in blocks. Two ways to drive it:
  `hits_trace`  `process_trace` over a binary trace file (libCacheSim's oracleGeneral format: 24-byte records
                of uint32 time, uint64 id, uint32 size, int64 next-access index) - its C loop end to end
  `hits_get`    one `get(Request)` call per access from Python (slow; exact per-access answers)
Both return exact hit counts (the trace path turns libCacheSim's miss ratio back into a count).
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from ..checks import need_choice, need_int
from ..errors import KvlabError
from .policies import ADMISSIONS
from .stackdist import next_access

CLASSES = {"lru": "LRU", "fifo": "FIFO", "lfu": "LFU", "sieve": "Sieve", "s3fifo": "S3FIFO", "arc": "ARC",
           "belady": "Belady"}  # kvlab policy -> libCacheSim class (belady-bypass has no counterpart)
RECORD = np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])  # oracleGeneral, packed


class OracleMissing(KvlabError):
    """libCacheSim is not installed (pip install 'kvlab[oracle]'; Linux x86-64 wheels only)."""


def available() -> bool:
    try:
        import libcachesim  # noqa: F401
        return True
    except ImportError:
        return False


def _lcs():
    try:
        import libcachesim
    except ImportError:
        raise OracleMissing("libCacheSim is not installed: pip install 'kvlab[oracle]' "
                            "(PyPI libcachesim; wheels for Linux x86-64 only)") from None
    return libcachesim


def make_cache(policy: str, capacity: int, admission: str = "all", distinct: int = 1 << 23):
    """libCacheSim's cache for a kvlab policy name, `capacity` unit-size blocks; admission "second" uses its
    BloomFilterAdmissioner (an exact table of ids seen on earlier misses: admit from the second access on).
    Its hash table is sized for `distinct` ids (libCacheSim's default, 2**24 buckets, costs ~0.1 s per cache)."""
    lcs = _lcs()
    cls = getattr(lcs, CLASSES[need_choice("policy", policy, CLASSES)])
    need_choice("admission", admission, ADMISSIONS)
    adm = lcs.BloomFilterAdmissioner() if admission == "second" else None
    hashpower = min(max(int(distinct).bit_length() + 1, 12), 24)
    return cls(need_int("capacity", capacity, 1), hashpower=hashpower, admissioner=adm)


def write_trace(ids, path) -> None:
    """Write a block stream as an oracleGeneral binary trace (unit sizes; next access for Belady)."""
    ids = np.asarray(ids, np.int64)
    rec = np.zeros(len(ids), RECORD)
    rec["id"] = ids + 1  # libCacheSim treats id 0 as no object in places; shift every id by one
    rec["size"] = 1
    nxt = next_access(ids, never=-1)
    rec["next"] = nxt
    rec.tofile(path)


def write_csv(ids, path) -> None:
    """Write a block stream as a CSV trace (time, id, size), the text form libCacheSim also reads (its CSV reader
    takes no next-access column, so Belady needs the binary trace)."""
    ids = np.asarray(ids, np.int64)
    np.savetxt(path, np.stack([np.arange(len(ids)), ids + 1, np.ones(len(ids), np.int64)], axis=1), fmt="%d",
               delimiter=",")


def reader(path):
    """libCacheSim's reader for a trace written by `write_trace` (binary) or `write_csv` (name ending .csv)."""
    lcs = _lcs()
    if str(path).endswith(".csv"):
        p = lcs.ReaderInitParam(has_header=False, delimiter=",")
        p.time_field, p.obj_id_field, p.obj_size_field = 1, 2, 3
        return lcs.TraceReader(str(path), lcs.TraceType.CSV_TRACE, reader_init_params=p)
    return lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)


def hits_trace(policy: str, capacity: int, path, n: int, admission: str = "all", distinct: int = 1 << 23) -> int:
    """Hits of libCacheSim's `process_trace` over a trace written by `write_trace` with `n` records."""
    miss_ratio, _ = make_cache(policy, capacity, admission, distinct).process_trace(reader(path))
    return int(round((1.0 - miss_ratio) * n))


def hits_get(policy: str, capacity: int, ids, admission: str = "all") -> np.ndarray:
    """[N] bool: libCacheSim's answer (hit) for each access, one `get` per access from Python."""
    lcs = _lcs()
    ids = np.asarray(ids, np.int64)
    nxt = next_access(ids, never=np.iinfo(np.int64).max)
    c = make_cache(policy, capacity, admission, len(np.unique(ids)))
    out = np.zeros(len(ids), bool)
    req = lcs.Request()
    req.obj_size = 1
    for i, (b, nx) in enumerate(zip(ids.tolist(), nxt.tolist())):
        req.obj_id = b + 1
        req.next_access_vtime = nx
        out[i] = c.get(req)
    return out


def hits(policy: str, capacities, ids, admission: str = "all") -> list[int]:
    """libCacheSim's hit counts at each capacity for one block stream (through a temporary trace file)."""
    ids = np.asarray(ids, np.int64)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "blocks.oracleGeneral.bin")
        write_trace(ids, path)
        distinct = len(np.unique(ids))
        return [hits_trace(policy, c, path, len(ids), admission, distinct) for c in capacities]
