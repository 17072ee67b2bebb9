"""The block pool's key table (kvlab.serving.blockpool: open addressing, linear probing, removal by backward shift)
against a dict: random inserts, lookups and removals in tables small enough that probe runs wrap and collide."""
import numpy as np
import pytest

from kvlab.serving import blockpool as bp


def insert(tab, k, v):
    s, found = bp._slot(tab, np.int64(k))
    assert not found
    tab[s] = (k, v)


def remove(tab, k):
    s, found = bp._slot(tab, np.int64(k))
    assert found
    bp._remove_slot(tab, s)


def lookup(tab, keys):
    out = np.empty(len(keys), np.int64)
    bp._lookup(tab, np.asarray(keys, np.int64), out)
    return out.tolist()


@pytest.mark.parametrize("seed", range(6))
def test_key_table_equals_a_dict(seed):
    rng = np.random.default_rng(seed)
    slots = 16 if seed % 2 else 64
    tab, d = np.full((slots, 2), -1, np.int64), {}
    # dense prompt-like keys, output-like negative keys, keys far apart in the high half
    pool = np.concatenate([np.arange(40), -1 - np.arange(20), (np.arange(20) << 40) + 3, [2**63 - 1, -2**63]])
    for _ in range(3000):
        k = int(rng.choice(pool))
        if k in d and rng.random() < 0.5:
            remove(tab, k)
            del d[k]
        elif k not in d and len(d) < slots - 1:
            v = int(rng.integers(1, 10**6))
            insert(tab, k, v)
            d[k] = v
        probe = [int(x) for x in rng.choice(pool, 12)]
        assert lookup(tab, probe) == [d.get(x, -1) for x in probe]
        assert int((tab[:, 1] >= 0).sum()) == len(d)
    big = np.full((4 * slots, 2), -1, np.int64)
    bp._rehash(tab, big)
    assert lookup(big, list(pool)) == [d.get(int(x), -1) for x in pool]
