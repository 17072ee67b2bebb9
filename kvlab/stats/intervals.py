"""Intervals on quality figures, so that a setting's cost can be told from noise.

Accuracy: the Wilson score interval (Wilson 1927; Brown, Cai & DasGupta 2001, "Interval Estimation for a Binomial
Proportion", recommend it over the normal approximation, which collapses to a point at 0 or n successes).
Perplexity change: a paired bootstrap over the evaluation windows (Efron & Tibshirani 1993; Koehn 2004 for paired
resampling of test sets): both settings are scored on the same windows, the windows are resampled with replacement
(seeded), and the change exp(NLL_b / tokens) / exp(NLL_a / tokens) - 1 is recomputed on each resample; the 2.5th and
97.5th percentiles bound it. A change whose interval covers zero is "within noise".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks import cdiv, need_int, need_number
from ..errors import ParameterError

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile (two-sided 95%)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its 95% interval."""

    value: float  # the estimate (an accuracy, a relative change)
    low: float  # lower end of the 95% interval
    high: float  # upper end
    n: int  # what it rests on: samples (accuracy) or windows (perplexity)

    @property
    def covers_zero(self) -> bool:
        return self.low <= 0.0 <= self.high

    @property
    def halfwidth(self) -> float:
        """The wider side of the interval around the estimate (what a sample count is grown to bound)."""
        return max(self.value - self.low, self.high - self.value)

    def pair(self) -> list[float]:
        return [self.low, self.high]


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval (low, high) of a binomial proportion successes / n."""
    need_int("n", n, 1)
    need_int("successes", successes, 0, n)
    need_number("z", z, 0.0)
    p = successes / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # the ends are exact at 0 and n successes
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def accuracy_interval(successes: int, n: int) -> Interval:
    """An accuracy with its Wilson 95% interval."""
    low, high = wilson(successes, n)
    return Interval(successes / n, low, high, n)


def samples_for_halfwidth(halfwidth: float, p: float | None = None, z: float = Z95) -> int:
    """Fewest samples whose Wilson interval around the observed proportion p is at most +-halfwidth on each side;
    p = None: around any proportion n samples can show (Wilson's interval is skewed, so off 0.5 its wider side
    outgrows the width at 0.5: this is the count that bounds every cell whatever its accuracy)."""
    need_number("halfwidth", halfwidth, 1e-6, 0.5)
    if p is not None:
        need_number("p", p, 0.0, 1.0)
    q = 0.5 if p is None else p
    n = max(1, math.ceil(z * z * q * (1 - q) / halfwidth ** 2) - 2 * math.ceil(z * z))

    def wider(k: int) -> float:
        low, high = wilson(k, n, z)
        return max(high - k / n, k / n - low)
    while max(wider(k) for k in (range(n + 1) if p is None else [round(p * n)])) > halfwidth:
        n += 1
    return n


@dataclass(frozen=True)
class PerplexityChange:
    """Perplexity of a setting against a reference on the same windows, with a paired bootstrap interval."""

    reference: float  # the reference's perplexity (BF16)
    perplexity: float  # the setting's
    change: Interval  # relative change perplexity / reference - 1, with its 95% interval over windows

    @property
    def within_noise(self) -> bool:
        return self.change.covers_zero


def _check_windows(name: str, nll, tokens) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(nll, dtype=np.float64)
    t = np.asarray(tokens, dtype=np.float64)
    if a.ndim != 1 or a.shape != t.shape or a.size == 0:
        raise ParameterError(f"{name}: per-window NLL and token counts must be two 1-D sequences of one length "
                             f"(one entry per window), got shapes {a.shape} and {t.shape}")
    if not np.all(np.isfinite(a)) or np.any(t <= 0):
        raise ParameterError(f"{name}: every window needs a finite NLL and at least one scored token")
    return a, t


def paired_bootstrap(nll_ref, nll, tokens, resamples: int = 2000, seed: int = 0) -> Interval:
    """The relative perplexity change of `nll` against `nll_ref` (summed NLL per window, nats; `tokens` scored per
    window, the same for both) with its paired bootstrap 95% interval: windows resampled with replacement."""
    a, t = _check_windows("reference", nll_ref, tokens)
    b, _ = _check_windows("setting", nll, tokens)
    need_int("resamples", resamples, 10)
    need_int("seed", seed, 0)
    point = math.exp((b.sum() - a.sum()) / t.sum()) - 1
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(resamples, a.size))  # [R, n] window indices
    diff = (b - a)[idx].sum(1) / t[idx].sum(1)  # [R] mean NLL difference per token
    ch = np.expm1(diff)
    low, high = np.percentile(ch, [2.5, 97.5])
    return Interval(point, float(min(low, point)), float(max(high, point)), int(a.size))


def bootstrap_perplexity(nll, tokens, resamples: int = 2000, seed: int = 0) -> Interval:
    """Perplexity exp(sum NLL / sum tokens) over windows with its bootstrap 95% interval (windows resampled)."""
    a, t = _check_windows("windows", nll, tokens)
    need_int("resamples", resamples, 10)
    need_int("seed", seed, 0)
    idx = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))  # [R, n]
    low, high = np.percentile(np.exp(a[idx].sum(1) / t[idx].sum(1)), [2.5, 97.5])
    point = math.exp(a.sum() / t.sum())
    return Interval(point, float(min(low, point)), float(max(high, point)), int(a.size))


def perplexity_change(nll_ref, nll, tokens, resamples: int = 2000, seed: int = 0) -> PerplexityChange:
    """Both perplexities and the change between them with its paired bootstrap 95% interval."""
    a, t = _check_windows("reference", nll_ref, tokens)
    b, _ = _check_windows("setting", nll, tokens)
    return PerplexityChange(math.exp(a.sum() / t.sum()), math.exp(b.sum() / t.sum()),
                            paired_bootstrap(a, b, t, resamples, seed))


def paired_accuracy_change(right_ref, right, answers, resamples: int = 2000, seed: int = 0) -> Interval:
    """The accuracy change (setting - reference) on the same task samples, with its paired bootstrap 95% interval:
    samples resampled with replacement, each carrying its answers right under both (`right_ref`, `right`) out of
    `answers` (one per niah sample; several per MQAR sample)."""
    a = np.asarray(right_ref, dtype=np.float64)
    b = np.asarray(right, dtype=np.float64)
    n = np.asarray(answers, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.shape != n.shape or a.size == 0:
        raise ParameterError("paired accuracy change: answers right (reference, setting) and answers per sample must "
                             f"be three 1-D sequences of one length, got shapes {a.shape}, {b.shape}, {n.shape}")
    if np.any(n <= 0) or np.any(a < 0) or np.any(b < 0) or np.any(a > n) or np.any(b > n):
        raise ParameterError("paired accuracy change: every sample needs 0 <= right <= answers and answers >= 1")
    need_int("resamples", resamples, 10)
    need_int("seed", seed, 0)
    point = (b.sum() - a.sum()) / n.sum()
    idx = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))  # [R, n] sample indices
    diff = (b - a)[idx].sum(1) / n[idx].sum(1)  # [R]
    low, high = np.percentile(diff, [2.5, 97.5])
    return Interval(float(point), float(min(low, point)), float(max(high, point)), int(a.size))


def median_interval(values, block: int = 1, resamples: int = 2000, seed: int = 0) -> Interval:
    """The median of `values` with its bootstrap 95% interval. block > 1: a moving-block bootstrap (Kunsch 1989):
    runs of `block` consecutive values are resampled together, so a series whose neighbours move together (timings
    taken one after another on a shared machine) is not read as more independent evidence than it holds."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ParameterError(f"median interval: values must be a non-empty 1-D sequence of finite numbers, got "
                             f"shape {x.shape}")
    need_int("block", block, 1, x.size)
    need_int("resamples", resamples, 10)
    need_int("seed", seed, 0)
    k = cdiv(x.size, block)  # blocks per resample
    starts = np.random.default_rng(seed).integers(0, x.size - block + 1, size=(resamples, k))  # [R, k]
    idx = (starts[..., None] + np.arange(block)).reshape(resamples, -1)[:, :x.size]  # [R, n]
    low, high = np.percentile(np.median(x[idx], axis=1), [2.5, 97.5])
    point = float(np.median(x))
    return Interval(point, float(min(low, point)), float(max(high, point)), int(x.size))
