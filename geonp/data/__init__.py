"""Data: cubes (open, validate), ERA5, satellite products, elevation, normalisation and task sampling."""

import importlib.util

# The eccodes wheel (GRIB) and pyproj's bundled PROJ both ship their own copies of shared
# C libraries; when eccodes is loaded first the interpreter aborts with a double free at
# exit. Loading pyproj first (when installed) avoids it, whatever the caller imports next.
if importlib.util.find_spec("pyproj") is not None:
    import pyproj  # noqa: F401

from geonp.data.batch import Batch  # noqa: E402
from geonp.data.cube import open_cube  # noqa: E402
from geonp.data.elevation import attach_elevation  # noqa: E402
from geonp.data.normalise import Normaliser, fit_normaliser  # noqa: E402
from geonp.data.regions import REGIONS, Region, get_region  # noqa: E402
from geonp.data.satellite import open_satellite  # noqa: E402
from geonp.data.tasks import TaskSampler, sample_tasks  # noqa: E402

__all__ = [
    "Batch", "open_cube", "attach_elevation", "Normaliser", "fit_normaliser", "REGIONS", "Region", "get_region",
    "open_satellite", "TaskSampler", "sample_tasks",
]
