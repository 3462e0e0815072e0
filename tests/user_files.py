"""Inputs written the way users write them: xarray's ``to_netcdf`` / ``to_zarr`` (Zarr v2 and v3), any
CF calendar, any dimension order, extra dimensions, packed integers, 2-D coordinates, bounds, and
chunkings of the data unlike those of its coordinates.

:func:`user_file` builds one from a :class:`Layout` (tests draw layouts with hypothesis) and
:func:`check_filled` asserts what ``geonp infill`` must give back for it: an output aligned with the
input, the input's attributes and CF companions, observed cells unchanged and every gap filled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from geonp.data.cube import cf_references

#: Every CF calendar (with the aliases users write).
CALENDARS = ("standard", "gregorian", "proleptic_gregorian", "noleap", "365_day", "all_leap", "366_day",
             "360_day", "julian")
#: Names users give an extra dimension (ERA5's ``number`` is its ensemble member).
EXTRA_DIMS = ("level", "plev", "member", "realization", "number", "lev")
GLOBAL_ATTRS = {"title": "a user's field", "institution": "somewhere", "source": "a model, version 2",
                "Conventions": "CF-1.6", "history": "2020-01-01T00:00:00Z made by hand"}


@dataclass(frozen=True)
class Layout:
    """How one input is laid out and written.

    ``calendar``: a CF calendar, or None for no time axis; ``start_year`` 2300 or 1500 puts
    standard dates outside datetime64[ns]'s range; ``order``: a permutation of the dims' roles
    (``t``, ``e``xtra, ``y``, ``x``); ``grid``: ``regular``, ``descending`` (latitude north to
    south, longitude 0..360) or ``curvilinear`` (dims ``(j, i)`` with 2-D latitude/longitude and
    cell vertices); ``writer``: ``nc``, ``zarr2`` or ``zarr3``; ``chunks``: ``none``, ``data``
    (the data chunked along some dims, coordinates whole) or ``mixed`` (data and coordinates chunked
    differently).
    """

    calendar: str | None = "noleap"
    start_year: int = 2000
    steps: int = 3
    extra: str | None = None
    order: str = "tyx"
    grid: str = "regular"
    packed: bool = False
    writer: str = "nc"
    chunks: str = "none"
    bounds: bool = True
    seed: int = 0


def user_dataset(layout: Layout) -> xr.Dataset:
    """The dataset of ``layout`` (before writing): variable ``tas`` with gaps and CF companions."""
    rng = np.random.default_rng(layout.seed)
    ny, nx, ne = 9, 11, 2
    roles = {"y": ("j" if layout.grid == "curvilinear" else "lat", ny),
             "x": ("i" if layout.grid == "curvilinear" else "lon", nx)}
    if layout.calendar is not None:
        roles["t"] = ("time", layout.steps)
    if layout.extra is not None:
        roles["e"] = (layout.extra, ne)
    order = [r for r in layout.order if r in roles]
    dims = tuple(roles[r][0] for r in order)
    yy, xx = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    base = 280.0 + 3.0 * np.sin(yy / 3.0) + 2.0 * np.cos(xx / 4.0)  # [ny, nx]
    full = np.broadcast_to(np.expand_dims(base, tuple(range(len(order) - 2))),
                           (*[n for r, (_, n) in roles.items() if r in "te"], ny, nx))
    src = [r for r in "te" if r in roles] + ["y", "x"]
    values = np.transpose(full, [src.index(r) for r in order]).astype(np.float32)
    values = values + rng.normal(0.0, 0.3, values.shape).astype(np.float32)
    gaps = rng.random(values.shape) < 0.2
    values[gaps] = np.nan
    attrs = {"standard_name": "air_temperature", "units": "K", "long_name": "Near-Surface Air Temperature",
             "cell_methods": "time: mean"}
    ds = xr.Dataset({"tas": (dims, values, attrs)}, attrs=dict(GLOBAL_ATTRS))
    lat1, lon1 = np.linspace(40.0, 48.0, ny), np.linspace(-6.0, 5.0, nx)
    if layout.grid == "curvilinear":
        lat2 = lat1[:, None] + 0.05 * np.arange(nx)[None, :]
        lon2 = lon1[None, :] + 0.1 * np.arange(ny)[:, None]
        ds = ds.assign_coords(j=("j", np.arange(ny), {"long_name": "cell index along second dimension"}),
                              i=("i", np.arange(nx), {"long_name": "cell index along first dimension"}),
                              latitude=(("j", "i"), lat2, {"standard_name": "latitude", "units": "degrees_north",
                                                           "bounds": "vertices_latitude"}),
                              longitude=(("j", "i"), lon2, {"standard_name": "longitude", "units": "degrees_east",
                                                            "bounds": "vertices_longitude"}))
        corners = np.array([[-0.5, -0.5], [-0.5, 0.5], [0.5, 0.5], [0.5, -0.5]]) * 0.9
        ds["vertices_latitude"] = (("j", "i", "vertices"), lat2[..., None] + corners[:, 0])
        ds["vertices_longitude"] = (("j", "i", "vertices"), lon2[..., None] + corners[:, 1])
        ds["tas"].attrs["cell_measures"] = "area: areacello"
        ds["areacello"] = (("j", "i"), np.full((ny, nx), 1e8), {"standard_name": "cell_area", "units": "m2"})
    else:
        if layout.grid == "descending":
            lat1, lon1 = lat1[::-1], np.sort(lon1 % 360.0)
        ds = ds.assign_coords(lat=("lat", lat1, {"standard_name": "latitude", "units": "degrees_north",
                                                 "bounds": "lat_bnds"}),
                              lon=("lon", lon1, {"standard_name": "longitude", "units": "degrees_east",
                                                 "bounds": "lon_bnds"}))
        if layout.bounds:
            ds["lat_bnds"] = (("lat", "bnds"), np.stack([lat1 - 0.4, lat1 + 0.4], axis=1))
            ds["lon_bnds"] = (("lon", "bnds"), np.stack([lon1 - 0.5, lon1 + 0.5], axis=1))
    if layout.calendar is not None:
        times = xr.date_range(f"{layout.start_year:04d}-01-01", periods=layout.steps + 1, freq="MS",
                              calendar=layout.calendar, use_cftime=True)
        ds = ds.assign_coords(time=("time", times[:-1], {"standard_name": "time", "axis": "T"}))
        ds["time"].encoding.update(units=f"days since {layout.start_year - 1:04d}-01-01", calendar=layout.calendar)
        if layout.bounds:
            ds["time"].attrs["bounds"] = "time_bnds"
            ds["time_bnds"] = (("time", "bnds"), np.stack([times[:-1], times[1:]], axis=1))
            ds["time_bnds"].encoding.update(units=ds["time"].encoding["units"], calendar=layout.calendar)
    if layout.extra is not None:
        ds = ds.assign_coords({layout.extra: (layout.extra, np.arange(ne) * 100 + 500)})
    if layout.packed:
        ds["tas"].encoding.update(dtype="int16", scale_factor=0.01, add_offset=280.0, _FillValue=np.int16(-32767))
    return ds


def write_user_file(layout: Layout, folder: Path) -> Path:
    """``user_dataset(layout)`` written as the user would, with its chunking; returns the path."""
    ds = user_dataset(layout)
    path = folder / ("in.nc" if layout.writer == "nc" else "in.zarr")
    encoding = {v: dict(ds[v].encoding) for v in ds.variables}
    if layout.chunks != "none":
        size = {d: max(1, n // 2) for d, n in ds.sizes.items()}
        data = tuple(size[d] if k % 2 == 0 or layout.chunks == "mixed" else ds.sizes[d]
                     for k, d in enumerate(ds["tas"].dims))
        key = "chunksizes" if layout.writer == "nc" else "chunks"
        encoding["tas"][key] = data
        if layout.chunks == "mixed":
            for c in ds.coords:
                if ds[c].ndim == 2:  # 2-D latitude/longitude: chunked unlike the data
                    encoding[c][key] = tuple(max(1, n // 3) for n in ds[c].shape)
    encoding = {v: e for v, e in encoding.items() if e}
    if layout.writer == "nc":
        ds.to_netcdf(path, encoding=encoding)
    else:
        ds.to_zarr(path, zarr_format=2 if layout.writer == "zarr2" else 3, encoding=encoding, consolidated=True)
    return path


def read_back(path: Path) -> xr.Dataset:
    """The input as a user opens it with xarray's defaults."""
    return (xr.open_zarr(path) if path.suffix == ".zarr" else xr.open_dataset(path)).load()


