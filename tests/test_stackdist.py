"""Stack distances and the one-pass LRU hit curve against hand counts and an OrderedDict LRU."""
from collections import OrderedDict

import numpy as np
import pytest

from kvlab.sim import kernels as lru_kernels
from kvlab.sim.stackdist import _stack_distances_numpy, earlier_greater, hit_curve, previous_access, stack_distances


def lru_hits(ids, cap):
    od, h = OrderedDict(), 0
    for x in ids:
        if x in od:
            od.move_to_end(x)
            h += 1
        else:
            od[x] = None
            if len(od) > cap:
                od.popitem(last=False)
    return h


def test_hand_example():
    ids = np.array([0, 1, 2, 0, 1, 1, 3, 0])
    assert previous_access(ids).tolist() == [-1, -1, -1, 0, 1, 4, -1, 3]
    # a b c a b b d a: the last a saw b, b, d since its previous use: two distinct blocks
    assert stack_distances(ids).tolist() == [-1, -1, -1, 2, 2, 0, -1, 2]
    caps, hits = hit_curve(stack_distances(ids), [1, 2, 3, 10])
    assert hits.tolist() == [1, 1, 4, 4]


def test_earlier_greater():
    y = np.array([5, 1, 7, 3, 0, 6])
    expect = [sum(y[j] > y[k] for j in range(k)) for k in range(len(y))]
    assert earlier_greater(y).tolist() == expect
    assert earlier_greater(np.array([], np.int64)).tolist() == []


@pytest.mark.parametrize("seed", range(5))
def test_matches_ordereddict_lru(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 40, 600)
    d = stack_distances(ids)
    caps = list(range(1, 45))
    _, hits = hit_curve(d, caps)
    assert hits.tolist() == [lru_hits(ids.tolist(), c) for c in caps]


@pytest.mark.parametrize("seed", range(3))
def test_numpy_path_matches_ordereddict_lru(seed):
    ids = np.random.default_rng(seed).integers(0, 30, 400)
    _, hits = hit_curve(_stack_distances_numpy(ids), range(1, 35))
    assert hits.tolist() == [lru_hits(ids.tolist(), c) for c in range(1, 35)]


@pytest.mark.skipif(not lru_kernels.ENABLED, reason="numba not available")
@pytest.mark.parametrize("seed", range(3))
def test_fenwick_kernel_equals_numpy_path(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(-50, 3000, 5000) * 7  # negative and sparse ids are renumbered first
    prev, dist = lru_kernels.stack_distances(ids)
    assert np.array_equal(prev, previous_access(ids))
    assert np.array_equal(dist, _stack_distances_numpy(ids)) and (dist > 100).any()
