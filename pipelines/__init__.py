"""Benchmark and experiment pipelines; each writes a results table under pipelines/results/."""

# Before any pipeline imports torch: the same OpenMP waiting as the command line's, so benchmarks
# time what users get (geonp.threads).
from geonp.threads import quiet_openmp

quiet_openmp()
