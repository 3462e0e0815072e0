"""Where a grid lies on the Earth, and the map projections ``geonp plot`` draws on.

A grid is drawn in its own coordinate reference system when it has one: a projected product
(MODIS sinusoidal, a polar-stereographic satellite grid) then appears as it was gridded, cell edges
straight, rather than re-sampled. The CRS is read, in this order, from

* a CF ``grid_mapping`` variable named by the data variable (``pyproj.CRS.from_cf``), or its
  ``crs_wkt`` / ``spatial_ref`` attribute (as rioxarray writes it);
* a ``spatial_ref`` coordinate (rioxarray);
* a dataset ``crs`` attribute naming the MODIS sinusoidal grid (NASA's tiles carry their CRS in
  HDF-EOS metadata that NetCDF conversions keep only as text).

Grids on 1-D latitude/longitude are in PlateCarree; grids with only 2-D lat/lon are drawn from those.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

#: ``--projection`` names -> cartopy class names (``native``: the grid's own CRS).
PROJECTIONS = {"platecarree": "PlateCarree", "robinson": "Robinson", "mollweide": "Mollweide",
               "orthographic": "Orthographic", "lambertconformal": "LambertConformal", "mercator": "Mercator",
               "equalearth": "EqualEarth", "northpolarstereo": "NorthPolarStereo",
               "southpolarstereo": "SouthPolarStereo", "native": None}
#: MODIS land tiles: sinusoidal on a sphere of this radius (m).
MODIS_RADIUS = 6371007.181


@dataclass
class MapGrid:
    """How to draw a 2-D field ``[rows, cols]``: cell coordinates and the CRS they are in.

    ``x``/``y``: 1-D (per column / row) or 2-D coordinates; ``crs``: the cartopy CRS of ``x``/``y``,
    or None for a grid with no place on the Earth (plain axes); ``native``: the grid's projected
    CRS when it has one (``x``/``y`` are then in its units).
    """

    x: np.ndarray
    y: np.ndarray
    crs: Any | None
    native: Any | None = None

    @property
    def geographic(self) -> bool:
        return self.crs is not None


def native_crs(ds: xr.Dataset, variable: str) -> Any | None:
    """The cartopy CRS of ``variable``'s projected grid, or None (see the module docstring)."""
    import cartopy.crs as ccrs
    import pyproj

    da = ds[variable]
    name = da.attrs.get("grid_mapping") or da.encoding.get("grid_mapping")
    attrs = dict(ds[name].attrs) if name and name in ds.variables else None
    if attrs is None and "spatial_ref" in ds.coords:
        attrs = dict(ds["spatial_ref"].attrs)
    if attrs is not None:
        wkt = attrs.get("crs_wkt") or attrs.get("spatial_ref")
        try:
            crs = pyproj.CRS.from_wkt(wkt) if wkt else pyproj.CRS.from_cf(attrs)
        except pyproj.exceptions.CRSError as err:
            raise ValueError(f"{variable!r}: its grid mapping {name or 'spatial_ref'!r} is not a CRS pyproj "
                             f"understands ({err})") from None
        return None if crs.is_geographic else ccrs.Projection(crs)
    text = str(ds.attrs.get("crs", ""))
    if "sinusoidal" in text.lower():
        match = re.search(r"R\s*=\s*([0-9.]+)", text)
        radius = float(match.group(1)) if match else MODIS_RADIUS
        return ccrs.Sinusoidal(globe=ccrs.Globe(semimajor_axis=radius, semiminor_axis=radius, ellipse=None))
    return None


def map_grid(ds: xr.Dataset, variable: str, dims: tuple[str, str]) -> MapGrid:
    """The :class:`MapGrid` of ``variable`` on its horizontal ``dims`` ``(rows, cols)``."""
    import cartopy.crs as ccrs

    ydim, xdim = dims
    native = native_crs(ds, variable)
    if native is not None and xdim in ds.coords and ydim in ds.coords:
        x, y = ds[xdim].values, ds[ydim].values
        if native.bounds is None:  # a CRS built from CF/WKT has no natural extent: use the grid's, padded
            pad_x, pad_y = 0.05 * np.ptp(x) + 1.0, 0.05 * np.ptp(y) + 1.0
            native.bounds = (float(x.min() - pad_x), float(x.max() + pad_x),
                             float(y.min() - pad_y), float(y.max() + pad_y))
            # Lines are resampled to this precision when projected; cartopy's default (0.5 units, i.e.
            # half a metre) makes coastlines take a minute. A thousandth of the map is below a pixel.
            native.threshold = max(np.ptp(x), np.ptp(y)) / 1000
        return MapGrid(x, y, native, native)
    if "lat" in ds.coords and "lon" in ds.coords:
        lat, lon = ds.coords["lat"], ds.coords["lon"]
        if lat.dims == (ydim,) and lon.dims == (xdim,):
            return MapGrid(lon.values, lat.values, ccrs.PlateCarree())
        template = xr.DataArray(np.empty((ds.sizes[ydim], ds.sizes[xdim])), dims=dims)
        lon2 = lon.broadcast_like(template).transpose(*dims).values
        lat2 = lat.broadcast_like(template).transpose(*dims).values
        return MapGrid(lon2, lat2, ccrs.PlateCarree())
    x = ds[xdim].values if xdim in ds.coords else np.arange(ds.sizes[xdim])
    y = ds[ydim].values if ydim in ds.coords else np.arange(ds.sizes[ydim])
    return MapGrid(x, y, None)


def projection(name: str | None, grid: MapGrid, central_longitude: float = 0.0) -> Any | None:
    """The map projection called ``name`` (see :data:`PROJECTIONS`); None picks the grid's own
    CRS for a projected grid and PlateCarree otherwise. None for a grid with no place on the Earth."""
    import cartopy.crs as ccrs

    if grid.crs is None:
        if name not in (None, "native"):
            raise ValueError(f"--projection {name}: the grid has no lat/lon or grid mapping to project")
        return None
    key = (name or ("native" if grid.native is not None else "platecarree")).lower()
    if key not in PROJECTIONS:
        raise ValueError(f"unknown --projection {name!r}; choose from {', '.join(PROJECTIONS)}")
    if key == "native":
        return grid.native if grid.native is not None else ccrs.PlateCarree()
    return getattr(ccrs, PROJECTIONS[key])(central_longitude=central_longitude)


def lonlat(grid: MapGrid) -> tuple[np.ndarray, np.ndarray]:
    """Longitudes and latitudes (degrees, 2-D ``[rows, cols]``) of the grid's cells."""
    import cartopy.crs as ccrs

    x, y = (np.meshgrid(grid.x, grid.y) if np.ndim(grid.x) == 1 else (grid.x, grid.y))
    if grid.native is None:
        return np.asarray(x, float), np.asarray(y, float)
    pts = ccrs.PlateCarree().transform_points(grid.native, np.asarray(x, float), np.asarray(y, float))
    return pts[..., 0], pts[..., 1]
