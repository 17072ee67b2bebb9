"""kvlab.serving.keytable.KeyTable against a dict: random bulk and scalar operations, collisions, tombstones, growth."""
import numpy as np
import pytest

from kvlab.serving.keytable import KeyTable


@pytest.mark.parametrize("seed", range(6))
def test_key_table_equals_a_dict(seed):
    rng = np.random.default_rng(seed)
    t, d = KeyTable(8 if seed % 2 else 1024), {}
    span = [50, 10**6, 2**62][seed % 3]  # dense keys (many collisions after masking), sparse, huge
    for _ in range(300):
        op = rng.random()
        if op < 0.45:  # insert a run of new distinct keys, some negative (output keys are)
            ks = np.unique(rng.integers(-span, span, int(rng.integers(1, 60))))
            ks = np.array([k for k in ks.tolist() if k not in d], np.int64)
            rng.shuffle(ks)
            vals = rng.integers(0, 10**9, len(ks))
            t.insert_new(ks, vals)
            d.update(zip(ks.tolist(), vals.tolist()))
        elif op < 0.75 and d:  # remove some present keys
            ks = rng.choice(np.array(list(d), np.int64), int(rng.integers(1, len(d) + 1)), replace=False)
            t.remove_many(ks)
            for k in ks.tolist():
                del d[k]
        elif op < 0.85 and d:  # scalar set / delete / get
            k = int(rng.choice(np.array(list(d), np.int64)))
            t[k] = 7
            d[k] = 7
            assert t[k] == 7 and t.get(k) == 7 and k in t
            del t[k]
            del d[k]
            assert k not in t and t.get(k, -5) == -5
            with pytest.raises(KeyError):
                t[k]
        else:  # scalar insert or overwrite
            k = int(rng.integers(-span, span))
            t[k] = d[k] = int(rng.integers(10**9))
        q = rng.integers(-span, span, 40).tolist() + list(d)[:40]
        want = [d.get(k, -1) for k in q]
        assert t.get_many(np.array(q, np.int64)).tolist() == want
        assert len(t) == len(d) and dict(t.items()) == d
    assert t.used <= (t.mask + 1) // 4
