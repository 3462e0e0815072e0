"""Benchmark and experiment pipelines; each writes a results table under pipelines/results/."""
