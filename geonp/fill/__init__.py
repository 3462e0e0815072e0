"""Gap filling of gridded cubes: windows, model choice, block filling, the CF Zarr output.

``geonp.infill(ds, model=...)`` (in memory) and ``geonp infill INPUT -o OUT.zarr`` (resumable
store) are the entry points (:mod:`geonp.fill.engine`). A run is planned and checked first
(:mod:`~geonp.fill.plan`), its model fine-tuned and calibrated on the cube (:mod:`~geonp.fill.prepare`),
then its blocks filled (:mod:`~geonp.fill.blocks`), one after another or on dask
(:mod:`~geonp.fill.runners`), into the CF output (:mod:`~geonp.fill.output`). How a fill is made
travels as data, :class:`~geonp.fill.options.FillOptions`, never as module settings.
"""

from geonp.fill.options import NUGGET_CHOICES, FillOptions, FitOptions

__all__ = ["NUGGET_CHOICES", "FillOptions", "FitOptions"]
