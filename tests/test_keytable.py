"""The directories (kvlab.serving.blockpool._probe: open addressing, linear probing, removal by backward shift) and
the pool's paged key table built on one (`new_key_table`: a directory of key families, pages of their keys) against
a dict: random inserts, lookups and removals in tables small enough that probe runs wrap and collide, and pages
emptied, freed and reused."""
import numpy as np
import pytest

from kvlab.errors import ParameterError
from kvlab.serving import blockpool as bp

# dense prompt-like keys, output-like negative keys, keys far apart in the high half, the extremes
KEYS = np.concatenate([np.arange(40), -1 - np.arange(20), (np.arange(20) << 40) + 3, [2**63 - 1, -2**63]])


@pytest.mark.parametrize("seed", range(6))
def test_directory_equals_a_dict(seed):
    rng = np.random.default_rng(seed)
    slots = 16 if seed % 2 else 64
    base = 3 * (seed % 3)  # a directory may start anywhere in its array
    d, want = np.full(base + 2 * slots, -1, np.int64), {}
    for _ in range(3000):
        k = int(rng.choice(KEYS))
        e, found = bp._probe(d, base, slots - 1, np.int64(k))
        assert found == (k in want)
        if found and rng.random() < 0.5:
            bp._unprobe(d, base, slots - 1, e)
            del want[k]
        elif not found and len(want) < slots - 1:
            d[e], d[e + 1] = k, int(rng.integers(1, 10**6))
            want[k] = int(d[e + 1])
        for x in rng.choice(KEYS, 12):
            e, found = bp._probe(d, base, slots - 1, np.int64(x))
            assert (int(d[e + 1]) if found else -1) == want.get(int(x), -1)
        assert int((d[base + 1::2] >= 0).sum()) == len(want)


@pytest.mark.parametrize("span,step", [(1, 1), (8, 1), (4096, 16), (500, 16), (1000, 3)])
@pytest.mark.parametrize("seed", range(3))
def test_paged_key_table_equals_a_dict(span, step, seed):
    """Keys t * span + offset (one t's offsets congruent modulo step, as a trace's prompt keys are) and output
    keys: set, looked up, unset; a page holding no key leaves the directory and is reused; a table grown by
    `_regrow` holds the same."""
    rng = np.random.default_rng(seed)
    families = rng.integers(0, 1 << 40, 6)
    prompt = [int(t) * span + o for i, t in enumerate(families) for o in range(i % step, span, step)][:4000]
    keys = np.asarray(prompt + [bp.output_key(r, i) for r in (0, 5, 2**20) for i in range(0, 700, 7)], np.int64)
    tab, want = bp.new_key_table(8 if seed == 0 else len(keys), span, step), {}  # 8 pages: long probe runs, wrapping
    peak = 0
    for _ in range(6000):
        k = np.int64(rng.choice(keys))
        f, s = bp._family(tab, k)
        if int(k) in want and rng.random() < 0.5:
            at = bp._page(tab, f, False)
            tab[at + s] = -1
            tab[at + tab[bp.T_P]] -= 1
            if tab[at + tab[bp.T_P]] == 0:
                bp._page_free(tab, f, at)
            del want[int(k)]
        elif int(k) not in want and tab[bp.T_LIVE] + 1 < min(tab[bp.T_PAGES], tab[bp.T_DSLOTS] // 2):
            at = bp._page(tab, f, True)
            assert tab[at + s] == -1
            tab[at + s] = v = int(rng.integers(1, 10**6))
            tab[at + tab[bp.T_P]] += 1
            want[int(k)] = v
            peak = max(peak, int(tab[bp.T_LIVE]))
        for x in rng.choice(keys, 8):
            assert bp._first(tab, np.int64(x)) == want.get(int(x), -1)
    assert tab[bp.T_LIVE] == len({bp._family(tab, np.int64(k))[0] for k in want})
    assert tab[bp.T_FRESHPG] == peak, "a page was taken new while a freed one waited"
    big = bp.new_key_table(4 * int(tab[bp.T_PAGES]), span, step)
    bp._regrow(tab, big)
    assert all(bp._first(big, np.int64(k)) == want.get(int(k), -1) for k in keys)


def test_paged_key_table_refuses_nonpositive_span_or_step():
    for span, step in ((0, 1), (16, 0), (-4, 16)):
        with pytest.raises(ParameterError, match="span and step"):
            bp.new_key_table(8, span, step)
