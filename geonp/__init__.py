"""geonp: geospatial inpainting with neural processes.

Fill gaps in gridded climate and satellite fields with calibrated uncertainty,
using translation-equivariant transformer neural processes and baselines that
all share one calling convention (see :mod:`geonp.models`).
"""

from geonp.threads import quiet_openmp
from geonp.version import __version__

quiet_openmp()  # before torch loads its OpenMP runtime: idle threads sleep instead of spinning (geonp.threads)

__all__ = ["__version__", "infill"]

# ``ds.geonp.infill/evaluate/plot`` on every xarray Dataset (imports xarray, not torch).
from geonp import accessor as _accessor  # noqa: E402,F401


def __getattr__(name: str):
    # Lazy: ``import geonp`` (and ``geonp --version``) stays light; torch and xarray load on first use.
    if name == "infill":
        from geonp.fill.engine import infill

        return infill
    raise AttributeError(f"module 'geonp' has no attribute {name!r}")
