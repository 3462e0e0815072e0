"""Data: task batches, synthetic generators (later: cubes, ERA5, satellite, elevation)."""

from geonp.data.batch import Batch

__all__ = ["Batch"]
