"""What the byte math tells a reader, as verdicts: the CLI's and notebook 02's claims audit
(the comparison tables of notebooks 01 and 02 live with the notebooks' code, kvlab.nb.compare).

  claims   the source articles' numeric claims, each checked against what kvlab computes (notebook 02, `kvlab claims`)
"""
