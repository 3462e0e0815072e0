"""Data, input and output only: cubes (open, validate, CF, calendars), ERA5 (cdsapi), satellite
products, elevation, the one valid-area rule and named regions. What becomes of a cube as
context/target tasks lives one floor up, in :mod:`geonp.tasks`."""

import importlib.util

# The eccodes wheel (GRIB) and pyproj's bundled PROJ both ship their own copies of shared
# C libraries; when eccodes is loaded first the interpreter aborts with a double free at
# exit. Loading pyproj first (when installed) avoids it, whatever the caller imports next.
if importlib.util.find_spec("pyproj") is not None:
    import pyproj  # noqa: F401

from geonp.data.cube import open_cube  # noqa: E402
from geonp.data.elevation import attach_elevation  # noqa: E402
from geonp.data.readers import data_folder  # noqa: E402
from geonp.data.regions import REGIONS, Region, get_region  # noqa: E402
from geonp.data.satellite import open_satellite  # noqa: E402

__all__ = [
    "open_cube", "attach_elevation", "data_folder", "REGIONS", "Region", "get_region", "open_satellite",
]
