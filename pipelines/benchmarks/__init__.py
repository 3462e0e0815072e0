"""Benchmarks: rerunnable scripts, each writing a dated results table under ``pipelines/results/``
(command, device, budget, date and commit in its header)."""
