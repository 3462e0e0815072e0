"""Reading gridded files as xarray decodes them, before geonp's convention: NetCDF/HDF5, GRIB
(cfgrib), Zarr v2/v3 and GeoTIFF (rioxarray), from local paths or fsspec URLs, lazily.

:func:`open_input` is what :func:`geonp.data.cube.open_cube` brings to the convention, and the
layout an infill output keeps (:mod:`geonp.fill.layout`).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from geonp.data import zarr_store

_GRIB_SUFFIXES = (".grib", ".grb", ".grib1", ".grib2", ".grb2")
_TIFF_SUFFIXES = (".tif", ".tiff", ".geotiff")


def open_input(path: str | os.PathLike) -> xr.Dataset:
    """The file as xarray decodes it, before geonp's convention (lazy): the layout an output keeps."""
    return open_raw(str(path))


def is_url(name: str) -> bool:
    """True for a remote address (``https://``, ``s3://``, ...); ``file://`` is a local path."""
    return "://" in name and not name.startswith("file://")


def _open_zarr(local: str) -> xr.Dataset:
    """A Zarr store, lazily, without the warnings of a store that lacks consolidated metadata
    (slower to open, still correct). An array whose metadata is missing or damaged (a folder of
    chunks Zarr does not recognise) is refused by name: it would otherwise vanish from the dataset
    and surface as a variable that is not there."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = xr.open_zarr(local, chunks={}, decode_timedelta=False)
    unread = set()
    for w in caught:
        if (m := re.search(r"Object at (\S+) is not recognized", str(w.message))):
            unread.add(m.group(1))
        elif "consolidated metadata" not in str(w.message).lower():  # any other warning is the user's to see
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    damaged = sorted(name for name in unread if not is_url(local) and _holds_chunks(Path(local) / name))
    if damaged:
        raise UnusableInput(f"Zarr cannot read {', '.join(damaged)}: its array metadata (.zarray or zarr.json) is "
                           "missing or damaged")
    return ds


class UnusableInput(Exception):
    """A file that opens but cannot be used as it is: a Zarr store with arrays Zarr cannot read, a
    NetCDF-4 file whose variables all sit in groups (not a ValueError: :func:`open_raw` names the
    file once, not as a format no reader recognises)."""


def _refuse_groups(local: str) -> None:
    """A NetCDF-4 file with nothing at its root but groups (as many satellite products are): say
    which, rather than that it has no latitude."""
    if netcdf_engine(local) != "netcdf4":
        return
    import netCDF4

    with netCDF4.Dataset(local) as nc:
        groups = list(nc.groups)
    if groups:
        raise UnusableInput(f"its variables sit in NetCDF groups ({', '.join(groups[:5])}); open one with "
                            "xarray.open_dataset(path, group=NAME) and fill that Dataset with geonp.infill")


def _holds_chunks(folder: Path) -> bool:
    """Whether ``folder`` holds an array's chunks (v2 ``0.0.0``, v3 ``c/``), not stray files."""
    return folder.is_dir() and any(p.name == "c" or re.fullmatch(r"\d+([./]\d+)*", p.name) for p in folder.iterdir())


