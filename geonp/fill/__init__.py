"""Gap filling of gridded cubes: windows, model choice, block filling, the CF Zarr output.

``geonp.infill(ds, model=...)`` (in memory) and ``geonp infill INPUT -o OUT.zarr`` (resumable
store) are the entry points; see :mod:`geonp.fill.engine`.
"""
