"""geonp: geospatial inpainting with neural processes.

Fill gaps in gridded climate and satellite fields with calibrated uncertainty,
using translation-equivariant transformer neural processes and baselines that
all share one calling convention (see :mod:`geonp.models`).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
