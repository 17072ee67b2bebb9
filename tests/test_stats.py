"""kvlab.stats: Wilson intervals and paired bootstrap intervals on hand-worked cases."""
import math

import numpy as np
import pytest

from kvlab.errors import KvlabError
from kvlab.stats import (accuracy_interval, median_interval, paired_bootstrap, perplexity_change, samples_for_halfwidth,
                         wilson)


@pytest.mark.parametrize("k, n, low, high", [
    (8, 10, 0.4901625, 0.9433178),  # Brown, Cai & DasGupta's Wilson interval, worked by hand
    (0, 10, 0.0, 0.2775328),
    (10, 10, 0.7224672, 1.0),
    (50, 100, 0.4038315, 0.5961685),
    (1, 1, 0.2065493, 1.0),
])
def test_wilson_hand_worked(k, n, low, high):
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(low, abs=1e-6) and hi == pytest.approx(high, abs=1e-6)


def test_wilson_formula():
    """The centre (p + z^2/2n) / (1 + z^2/n) sits halfway between the ends."""
    k, n, z = 37, 120, 1.959963984540054
    lo, hi = wilson(k, n)
    p = k / n
    assert (lo + hi) / 2 == pytest.approx((p + z * z / (2 * n)) / (1 + z * z / n), rel=1e-12)
    a = accuracy_interval(k, n)
    assert (a.value, a.n, a.pair()) == (p, n, [lo, hi])


def test_samples_for_halfwidth():
    """The fewest samples whose Wilson interval around the observed proportion is at most +-h on each side."""
    def fits(n, p, h=0.05):
        k = round(p * n)
        lo, hi = wilson(k, n)
        return max(hi - k / n, k / n - lo) <= h
    for p in (0.5, 0.9, 0.95):
        n = samples_for_halfwidth(0.05, p)
        assert fits(n, p) and not fits(n - 1, p)
    assert 370 < samples_for_halfwidth(0.05, 0.5) < 385  # below the normal approximation's 385
    assert samples_for_halfwidth(0.05, 0.95) < samples_for_halfwidth(0.05, 0.5)
    # p = None: every proportion n samples can show; Wilson's skew makes it need more than p = 0.5 alone
    n = samples_for_halfwidth(0.05)
    assert all(fits(n, k / n) for k in range(n + 1)) and not all(fits(n - 1, k / (n - 1)) for k in range(n))
    assert n > samples_for_halfwidth(0.05, 0.5)


def test_paired_bootstrap_constant_shift_is_a_point():
    """Every window shifted by c nats per token: the change is exp(c) - 1 on every resample."""
    tokens = np.array([100, 80, 120, 90])
    ref = np.array([200.0, 150.0, 260.0, 170.0])
    c = 0.01
    iv = paired_bootstrap(ref, ref + c * tokens, tokens, seed=3)
    assert iv.value == pytest.approx(math.expm1(c), rel=1e-12)
    assert iv.low == pytest.approx(iv.value, rel=1e-9) and iv.high == pytest.approx(iv.value, rel=1e-9)
    assert not iv.covers_zero


def test_paired_bootstrap_noise_covers_zero_and_is_seeded():
    rng = np.random.default_rng(0)
    tokens = np.full(64, 256)
    ref = rng.normal(500, 40, 64)
    noisy = ref + rng.normal(0, 5, 64)  # no systematic change
    a, b = paired_bootstrap(ref, noisy, tokens, seed=1), paired_bootstrap(ref, noisy, tokens, seed=1)
    assert a == b and a.covers_zero and a.n == 64
    worse = paired_bootstrap(ref, ref + 20 + rng.normal(0, 5, 64), tokens, seed=1)
    assert worse.low > 0
    ch = perplexity_change(ref, noisy, tokens, seed=1)
    assert ch.within_noise and ch.reference == pytest.approx(math.exp(ref.sum() / tokens.sum()))


