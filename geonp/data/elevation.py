"""Surface elevation as an input channel on a cube's grid, from ERA5 orography or any DEM.

``attach_elevation`` adds ``elevation`` (m above sea level) as a coordinate on the cube's
horizontal dims, ``(lat, lon)`` or a projected grid's ``(y, x)``. A coordinate, not a data
variable, so that ``field_variables`` does not take it for a field to fill; windows read it as
the fourth input (km) of models trained with elevation.

Regridding, per axis: where the DEM is as coarse as the cube or coarser, it is interpolated
(linear along each axis, i.e. bilinear); where it is finer, the DEM cells whose centres fall in a
cube cell are averaged (an area mean on the DEM's own grid). DEM cells that are NaN (the sea of a
land-only DEM) are left out of both weighted means; a cube cell is NaN only when no DEM cell with
weight on it is finite. On projected grids (2-D lat/lon) the DEM is interpolated bilinearly at
each pixel's lat/lon, after averaging to half the pixel spacing when it is finer. Only the DEM's
window over the cube's bounding box is loaded; a DEM that spans 360 degrees wraps in longitude.
"""

from __future__ import annotations

import os

import dask
import dask.array as dsa
import numpy as np
import scipy.sparse as sp
import xarray as xr

from geonp.data.cube import horizontal_dims, open_cube

G0 = 9.80665  # standard gravity, m s-2: ERA5 geopotential / G0 = geopotential height
_GEOPOTENTIAL_UNITS = {"m**2 s**-2", "m2 s-2", "m^2 s^-2", "m2/s2", "m^2/s^2", "m**2/s**2"}
_METRE_UNITS = {"", "m", "meter", "meters", "metre", "metres", "m asl", "m above sea level", "meters above sea level"}
_DEM_NAMES = ("elevation", "orography", "altitude", "height", "topo", "topography", "dem", "hgt", "z", "Band1")


def attach_elevation(
    ds: xr.Dataset,
    dem: str | os.PathLike | xr.Dataset | xr.DataArray,
    *,
    name: str = "elevation",
    variable: str | None = None,
    floor: float | None = None,
) -> xr.Dataset:
    """Return ``ds`` with the DEM's elevation on its horizontal grid as the coordinate ``name``.

    Args:
        ds: a cube in ``open_cube``'s convention: a regular grid (1-D ``lat``, ``lon``) or a
            projected one (dims ``y``/``x`` with 2-D ``lat``/``lon``).
        dem: a DEM file (opened with ``open_cube``), or a Dataset/DataArray in that convention,
            on a regular lat/lon grid. Geopotential (CF standard_name ``geopotential`` or units
            ``m**2 s**-2``, as ERA5's ``z``) is divided by g = 9.80665 m s-2; a time (or other)
            dim of length 1 is dropped.
        name: the coordinate's name.
        variable: the DEM variable; default: the geopotential, else one named like
            elevation/orography/height/z, else the only one.
        floor: clip DEM values below this many metres before regridding, e.g. 0.0 to turn a
            relief DEM's sea floor (ETOPO) into sea-level altitude. Default: keep them.

    Returns:
        A shallow copy of ``ds`` with ``name`` (float32, m) on ``(lat, lon)`` or ``(y, x)``:
        in memory on regular grids, lazy (dask, chunked like ``lat``) on projected ones.

    Raises:
        ValueError: naming the DEM: it does not cover the cube (the uncovered extent is given),
            it is not on a regular lat/lon grid, its units are not metres or geopotential, it has
            a time dim longer than 1, or the variable cannot be chosen.
    """
    height, source = _dem_metres(dem, variable)
    if floor is not None:
        height = height.where(~(height < floor), floor)  # NaN stays NaN
    hdims = horizontal_dims(ds)
    regular = hdims == ("lat", "lon")
    if regular:
        lat_t, lon_t = ds["lat"].values.astype(float), ds["lon"].values.astype(float)
        bounds = (lat_t.min(), lat_t.max(), lon_t.min(), lon_t.max())
        steps = (_step(lat_t), _step(lon_t))
    else:
        lat_t, lon_t = ds["lat"].data, ds["lon"].data
        bounds = tuple(float(b) for b in dask.compute(lat_t.min(), lat_t.max(), lon_t.min(), lon_t.max()))
        steps = _projected_steps(ds)
    window, lat_s, lon_s = _window(height, bounds, steps, source)
    finer = [float(np.median(np.diff(s))) < (1 - 1e-6) * t if s.size > 1 and np.isfinite(t) else False
             for s, t in zip((lat_s, lon_s), steps)]
    how = "; ".join(f"{a}: {'area mean' if f else 'linear'}" for a, f in zip(("lat", "lon"), finer))

    if regular:
        values = _regrid(window, [_weights(s, t, f) for s, t, f in zip((lat_s, lon_s), (lat_t, lon_t), finer)])
        data = values.astype(np.float32)
    else:
        # A projected pixel's footprint is not a lat/lon box: average a finer DEM onto an
        # intermediate lat/lon grid at half the pixel spacing, then interpolate bilinearly at
        # every pixel's lat/lon, chunk by chunk. The result is close to a pixel-area mean
        # (smoothed over about one pixel more), without aliasing the DEM's fine detail.
        mids = []
        for s, t, f in zip((lat_s, lon_s), steps, finer):
            mids.append(np.arange(s[0] + t / 4, s[-1], t / 2) if f and s[-1] - s[0] > t else s)
        coarse = _regrid(window, [_weights(s, m, f) for s, m, f in zip((lat_s, lon_s), mids, finer)])
        lat_t, lon_t = (a if isinstance(a, dsa.Array) else dsa.from_array(np.asarray(a)) for a in (lat_t, lon_t))
        lon_t = lon_t.rechunk(lat_t.chunks)
        data = dsa.map_blocks(_bilinear_points, lat_t, lon_t, grid=(mids[0], mids[1], coarse), dtype=np.float32)
    attrs = {"units": "m", "standard_name": "surface_altitude", "long_name": "surface altitude above sea level",
             "source": source, "geonp_regrid": how}
    if floor is not None:
        attrs["geonp_floor_m"] = float(floor)
    return ds.assign_coords({name: (hdims, data, attrs)})


