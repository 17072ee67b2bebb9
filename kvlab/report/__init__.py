"""What the byte math tells a reader, as tables and verdicts: the notebooks' and the CLI's reports.

  compare  tables that compare models, formats and ways of counting (notebooks 01 and 02)
  claims   the source articles' numeric claims, each checked against what kvlab computes (notebook 02, `kvlab claims`)
"""
