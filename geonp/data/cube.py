"""Open any gridded cube lazily and bring it to one convention.

``open_cube`` reads NetCDF/HDF5, GRIB (cfgrib), Zarr v2/v3 and GeoTIFF (rioxarray), from
local paths or fsspec URLs (:mod:`geonp.data.readers`), and returns a dask-backed ``xarray.Dataset`` in which:

- the horizontal coordinates are called ``lat`` and ``lon`` (degrees north/east),
  ``lon`` lies in [-180, 180) (a regional grid across the antimeridian keeps contiguous
  longitudes such as 170..190 instead); on a regular grid both are 1-D dimensions with ``lat``
  ascending and ``lon`` ascending; on a projected grid (MODIS sinusoidal, say) the
  dimensions stay ``y``/``x`` and ``lat``/``lon`` are 2-D coordinates on them;
- time is ``time`` (``valid_time`` is taken when that is the one that varies), vertical
  levels are ``level``, ensemble members ``member``; ERA5's ``expver`` is merged away;
- scale factors and offsets are applied, and fill values, ``valid_min``/``valid_max``/
  ``valid_range`` and a product's own ``valid_pixel_expression`` become NaN.

Nothing is loaded eagerly apart from coordinates and, to reject an all-NaN variable,
chunks of each variable until one holds a finite value (usually the first).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import xarray as xr

from geonp.data.calendar import check_time
from geonp.data.cube_checks import check_coordinates, check_not_empty, is_flag, not_numbers, numeric
from geonp.data.flags import valid_pixels
from geonp.data.readers import open_raw

# Attribute and name clues for each canonical coordinate, strongest first.
_STANDARD_NAMES = {
    "lat": {"latitude", "grid_latitude"},
    "lon": {"longitude", "grid_longitude"},
    "time": {"time"},
    "level": {"air_pressure", "depth", "height", "altitude", "model_level_number",
              "atmosphere_hybrid_sigma_pressure_coordinate"},
}
_UNITS = {"lat": {"degrees_north", "degree_north", "degree_n", "degrees_n"},
          "lon": {"degrees_east", "degree_east", "degree_e", "degrees_e"}}
_AXES = {"lat": "Y", "lon": "X", "time": "T", "level": "Z"}
_COMMON_NAMES = {
    "lat": ("latitude", "lat", "nav_lat", "lats", "y_lat", "LAT", "Latitude"),
    "lon": ("longitude", "lon", "nav_lon", "lons", "x_lon", "LON", "Longitude"),
    "time": ("time", "valid_time", "t", "Time", "date"),
    "level": ("level", "pressure_level", "isobaricInhPa", "plev", "lev", "depth", "height", "hybrid"),
}
# ERA5/cfgrib bookkeeping that says nothing about the field itself.
_DROP = ("step", "surface", "heightAboveGround", "entireAtmosphere", "meanSea", "spatial_ref", "crs")
#: Global attribute of a cube: JSON ``{convention name: the input's name}`` of what was renamed.
RENAMED = "geonp_renamed"


def open_cube(path: str | os.PathLike, variables: str | Sequence[str] | None = None) -> xr.Dataset:
    """Open a gridded file or store lazily, in geonp's coordinate convention.

    Args:
        path: a local path or an fsspec URL (``s3://``, ``https://``, ``memory://`` ...) of a
            NetCDF/HDF5 file, a GRIB file, a Zarr store (v2 or v3) or a GeoTIFF.
        variables: the data variables to keep (a name or names); default: every numeric
            variable on the horizontal grid that is not a flag, QC or bounds variable.

    Returns:
        A dask-backed Dataset with coordinates ``lat``/``lon`` (and ``time``, ``level`` when
        present), gaps as NaN, and ``attrs["geonp_source"]`` naming ``path``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: naming the file and the problem: an unreadable format, no latitude or
            longitude, non-monotonic coordinates, duplicate times, an unknown variable or a
            variable that holds no finite value.
    """
    name = str(path)
    return to_convention(open_raw(name), variables, source=name)


def to_convention(ds: xr.Dataset, variables: str | Sequence[str] | None = None, *,
                  source: str = "the dataset") -> xr.Dataset:
    """``ds`` (already open, e.g. in a notebook) in geonp's coordinate convention, as
    :func:`open_cube` gives a file; ``source`` names it in errors and in ``attrs["geonp_source"]``."""
    wanted = [variables] if isinstance(variables, str) else list(variables) if variables is not None else None
    try:
        out, renamed = _to_convention(ds, source)
        out = _select(out, wanted)
        check_not_empty(out)
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    out = out.copy(deep=False)  # new attrs: the caller's dataset is never modified
    # What was renamed ({convention name: the input's}), so an output can be given back in the
    # input's own names (geonp.fill.layout).
    out.attrs = {**out.attrs, "geonp_source": source, RENAMED: json.dumps(renamed, sort_keys=True)}
    return out


def renamed_from(ds: xr.Dataset) -> dict[str, str]:
    """``{convention name: the input's name}`` of a cube from :func:`to_convention` (empty if none)."""
    return json.loads(ds.attrs.get(RENAMED, "{}"))


def coordinate_names(ds: xr.Dataset) -> dict[str, str]:
    """``{role: name}`` of the latitude, longitude and time coordinates ``ds`` has under other
    names (e.g. ``{"lat": "latitude", "time": "valid_time"}``), found as :func:`open_cube` finds them."""
    found = {role: _find(ds, role) for role in ("lat", "lon", "time")}
    return {role: name for role, name in found.items()
            if name is not None and name != role and role not in ds.variables}


def _find(ds: xr.Dataset, role: str) -> str | None:
    """The name of the variable playing ``role`` (lat, lon, time, level), or None."""
    candidates = list(ds.coords) + [d for d in ds.dims if d not in ds.coords] + list(ds.data_vars)
    for test in (
        lambda v: ds[v].attrs.get("standard_name") in _STANDARD_NAMES[role],
        lambda v: str(ds[v].attrs.get("units", "")).lower() in _UNITS.get(role, ()),
        lambda v: ds[v].attrs.get("axis") == _AXES[role] and role != "level",
    ):
        hits = [v for v in candidates if v in ds.variables and test(v) and not str(v).endswith(("_bnds", "_bounds"))]
        if hits:
            # Prefer a dimension coordinate over an auxiliary one (time vs valid_time).
            hits.sort(key=lambda v: (v not in ds.dims, ds[v].ndim == 0))
            return hits[0]
    for common in _COMMON_NAMES[role]:
        if common in ds.variables or common in ds.dims:
            return common
    return None


def _to_convention(ds: xr.Dataset, name: str) -> tuple[xr.Dataset, dict[str, str]]:
    """Rename, reorder and mask ``ds`` into geonp's convention (see the module docstring).

    Returns the cube and ``{convention name: input name}`` of every renamed dimension or coordinate.
    """
    renamed = dict(json.loads(ds.attrs.get(RENAMED, "{}")))  # a cube given again keeps its record
    ds = _merge_expver(ds)
    ds = ds.drop_vars([v for v in (*_DROP, "number") if v in ds.variables and ds[v].ndim == 0], errors="ignore")
    if "number" in ds.dims:
        if ds.sizes["number"] == 1:
            ds = ds.isel(number=0, drop=True)
        else:
            ds, renamed["member"] = ds.rename(number="member"), "number"
    ds = _pick_time(ds)
    renames = {}
    for role in ("lat", "lon", "time", "level"):
        found = _find(ds, role)
        if found is not None and found != role:
            if role in ds.variables or role in ds.dims:
                ds = ds.drop_vars(role, errors="ignore")
            renames[found] = role
    ds = ds.rename(renames)
    renamed.update({role: renamed.get(found, found) for found, role in renames.items()})
    for role in ("lat", "lon"):
        if role not in ds.variables:
            raise ValueError(f"no {role}itude coordinate found (looked for CF standard_name/units/axis and the names "
                             f"{', '.join(_COMMON_NAMES[role][:4])})")
        if role in ds.data_vars:
            ds = ds.set_coords(role)
    if "time" in ds.variables and "time" not in ds.dims:
        ds = ds.drop_vars("time") if ds["time"].ndim > 0 else ds.expand_dims("time")
    ds = _apply_validity(ds)
    check_coordinates(ds)
    if ds["lat"].ndim == 1 and ds["lat"].dims == ("lat",) and ds["lon"].dims == ("lon",):
        ds = _regular_grid(ds)
    else:
        ds = _projected_grid(ds)
    if "time" in ds.dims:
        check_time(ds["time"].values)
    return ds, renamed


def _merge_expver(ds: xr.Dataset) -> xr.Dataset:
    """ERA5 requests that straddle final and preliminary (ERA5T) data carry an ``expver``
    dimension with each time step valid in exactly one version: keep the finite one."""
    if "expver" not in ds.dims:
        return ds.drop_vars("expver", errors="ignore")
    merged = ds.isel(expver=0, drop=True)
    for i in range(1, ds.sizes["expver"]):
        merged = merged.combine_first(ds.isel(expver=i, drop=True))
    return merged


def _pick_time(ds: xr.Dataset) -> xr.Dataset:
    """cfgrib gives a reference ``time`` and a ``valid_time``; keep the one that is the time axis."""
    if "valid_time" not in ds.variables or "time" not in ds.variables:
        return ds
    if "time" in ds.dims and ds.sizes["time"] > 1:
        return ds.drop_vars("valid_time")
    if "valid_time" in ds.dims:
        return ds.drop_vars("time")
    # Both scalar (one analysis) or valid_time on (time,): the valid time is what a user means.
    valid = ds["valid_time"]
    ds = ds.drop_vars("valid_time")
    if "time" in ds.dims:
        return ds.assign_coords(time=("time", np.atleast_1d(valid.values)))
    return ds.assign_coords(time=valid.values)


def _apply_validity(ds: xr.Dataset) -> xr.Dataset:
    """NaN where CF ``valid_*`` attributes or a ``valid_pixel_expression`` say a value is invalid."""
    out = ds.copy()
    for v in ds.data_vars:
        da = ds[v]
        if not np.issubdtype(da.dtype, np.number) or is_flag(da):
            continue
        lo, hi = _valid_bounds(da)
        keep = None
        if lo is not None:
            keep = da >= lo
        if hi is not None:
            keep = (da <= hi) if keep is None else keep & (da <= hi)
        expression = da.attrs.get("valid_pixel_expression")
        if expression:
            valid = valid_pixels(ds, expression)
            keep = valid if keep is None else keep & valid
        if keep is not None:
            out[v] = da.where(keep)
            out[v].attrs = {k: a for k, a in da.attrs.items() if k not in ("valid_min", "valid_max", "valid_range")}
            out[v].encoding = da.encoding
    return out


def _valid_bounds(da: xr.DataArray) -> tuple[float | None, float | None]:
    """``valid_min``/``valid_max`` in unpacked units (CF states them in packed units)."""
    attrs = {**da.encoding, **da.attrs}
    lo, hi = attrs.get("valid_min"), attrs.get("valid_max")
    if "valid_range" in attrs:
        lo, hi = attrs["valid_range"][0], attrs["valid_range"][1]
    scale, offset = attrs.get("scale_factor", 1.0), attrs.get("add_offset", 0.0)
    packed = "scale_factor" in da.encoding or "add_offset" in da.encoding
    unpack = (lambda b: float(b) * scale + offset) if packed else float
    return (None if lo is None else unpack(lo)), (None if hi is None else unpack(hi))


def _regular_grid(ds: xr.Dataset) -> xr.Dataset:
    """lon to [-180, 180) (dropping the repeated column of grids that wrap), both axes ascending.

    A regional grid across the antimeridian (170..190, or 0..360 values around 180) keeps its
    longitudes: wrapped, its columns would no longer be neighbours on the grid, and models see
    cell offsets.
    """
    lon = ds["lon"].values.astype(float)
    if (lon.max() >= 180.0 or lon.min() < -180.0) and not _splits_at_antimeridian(lon):
        wrapped = (lon + 180.0) % 360.0 - 180.0
        order = np.argsort(wrapped, kind="stable")
        # A global grid stored as 20..380 repeats its first column (up to rounding): keep one copy.
        spacing = np.median(np.abs(np.diff(lon))) if lon.size > 1 else 1.0
        keep = np.concatenate([[True], np.diff(wrapped[order]) > 0.01 * spacing])
        ds = ds.isel(lon=order[keep]).assign_coords(lon=wrapped[order[keep]])
        ds["lon"].attrs.update(units="degrees_east", standard_name="longitude")
    elif lon.size > 2 and np.any(np.diff(lon) < 0) and np.all(np.diff(lon % 360.0) > 0):
        # -180..180 values that jump at the antimeridian (170 .. 180, -180 .. -170): made contiguous.
        ds = ds.assign_coords(lon=("lon", lon % 360.0, ds["lon"].attrs))
    for axis in ("lat", "lon"):
        values = ds[axis].values
        if values.size > 1 and np.all(np.diff(values) < 0):
            ds = ds.isel({axis: slice(None, None, -1)})
        elif values.size > 1 and not np.all(np.diff(values) > 0):
            raise ValueError(f"{axis} is not monotonic (or repeats a value)")
    return ds


def _splits_at_antimeridian(lon: np.ndarray) -> bool:
    """True when wrapping ``lon`` to [-180, 180) would part a regional grid at the antimeridian:
    the wrapped, sorted grid has a jump wider than a few cells and does not go round the globe."""
    if lon.size < 2:
        return False
    wrapped = np.sort((lon + 180.0) % 360.0 - 180.0)
    spacing = np.median(np.abs(np.diff(lon)))
    inner = np.diff(wrapped).max()
    seam = wrapped[0] + 360.0 - wrapped[-1]  # the step from the last column round to the first
    return inner > 2.5 * spacing and seam <= 2.5 * spacing


def _projected_grid(ds: xr.Dataset) -> xr.Dataset:
    """Keep a projected grid's own dimensions; make lat/lon 2-D coordinates with lon in [-180, 180)."""
    lat, lon = ds["lat"], ds["lon"]
    if lat.ndim == 1 and lon.ndim == 1 and lat.dims != lon.dims:
        # Separate 1-D axes with other dimension names: a regular grid after all.
        return _regular_grid(ds.swap_dims({lat.dims[0]: "lat", lon.dims[0]: "lon"}))
    lat, lon = xr.broadcast(lat, lon)
    lon = (lon + 180.0) % 360.0 - 180.0
    return ds.assign_coords(lat=lat.transpose(*lat.dims), lon=lon.transpose(*lat.dims))


def horizontal_dims(ds: xr.Dataset) -> tuple[str, str]:
    """The two horizontal dimensions: ``("lat", "lon")`` on a regular grid, else the projected ``(y, x)``.

    Raises ValueError (one line) for a dataset not in geonp's convention (no ``lat``): one opened
    with xarray and handed to ``geonp.infill`` as it is, say.
    """
    if "lat" in ds.dims:
        return ("lat", "lon")
    if "lat" not in ds.variables:
        raise ValueError(f"no lat coordinate on dims {tuple(ds.dims)}: geonp takes cubes in its coordinate convention; "
                         "open the file with geonp.data.open_cube, or call ds.geonp.infill(...), which converts it")
    return tuple(ds["lat"].dims)  # type: ignore[return-value]


def field_variables(ds: xr.Dataset) -> list[str]:
    """Numeric data variables on the horizontal grid that are fields: not flags, QC, nor what CF
    attributes name as describing others (bounds such as ``vertices_latitude``, cell measures such
    as ``areacello``, grid mappings, auxiliary coordinates, ``ancillary_variables`` such as a
    product's uncertainty or a geonp output's ``VAR_std``)."""
    dims = set(horizontal_dims(ds))
    described = {name for var in ds.variables.values() for name in cf_references(var)}
    # What CF's ancillary_variables name describes another field (its uncertainty or flags: a geonp
    # output's VAR_std), and is not one to fill by default.
    described |= {name for var in ds.data_vars.values()
                  for name in str(var.attrs.get("ancillary_variables", "")).split()}
    return [str(v) for v, da in ds.data_vars.items()
            if dims <= set(da.dims) and np.issubdtype(da.dtype, np.number) and not is_flag(da)
            and not str(v).endswith(("_bnds", "_bounds")) and v not in described]


def cf_references(var: xr.Variable | xr.DataArray) -> list[str]:
    """The variable names ``var``'s CF attributes point to: ``bounds``, ``grid_mapping`` (``crs``
    or ``crs: lat lon ...``), ``cell_measures`` (``area: areacella``) and ``coordinates``."""
    attrs = {**var.encoding, **var.attrs}
    names = [str(attrs["bounds"])] if attrs.get("bounds") else []
    names += _attribute_names(attrs.get("grid_mapping"), before_colon=True)
    names += _attribute_names(attrs.get("cell_measures"), before_colon=False)
    return names + str(attrs.get("coordinates") or "").split()


def _attribute_names(text: object, before_colon: bool) -> list[str]:
    """Names in a CF attribute of ``key: name`` pairs (``cell_measures``: the names after each colon)
    or of ``name: coords`` pairs (extended ``grid_mapping``: the names before); a plain name as is."""
    words = str(text or "").split()
    if not any(w.endswith(":") for w in words):
        return words if before_colon else []
    if before_colon:
        return [w[:-1] for w in words if w.endswith(":")]
    return [w for w in words if not w.endswith(":")]


def _select(ds: xr.Dataset, wanted: list[str] | None) -> xr.Dataset:
    fields = field_variables(ds)
    if wanted is None:
        # A file of masks or flags only (a land-sea mask, a cloud mask) is a cube of those.
        dims = set(horizontal_dims(ds))
        gridded = [str(v) for v, da in ds.data_vars.items() if dims <= set(da.dims)]
        text = [v for v in gridded if not numeric(ds[v])]
        if not fields and text:  # a field of text, dates or objects: not something to fill
            raise ValueError(not_numbers(ds, text[0], fields))
        wanted = fields or gridded
        if not wanted:
            raise ValueError("no gridded data variable found")
    unknown = [v for v in wanted if v not in ds.data_vars]
    if unknown:
        names = ", ".join(map(repr, unknown))
        raise ValueError(f"unknown variable {names}; the file has {', '.join(fields) or 'none'}")
    text = [v for v in wanted if not numeric(ds[v])]
    if text:
        raise ValueError(not_numbers(ds, text[0], fields))
    # Flags and boolean masks stay beside the fields: a mask variable can name the valid area (--valid-mask).
    keep = set(wanted) | {v for v in ds.data_vars if is_flag(ds[v]) or ds[v].dtype == bool}
    return ds.drop_vars([v for v in ds.data_vars if v not in keep])
