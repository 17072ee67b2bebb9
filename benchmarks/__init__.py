"""kvlab benchmarks: ratios against a peer run side by side in one process (`make bench`)."""
