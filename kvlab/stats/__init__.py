"""Uncertainty of quality figures: Wilson intervals for accuracies, bootstrap intervals for perplexities and their
paired changes, and for medians of timings."""
from .intervals import (Z95, Interval, PerplexityChange, accuracy_interval, bootstrap_perplexity, median_interval,
                        paired_accuracy_change, paired_bootstrap, perplexity_change, samples_for_halfwidth, wilson)

__all__ = ["Z95", "Interval", "PerplexityChange", "accuracy_interval", "bootstrap_perplexity", "median_interval",
           "paired_accuracy_change", "paired_bootstrap", "perplexity_change", "samples_for_halfwidth", "wilson"]