def check_filled(given: xr.Dataset, out: xr.Dataset, variable: str = "tas") -> None:
    """``out`` is ``given`` filled: aligned, same dims and attributes, CF companions and time
    encoding kept, observed cells unchanged, every gap filled and flagged."""
    xr.align(given, out, join="exact")
    assert out[variable].dims == given[variable].dims
    for layer in (f"{variable}_std", f"{variable}_flag"):
        assert out[layer].dims == given[variable].dims
    for key, value in given.attrs.items():
        if key == "history":
            assert str(value) in out.attrs["history"] and out.attrs["history"] != value
        elif key == "Conventions":  # the CF version geonp writes; the input's kept beside it
            assert out.attrs[key] == "CF-1.11"
            assert out.attrs.get("geonp_input_conventions") == (None if value == "CF-1.11" else value)
        else:
            assert out.attrs[key] == value, key
    # Coordinates and what CF ties to them or to the field (bounds, cell measures) come back as
    # they were; other fields of the file only when they were filled too.
    coords = [c for c in given.coords if set(given[c].dims) <= set(given[variable].dims)]
    tied = set(coords) | {n for v in (variable, *coords) for n in cf_references(given[v])}
    for name in given.variables:
        if name != variable and (name in tied or f"{name}_flag" in out.variables):
            assert name in out.variables, f"{name} missing from the output"
            if f"{name}_flag" not in out.variables:
                expected, got = given[name].variable.load(), out[name].variable.load()
                if expected.attrs.get("bounds") and expected.attrs["bounds"] not in given.variables:
                    # A bounds attribute naming a variable the file lacks is dropped (CF requires it).
                    assert "bounds" not in got.attrs
                    expected = expected.copy()
                    expected.attrs = {k: v for k, v in expected.attrs.items() if k != "bounds"}
                xr.testing.assert_identical(got, expected)
    if "time" in given.variables:
        assert out["time"].encoding.get("calendar", "standard") == given["time"].encoding.get("calendar", "standard")
    values, filled = given[variable].values, out[variable].values
    observed = np.isfinite(values)
    np.testing.assert_array_equal(filled[observed], values[observed])
    assert np.isfinite(filled).all()
    flags = out[f"{variable}_flag"].values
    assert (flags[observed] == 0).all() and (flags[~observed] == 1).all()
    std = out[f"{variable}_std"].values
    assert (std[~observed] > 0).all() and (std[observed] == 0).all()
