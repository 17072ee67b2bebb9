"""A task run as a table: per setting the bytes it held, its accuracy and the paired change against the reference,
the settings no other beats on both bytes and accuracy, and the answer to "a quarter of the bytes without losing
quality" for every way of getting about a quarter.
"""
from __future__ import annotations

from .evaluate import Scores

# A setting "holds about a quarter" of the reference's bytes when its context bytes are within this range of 1/4
# (an assumed band: formats land on 0.25-0.29 with their scales, presses on 0.25 plus what they never evict).
QUARTER = (0.2, 0.3)


def rows(scores: dict[str, Scores], reference: str, context: int, text: dict | None = None, seed: int = 0
         ) -> list[dict]:
    """One row per setting: bytes (measured, and as a share of the reference's), accuracy with its Wilson interval
    and n, the paired accuracy change against `reference` and its interval; with `text` ({label: TextScores}) the
    perplexity change and its paired bootstrap interval."""
    ref = scores[reference]
    out = []
    for label, s in scores.items():
        ch = s.change(ref, seed=seed)
        row = dict(setting=label, context=context, bytes=s.context_bytes,
                   bytes_share=s.context_bytes / ref.context_bytes,
                   bytes_match=s.matches, accuracy=s.accuracy, accuracy_low=s.accuracy_ci[0],
                   accuracy_high=s.accuracy_ci[1], n=s.n, change=ch.value, change_low=ch.low, change_high=ch.high)
        if text is not None and label in text:
            tc = text[label].change(text[reference], seed=seed)
            row.update(ppl=text[label].perplexity, ppl_change=tc.value, ppl_change_low=tc.low,
                       ppl_change_high=tc.high)
        out.append(row)
    return out


def verdict(row: dict, resolution: float) -> str:
    """What the paired change's interval says: 'loses' (wholly below zero), 'no loss within +-resolution' (covers
    zero and reaches no further down than -resolution), else 'undecided (wider than +-resolution)'."""
    if row["change_high"] < 0:
        return "loses"
    if row["change_low"] >= -resolution:
        return f"no loss within {resolution:.2f}"
    return f"undecided (interval reaches {row['change_low']:+.2f})"


def frontier(table: list[dict]) -> list[dict]:
    """The rows no other row beats on both bytes (fewer) and accuracy (higher), fewest bytes first."""
    keep = [r for r in table if not any(o["bytes"] <= r["bytes"] and o["accuracy"] >= r["accuracy"]
                                        and (o["bytes"], o["accuracy"]) != (r["bytes"], r["accuracy"]) for o in table)]
    return sorted(keep, key=lambda r: r["bytes"])


def quarter_claim(table: list[dict], resolution: float, band: tuple[float, float] = QUARTER) -> list[dict]:
    """Every setting holding about a quarter of the reference's bytes (`band`), with the verdict on its accuracy."""
    lo, hi = band
    return [dict(setting=r["setting"], context=r["context"], bytes_share=r["bytes_share"], accuracy=r["accuracy"],
                 change=r["change"], change_low=r["change_low"], change_high=r["change_high"],
                 verdict=verdict(r, resolution))
            for r in table if lo <= r["bytes_share"] <= hi]