def _dem_metres(dem: str | os.PathLike | xr.Dataset | xr.DataArray, variable: str | None) -> tuple[xr.DataArray, str]:
    """The DEM variable in metres on (lat, lon), and a name for it in messages."""
    if isinstance(dem, str | os.PathLike):
        source = str(dem)
        dem = open_cube(dem, variable)
    else:
        source = str(dem.attrs.get("geonp_source", "the DEM given"))
        if isinstance(dem, xr.DataArray) and "geonp_source" not in dem.attrs:
            source = f"the DEM DataArray {dem.name!r}"
    if isinstance(dem, xr.Dataset):
        dem = dem[_pick_variable(dem, variable, source)]
    units = str(dem.attrs.get("units", "")).strip().lower()
    if dem.attrs.get("standard_name") == "geopotential" or units in _GEOPOTENTIAL_UNITS:
        dem = dem / G0
    elif units == "km":
        dem = dem * 1000.0
    elif units not in _METRE_UNITS:
        raise ValueError(f"{source}: units {units!r} of {dem.name!r} are neither metres nor geopotential (m**2 s**-2)")
    if "lat" not in dem.dims or "lon" not in dem.dims:
        raise ValueError(f"{source}: the DEM must be on a regular lat/lon grid (1-D lat and lon dims), got dims "
                         f"{dem.dims}; reproject it to lat/lon first")
    for d in [d for d in dem.dims if d not in ("lat", "lon")]:
        if dem.sizes[d] != 1:
            raise ValueError(f"{source}: the DEM has {dem.sizes[d]} steps along {d!r}; elevation must be static")
        dem = dem.isel({d: 0}, drop=True)
    for axis in ("lat", "lon"):  # a DataArray not from open_cube may run north to south
        if dem.sizes[axis] > 1 and dem[axis].values[0] > dem[axis].values[-1]:
            dem = dem.isel({axis: slice(None, None, -1)})
    return dem.transpose("lat", "lon"), source


