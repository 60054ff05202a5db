"""The sections of bench/report.py: one module per thing measured, each with
its part of summary.md and its figures (results.py reads the results,
summary.py holds the document and its targets, figures.py what the figures
share)."""
