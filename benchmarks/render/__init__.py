"""BENCHMARKS.md's sections and pictures, each rendered from results JSON under ``benchmarks/results/``
(``benchmarks/render_docs.py`` puts them together)."""
