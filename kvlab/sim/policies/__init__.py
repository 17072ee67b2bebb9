"""Eviction policies behind one interface (kvlab.sim.policies.base) and a registry.

Registered, in order: lru, fifo, lfu, sieve, s3fifo, arc, belady, belady-bypass. Each class is the policy's
block-by-block reference; kvlab.sim.policy_kernels holds the compiled paths; tests hold both equal to
libCacheSim (PyPI `libcachesim`, the optional `oracle` extra) where it is installed.
"""
from .base import ADMISSIONS, NEVER, REGISTRY, Policy, admit_after, get_policy, policy_names, register  # noqa: F401
from .lru import LRU  # noqa: F401
from .fifo import FIFO  # noqa: F401
from .lfu import LFU  # noqa: F401
from .sieve import SIEVE  # noqa: F401
from .s3fifo import S3FIFO  # noqa: F401
from .arc import ARC  # noqa: F401
from .belady import Belady, BeladyBypass  # noqa: F401

ONLINE = [n for n, c in REGISTRY.items() if not c.offline]  # the policies an engine can run
