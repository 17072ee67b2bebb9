"""Notebook 04's parameters (compressed attention). Checked on construction, so a bad value stops the notebook in its
second cell.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..attention.evaluate import MECHANISMS, EvalSetup
from ..errors import ParameterError
from ..formats import get_format
from .params import NotebookParams


@dataclass
class AttentionParams(NotebookParams):
    """Notebook 04's parameters, checked on construction; `setup` and `seed_list` are derived from them."""

    context_lengths: list  # needle sweep: context lengths (tokens)
    eval_tokens: int  # accuracy table: context length of the synthetic decode step
    formats: list  # kvlab formats for the stored cache
    mechanisms: list  # mechanisms to compare (MECHANISMS)
    needle_formats: list  # formats for the needle heat maps
    needle_depths: list  # needle positions, fraction of the context
    top_k: int  # positions (entries) the indexer keeps per query
    candidate_blocks: int  # capped pool: blocks kept
    candidate_block_size: int  # capped pool: positions per block
    window: int  # sliding window
    csa_ratio: int  # CSA compression ratio (overlapping windows)
    hca_ratio: int  # HCA compression ratio (non-overlapping)
    seeds: int  # synthetic problems averaged per cell
    flops_lengths: list  # decode FLOPs / bytes: context lengths
    stack_layers: int  # scaled model stack: layers sampled from the real config
    stack_prompt: int  # scaled model stack: prompt tokens
    stack_steps: int  # scaled model stack: decode steps compared
    threads: int  # torch CPU threads
    seed: int  # base seed for weights and synthetic data
    setup: EvalSetup = field(init=False)  # the mechanisms' sizes
    seed_list: list = field(init=False)  # seeds of the synthetic problems

    def __post_init__(self):
        lengths = self.need_ints("context_lengths")
        self.need_int("eval_tokens")
        for name in ("formats", "needle_formats"):
            for f in self.need_names(name):
                self.need_lookup(name, get_format, f)
        self.need_names("mechanisms", MECHANISMS)
        self.need_numbers("needle_depths", 0, 1)
        for name in ("top_k", "candidate_blocks", "candidate_block_size", "window", "csa_ratio", "hca_ratio", "seeds",
                     "stack_layers", "stack_prompt", "stack_steps", "threads"):
            self.need_int(name)
        self.need_int("seed", 0)
        self.need_ints("flops_lengths")
        shortest = min(self.eval_tokens, *lengths)
        if self.top_k > shortest:
            raise ParameterError(f"parameter top_k = {self.top_k} is larger than the shortest context ({shortest})")
        if self.top_k > self.candidate_blocks * self.candidate_block_size:
            raise ParameterError(f"parameter top_k = {self.top_k} is larger than the candidate pool "
                                 f"({self.candidate_blocks} x {self.candidate_block_size})")
        self.setup = EvalSetup(window=self.window, topk=self.top_k, candidate_blocks=self.candidate_blocks,
                               candidate_block_size=self.candidate_block_size, csa_ratio=self.csa_ratio,
                               hca_ratio=self.hca_ratio)
        self.seed_list = [self.seed + i for i in range(self.seeds)]