def _pick_variable(dem: xr.Dataset, variable: str | None, source: str) -> str:
    names = [str(v) for v in dem.data_vars if {"lat", "lon"} <= set(dem[v].dims)]
    if variable is not None:
        if variable not in dem.data_vars:
            raise ValueError(f"{source}: no variable {variable!r}; it has {', '.join(names) or 'none'}")
        return variable
    geo = [v for v in names if dem[v].attrs.get("standard_name") == "geopotential"
           or str(dem[v].attrs.get("units", "")).strip().lower() in _GEOPOTENTIAL_UNITS]
    known = [v for n in _DEM_NAMES for v in names if v.lower() == n.lower()]
    for candidates in (geo, known, names if len(names) == 1 else []):
        if candidates:
            return candidates[0]
    raise ValueError(f"{source}: cannot tell which variable is the elevation ({', '.join(names) or 'none'}); "
                     "pass variable=")


def _step(values: np.ndarray) -> float:
    """Typical spacing of sorted coordinates (NaN for a single value)."""
    return float(np.median(np.diff(values))) if values.size > 1 else float("nan")


def _projected_steps(ds: xr.Dataset) -> tuple[float, float]:
    """Approximate pixel spacing in degrees of lat and lon, from the middle row and column."""
    ydim, xdim = horizontal_dims(ds)
    mid = {ydim: ds.sizes[ydim] // 2, xdim: ds.sizes[xdim] // 2}
    row, col = ds.isel({ydim: mid[ydim]}), ds.isel({xdim: mid[xdim]})
    lat_r, lon_r, lat_c, lon_c = dask.compute(row["lat"].data, row["lon"].data, col["lat"].data, col["lon"].data)

    def median_step(a: np.ndarray) -> float:
        d = np.abs(np.diff(np.asarray(a, dtype=float)))
        d = d[np.isfinite(d) & (d < 180)]  # skip a jump across the antimeridian
        return float(np.median(d)) if d.size else float("nan")

    return (max(median_step(lat_r), median_step(lat_c)), max(median_step(lon_r), median_step(lon_c)))


def _window(height: xr.DataArray, bounds: tuple, steps: tuple[float, float], source: str):
    """The DEM over the cube's bounding box plus a margin, in memory: ``(values, lat, lon)``.

    A DEM that spans 360 degrees of longitude is wrapped, so any cube longitude is covered.
    """
    lat_d, lon_d = height["lat"].values.astype(float), height["lon"].values.astype(float)
    dlat, dlon = _step(lat_d), _step(lon_d)
    dlat, dlon = (dlat if np.isfinite(dlat) else 0.0), (dlon if np.isfinite(dlon) else 0.0)
    lat0, lat1, lon0, lon1 = bounds
    periodic = lon_d.size > 1 and abs(lon_d.size * dlon - 360.0) < 0.5 * dlon
    cover = (lat_d[0] - dlat / 2, lat_d[-1] + dlat / 2,
             -np.inf if periodic else lon_d[0] - dlon / 2, np.inf if periodic else lon_d[-1] + dlon / 2)
    tol = 1e-6 * max(dlat, dlon, 1e-9)
    missing = [f"lat {lat0:g}..{cover[0]:g}" if lat0 < cover[0] - tol else "",
               f"lat {cover[1]:g}..{lat1:g}" if lat1 > cover[1] + tol else "",
               f"lon {lon0:g}..{cover[2]:g}" if lon0 < cover[2] - tol else "",
               f"lon {cover[3]:g}..{lon1:g}" if lon1 > cover[3] + tol else ""]
    if any(missing):
        raise ValueError(f"the DEM {source} does not cover the cube: it spans lat {cover[0]:g}..{cover[1]:g}, lon "
                         f"{lon_d[0] - dlon / 2:g}..{lon_d[-1] + dlon / 2:g}; the cube spans lat {lat0:g}..{lat1:g}, "
                         f"lon {lon0:g}..{lon1:g}; uncovered: {', '.join(m for m in missing if m)}")
    # The margin keeps whole blocks and both interpolation neighbours at the cube's edges.
    mlat = 2 * max(dlat, steps[0] if np.isfinite(steps[0]) else 0.0)
    mlon = 2 * max(dlon, steps[1] if np.isfinite(steps[1]) else 0.0)
    rows = np.flatnonzero((lat_d >= lat0 - mlat) & (lat_d <= lat1 + mlat))
    if periodic:
        ext = np.concatenate([lon_d - 360.0, lon_d, lon_d + 360.0])
        idx = np.tile(np.arange(lon_d.size), 3)
        keep = (ext >= lon0 - mlon) & (ext <= lon1 + mlon)
        cols, lon_s = idx[keep], ext[keep]
    else:
        cols = np.flatnonzero((lon_d >= lon0 - mlon) & (lon_d <= lon1 + mlon))
        lon_s = lon_d[cols]
    values = np.asarray(height.isel(lat=rows, lon=cols).values, dtype=float)
    return values, lat_d[rows], lon_s


def _weights(source: np.ndarray, target: np.ndarray, mean: bool) -> sp.csr_matrix:
    """Sparse ``[len(target), len(source)]`` weights along one axis: area mean or linear interpolation."""
    n, m = target.size, source.size
    if m == 1:
        return sp.csr_matrix((np.ones(n), (np.arange(n), np.zeros(n, dtype=int))), shape=(n, 1))
    if mean and np.any(np.diff(target) < 0):
        order = np.argsort(target)
        return _weights(source, target[order], mean)[np.argsort(order)]
    if mean:
        # Each source point goes to the target cell whose edges (midpoints between centres) hold it.
        mids = (target[1:] + target[:-1]) / 2
        first = target[0] - (mids[0] - target[0] if n > 1 else 0.0)
        last = target[-1] + (target[-1] - mids[-1] if n > 1 else 0.0)
        edges = np.concatenate([[first], mids, [last]])
        cell = np.searchsorted(edges, source, side="right") - 1
        inside = (cell >= 0) & (cell < n)
        return sp.csr_matrix((np.ones(inside.sum()), (cell[inside], np.flatnonzero(inside))), shape=(n, m))
    i0, w1 = _linear_index(source, target)
    rows = np.concatenate([np.arange(n), np.arange(n)])
    return sp.csr_matrix((np.concatenate([1 - w1, w1]), (rows, np.concatenate([i0, i0 + 1]))), shape=(n, m))


def _linear_index(source: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Left neighbour index and right weight for linear interpolation; targets beyond the
    outermost centres (still inside the outer cells) take the edge value."""
    if source.size == 1:
        return np.zeros(target.shape, dtype=int), np.zeros(target.shape)
    t = np.clip(target, source[0], source[-1])
    i0 = np.clip(np.searchsorted(source, t, side="right") - 1, 0, source.size - 2)
    return i0, (t - source[i0]) / (source[i0 + 1] - source[i0])


def _regrid(values: np.ndarray, weights: list[sp.csr_matrix]) -> np.ndarray:
    """``W_lat @ values @ W_lon.T``, NaN-aware: the weighted mean of the finite values."""
    w_lat, w_lon = weights
    finite = np.isfinite(values)
    total = (w_lat @ (w_lon @ np.where(finite, values, 0.0).T).T)
    weight = (w_lat @ (w_lon @ finite.astype(float).T).T)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(weight > 0, total / np.where(weight > 0, weight, 1.0), np.nan)


def _bilinear_points(lat: np.ndarray, lon: np.ndarray, grid: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Bilinear interpolation of ``grid = (lat, lon, values)`` at the points ``lat``, ``lon`` (same shape)."""
    glat, glon, values = grid
    lat, lon = np.asarray(lat, dtype=float), np.asarray(lon, dtype=float)
    i0, wy = _linear_index(glat, lat.ravel())
    j0, wx = _linear_index(glon, lon.ravel())
    i1, j1 = np.minimum(i0 + 1, glat.size - 1), np.minimum(j0 + 1, glon.size - 1)
    total = np.zeros(i0.shape)
    weight = np.zeros(i0.shape)
    corners = ((i0, j0, (1 - wy) * (1 - wx)), (i0, j1, (1 - wy) * wx), (i1, j0, wy * (1 - wx)), (i1, j1, wy * wx))
    for ii, jj, w in corners:
        v = values[ii, jj]
        ok = np.isfinite(v)
        total += np.where(ok, v, 0.0) * w
        weight += ok * w
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(weight > 0, total / np.where(weight > 0, weight, 1.0), np.nan)
    out[~(np.isfinite(lat.ravel()) & np.isfinite(lon.ravel()))] = np.nan
    return out.reshape(lat.shape).astype(np.float32)
