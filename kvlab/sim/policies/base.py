"""The eviction-policy interface every policy implements, and the registry the CLI's choices come from.

A policy instance is one cache of `capacity` unit-size blocks. libCacheSim's request (`get`) is split in two
so that a tier hierarchy can act between the halves (remove a block found in a lower tier, then store it here):

  lookup(b)      True if b is resident, recording the hit in the policy's metadata; False otherwise, after the
                 bookkeeping a miss does before insertion (ARC's and S3-FIFO's ghost entries)
  insert(b)      make room and store b, which is not resident: returns (victim, stored), the block that left
                 (-1 if none; at most one, blocks being of unit size) and whether b was kept (False where the
                 policy declines it, e.g. S3-FIFO with a one-block small queue, or the bypassing optimum)
  remove(b)      take resident b out (promoted to a higher tier, or expired)
  get(b)         lookup(b), or insert(b) on a miss: one libCacheSim request, True on a hit
  insert_run(bs) lookup(b) then insert(b) for each of `bs` (distinct, none resident) in order: (the blocks kept,
                 the residents that left, each in order); a policy may do it in bulk (LRU, FIFO)

Offline policies (`offline = True`, Belady's) read each block's next use from `future[b]` (an array or a dict)
that the driver updates before every access (`NEVER` where the block is not used again).

Each policy has a block-by-block reference (the class itself, in plain Python) and a compiled path
(kvlab.sim.policy_kernels, selected by `kernel`); tests hold the two equal and both equal to libCacheSim.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from ...checks import need_choice, need_int
from ...errors import ParameterError

ADMISSIONS = {"all": 1, "second": 2}  # admission rule -> accesses a block needs before it is stored


def admit_after(admission: str) -> int:
    """Accesses a block needs before a cache stores it: "all" 1 (every block), "second" 2."""
    return ADMISSIONS[need_choice("admission", admission, ADMISSIONS)]


NEVER = np.iinfo(np.int64).max  # next use of a block that is not accessed again

REGISTRY: dict[str, type["Policy"]] = {}  # name -> class, in registration order


def register(cls: type["Policy"]) -> type["Policy"]:
    """Class decorator: add a policy to the registry under its `name`, with the next kernel id (its branch in
    kvlab.sim.policy_kernels): registration is the one place a policy's id comes from."""
    if cls.name in REGISTRY:
        raise ValueError(f"policy {cls.name!r} registered twice")
    cls.kernel = len(REGISTRY)
    REGISTRY[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    """Registered policy names (the CLI's --policy choices)."""
    return list(REGISTRY)


def get_policy(name: str) -> type["Policy"]:
    """The policy class registered as `name`."""
    return REGISTRY[need_choice("policy", name, REGISTRY)]


class Policy:
    """Base class: one cache of `capacity` blocks under one eviction policy (see the module docstring)."""

    name: ClassVar[str]  # registry key, e.g. "lru"
    title: ClassVar[str]  # display name, e.g. "LRU"
    kernel: ClassVar[int]  # policy id in the compiled kernels (kvlab.sim.policy_kernels), set by `register`
    offline: ClassVar[bool] = False  # needs each block's next use (future)
    min_capacity: ClassVar[int] = 1  # smallest capacity the policy is defined for

    def __init__(self, capacity: int, future=None):
        self.capacity = self.check_capacity(capacity)
        if self.offline and future is None:
            raise ParameterError(f"{self.title} is offline: it needs the next use of each block (future=)")
        self.future = future

    @classmethod
    def check_capacity(cls, capacity) -> int:
        c = need_int(f"{cls.title} capacity (blocks)", capacity, 1)
        if c < cls.min_capacity:
            raise ParameterError(f"{cls.title} needs a capacity of at least {cls.min_capacity} blocks "
                                 f"({cls.min_capacity_reason()}), got {c}")
        return c

    @classmethod
    def min_capacity_reason(cls) -> str:
        return ""

    @classmethod
    def params(cls) -> tuple[float, ...]:
        """Numeric parameters handed to the compiled kernel (the policy's open choices)."""
        return ()

    def lookup(self, b: int) -> bool:
        raise NotImplementedError

    def insert(self, b: int) -> tuple[int, bool]:
        raise NotImplementedError

    def remove(self, b: int) -> None:
        raise NotImplementedError

    def __contains__(self, b: int) -> bool:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def insert_run(self, blocks: list) -> tuple[list, list]:
        kept, left = [], []
        for b in blocks:
            self.lookup(b)
            v, stored = self.insert(b)
            if stored:
                kept.append(b)
            if v >= 0 and v != b:
                left.append(v)
        return kept, left

    def get(self, b: int) -> bool:
        if self.lookup(b):
            return True
        self.insert(b)
        return False