@pytest.mark.parametrize("call", [
    lambda: wilson(11, 10), lambda: wilson(2.0, 10), lambda: wilson(1, 0), lambda: wilson(True, 3),
    lambda: paired_bootstrap([1, 2], [1], [1, 1]), lambda: paired_bootstrap([], [], []),
    lambda: paired_bootstrap([1, float("nan")], [1, 2], [1, 1]), lambda: paired_bootstrap([1], [1], [0]),
    lambda: paired_bootstrap([1], [1], [1], resamples=2.0), lambda: samples_for_halfwidth(0),
])
def test_bad_inputs(call):
    with pytest.raises(KvlabError):
        call()


def test_quality_rows_carry_their_intervals():
    """kvlab.hf.quality's rows: Wilson on their answers, bootstrap on their windows, changes paired with bf16."""
    from kvlab.hf.quality import Row, changes
    base = dict(held_bytes=1, predicted_bytes=1, matches=True, bytes_per_token=None, model="m", kind="kvlab",
                context=64, window_tokens=[63, 63, 63])
    ref = Row(perplexity=0, accuracy=0.5, right=4, answers=8, window_nll=[100.0, 120.0, 90.0], setting="bf16",
              **base)
    worse = Row(perplexity=0, accuracy=0.25, right=2, answers=8, window_nll=[106.3, 126.3, 96.3], setting="int2",
                **base)
    assert ref.accuracy_ci == list(wilson(4, 8))
    lo, hi = ref.perplexity_ci
    assert lo < math.exp(310 / 189) < hi
    ch = changes([ref, worse])
    assert ch["m", "bf16", 64].change.pair() == [0.0, 0.0]
    c = ch["m", "int2", 64]
    assert c.change.value == pytest.approx(math.expm1(0.1), rel=1e-9) and not c.within_noise


def test_paired_accuracy_change_by_hand():
    """Paired over the same samples: the point is the difference of the accuracies; identical answers give
    [0, 0]; a setting right wherever the reference is, and more, never reads as a loss."""
    from kvlab.stats import paired_accuracy_change
    c = paired_accuracy_change([1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1])
    assert c.value == -0.25 and c.low <= -0.25 <= c.high <= 0.0 and c.n == 4
    same = paired_accuracy_change([1, 0, 1], [1, 0, 1], [1, 1, 1])
    assert same.pair() == [0.0, 0.0] and same.covers_zero
    up = paired_accuracy_change([0] * 20 + [1] * 20, [1] * 40, [1] * 40, seed=3)
    assert up.value == 0.5 and up.low > 0  # 20 of 40 gained, none lost: not within noise
    # several answers a sample (MQAR): the change is over answers, samples resampled whole
    m = paired_accuracy_change([2, 4], [1, 4], [4, 4])
    assert m.value == -1 / 8
    assert paired_accuracy_change([1, 0], [1, 0], [1, 1], seed=5) == paired_accuracy_change([1, 0], [1, 0], [1, 1],
                                                                                          seed=5)
    for bad in (([1], [1, 0], [1, 1]), ([2], [1], [1]), ([1], [1], [0]), ([], [], [])):
        with pytest.raises(KvlabError):
            paired_accuracy_change(*bad)


def test_median_interval():
    """The point is the median; equal values give a point; a wider spread a wider interval; seeded; blocks of
    correlated neighbours widen it (they carry less evidence than as many independent values)."""
    assert median_interval([3.0] * 50).pair() == [3.0, 3.0]
    rng = np.random.default_rng(1)
    x = rng.normal(1.0, 0.1, 400)
    iv = median_interval(x)
    assert iv.value == float(np.median(x)) and iv.low < iv.value < iv.high and iv.n == 400
    assert median_interval(x, seed=3) == median_interval(x, seed=3)
    wide = median_interval(1.0 + 3 * (x - 1.0))
    assert wide.high - wide.low > 2 * (iv.high - iv.low)
    walk = np.repeat(rng.normal(1.0, 0.1, 20), 20)  # 20 independent levels, each held for 20 values
    assert median_interval(walk, block=20).high - median_interval(walk, block=20).low > \
        median_interval(walk).high - median_interval(walk).low


@pytest.mark.parametrize("values, kw", [([], {}), ([1.0, float("nan")], {}), ([[1.0, 2.0]], {}),
                                        ([1.0, 2.0], {"block": 3}), ([1.0, 2.0], {"block": 0})])
def test_median_interval_refuses(values, kw):
    with pytest.raises(KvlabError):
        median_interval(values, **kw)