def open_raw(name: str) -> xr.Dataset:
    """The file as xarray decodes it (CF scale/offset/fill applied), still lazy."""
    local = name[len("file://"):] if name.startswith("file://") else name
    is_zarr = local.rstrip("/").endswith(".zarr") or (not is_url(local) and zarr_store.is_zarr(Path(local)))
    if not is_url(local) and not Path(local).exists():
        raise FileNotFoundError(f"{name}: no such file or directory")
    try:
        if is_zarr:
            return _open_zarr(local)
        if is_url(local):
            import fsspec

            # Formats other than Zarr need a seekable local file: cache it once.
            local = fsspec.open_local(f"simplecache::{local}", simplecache={"same_names": True})
        suffix = Path(local).suffix.lower()
        if suffix in _GRIB_SUFFIXES:
            _need("cfgrib", "grib")
            return xr.open_dataset(local, engine="cfgrib", chunks={}, decode_timedelta=False,
                                   backend_kwargs={"indexpath": ""})
        if suffix in _TIFF_SUFFIXES:
            _need("rioxarray", "geotiff")
            return _open_geotiff(local)
        ds = xr.open_dataset(local, engine=netcdf_engine(local), chunks={}, decode_timedelta=False)
        if not ds.data_vars:
            _refuse_groups(local)
        return ds
    except (OSError, ValueError, KeyError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        why = "not a format any installed reader recognises" if "IO backends" in str(err) else str(err).splitlines()[0]
        raise ValueError(f"{name}: cannot read it as NetCDF, GRIB, Zarr or GeoTIFF ({why})") from None
    except UnusableInput as err:
        raise ValueError(f"{name}: {err}") from None
    except ImportError as err:
        if is_url(name):  # fsspec's protocols need their own packages (aiohttp for http, s3fs, ...)
            raise ValueError(f"{name}: reading this address needs a package that is not installed ({err}); "
                             "install it, or download the file and give its path") from None
        raise ValueError(f"{name}: the reader for this format is not installed ({err}); "
                         "install geonp[grib] for GRIB or geonp[geotiff] for GeoTIFF") from None


#: The first bytes of NetCDF-3 (classic, 64-bit offset, CDF-5) and of HDF5, which NetCDF-4 is.
_NETCDF_SIGNATURES = (b"CDF\x01", b"CDF\x02", b"CDF\x05", b"\x89HDF\r\n\x1a\n")


def netcdf_engine(path: str | os.PathLike) -> str | None:
    """``"netcdf4"`` for a NetCDF or HDF5 file (by its first bytes), else None (xarray guesses).

    Naming the engine keeps xarray from loading every installed backend to ask each whether it
    can read the file: with rasterio (GeoTIFF) and eccodes (GRIB) installed beside netCDF4, that
    loaded their own copies of the HDF5 and netCDF libraries into the process, which then
    aborted at exit ("double free or corruption") after the work was done, exit status 134.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return None
    return "netcdf4" if head.startswith(_NETCDF_SIGNATURES) else None


def _open_geotiff(path: str) -> xr.Dataset:
    """A GeoTIFF as a Dataset: one variable per band, lat/lon computed for projected CRSs."""
    import rioxarray

    da = rioxarray.open_rasterio(path, chunks={"band": 1, "y": "auto", "x": "auto"}, mask_and_scale=True)
    crs = da.rio.crs
    stem = Path(path).stem
    if da.sizes["band"] == 1:
        ds = da.isel(band=0, drop=True).to_dataset(name=stem)
    else:  # band descriptions name the variables where the file has them
        described = da.attrs.get("long_name")
        described = described if isinstance(described, tuple) else (None,) * da.sizes["band"]
        names = [d or f"{stem}_band{b}" for d, b in zip(described, da["band"].values)]
        ds = xr.Dataset({n: da.isel(band=i, drop=True) for i, n in enumerate(names)})
    for v in ds.data_vars:
        ds[v].attrs = {k: val for k, val in da.attrs.items() if k in ("units", "scale_factor", "add_offset")}
    if crs is not None and crs.is_geographic:
        return ds.rename({"x": "lon", "y": "lat"})
    if crs is None:
        raise ValueError("the GeoTIFF has no coordinate reference system")
    return _add_lat_lon(ds, crs)


def _add_lat_lon(ds: xr.Dataset, crs) -> xr.Dataset:
    """Attach 2-D ``lat``/``lon`` coordinates to a projected grid, computed lazily per chunk."""
    import dask.array as dsa
    from pyproj import Transformer

    to_geo = Transformer.from_crs(crs, "EPSG:4326", always_xy=True)
    first = ds[next(iter(ds.data_vars))]
    chunks = first.chunks if first.chunks is not None else None
    xx = dsa.broadcast_to(dsa.from_array(ds["x"].values[None, :]), (ds.sizes["y"], ds.sizes["x"]))
    yy = dsa.broadcast_to(dsa.from_array(ds["y"].values[:, None]), (ds.sizes["y"], ds.sizes["x"]))
    if chunks is not None:
        xx, yy = xx.rechunk(chunks[-2:]), yy.rechunk(chunks[-2:])
    # One transform per block gives both coordinates, stacked on a new leading axis.
    both = dsa.map_blocks(lambda x, y: np.stack(to_geo.transform(x, y)), xx, yy, dtype=float, new_axis=0,
                          chunks=((2,), *xx.chunks))
    return ds.assign_coords(lat=(("y", "x"), both[1]), lon=(("y", "x"), both[0]))


def _need(module: str, extra: str) -> None:
    """Refuse, naming the install, a file whose reader is an optional extra that is not installed."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ValueError(f"its reader {module} is not installed: pip install 'geonp[{extra}]'")


def data_folder() -> Path:
    """The shared real-data folder, where relative paths of training files and DEMs are looked for.

    Returns:
        ``$GEONP_DATA`` when set, else ``../shared/data`` beside the working directory (which
        need not exist: callers say so when a file is missing).
    """
    env = os.environ.get("GEONP_DATA")
    return Path(env) if env else Path.cwd().parent / "shared" / "data"
