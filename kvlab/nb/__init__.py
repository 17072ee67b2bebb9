"""Notebook machinery: parameters, recorded results, batch runs, clean outputs, and how nbval compares them.

Conventions for a notebook (tests/test_notebook_conventions.py checks the first three):
1. Cell 1, tagged `parameters`: one typed, commented default per line (`hbm_gb: float = 0.05  # KV budget, GB`).
2. Cell 2: `from kvlab.nb.<topic> import XParams` and one line `params = XParams.of(globals())`. XParams, a
   `kvlab.nb.params.NotebookParams` dataclass, lives in kvlab/nb/ with the notebook's own glue, never in an
   algorithm module (which never imports kvlab.nb): 01/02 compare, 03 quantizers, 04 attention, 05 memory,
   06 sessions, 07 tiering, 08 quality, 09 serving. Its fields are the parameters
   (same names and order, a comment each, no defaults: the parameters cell holds them); `__post_init__` checks
   each with the NotebookParams helpers (kvlab.checks underneath), so a bad value stops the notebook here with
   one ParameterError naming the parameter. Derived values (resolved formats, a device) are init=False fields.
   A new parameter: a line in cell 1 and a field plus its check in the dataclass.
3. Key numbers go through `kvlab.nb.record.record(name, value)`. Exact figures stay exact types: ints, and
   `Fraction`s from kvlab's byte math (not `float(...)` of them). A float is a measured value: kept to 4
   significant digits and compared within rtol 0.5%; pass `rtol=` / `atol=` / `digits=` where the data
   supports less (a chaotic decode's KL: rtol=0.02; float32 noise-floor errors: digits=1, atol=1e-5).
   A dict or list that a table beside it already shows: `record(..., brief=True)`, so the reader sees one
   line ('name: 30 values recorded'), not a raw Python dict.
4. Tables: round floats to what the data supports (`df.round(3)`), keep byte and count columns integer.
   A notebook whose shown floats come out of torch / BLAS reductions declares its tolerance in the notebook
   metadata, {"kvlab": {"float_rtol": 0.005}} (plus "float_atol" for values at float32's noise floor);
   every other notebook is compared exactly. Never `NBVAL_IGNORE_OUTPUT` a cell for float noise; it is
   for truly volatile output (free memory, library warnings).
5. Commit outputs of a clean run (`make notebooks`), then check them with `make test-matrix` (nbval under
   other kernel sets and thread counts). A papermill test (tests/test_nb_NN.py) runs small parameters and
   asserts recorded floats with explicit tolerances (`pytest.approx(..., rel=...)`), exact figures with ==,
   and a bad parameter's message.
Modules: params (the dataclass base), one per notebook topic (above), record (named results), tolerance (how outputs compare), nbval_plugin
(wires tolerance into nbval; skips trace-only cells marked "# needs: Mooncake traces"), runner (batch runs),
sweep (parameter grids on dask), figures (README figures), plots (the figures' drawing, checked by tests/test_plots.py),
nbclean (strip volatile metadata).
"""
