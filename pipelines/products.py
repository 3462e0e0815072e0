"""The shared data's products opened as stacks: one field, dims ``(time, rows, cols)``, with its valid area.

Benchmarks score fields of ``../shared/data`` (``geonp.data.readers.data_folder``). Most open with
``open_satellite`` (satellite products: QC flags become gaps, ``valid`` the area a value could be
in) or ``open_cube`` (gap-free fields); a few need assembling first, and those openers live
here, once, for every benchmark: five soil-moisture days into one stack, Alaska's years x dates
into one time axis, a multi-band GeoTIFF's bands into time, a sinusoidal grid without latitude
and longitude given them.

:func:`open_product` returns every product the same way: ``ds[variable]`` with dims ``(time,
rows, cols)`` (a single scene has a time axis of length 1), and ``ds["valid"]`` on ``(rows,
cols)``, True where a value is possible (the product's own valid area, else the cells observed in
some step of the whole product, so land stays out of an SST field and sea out of a land one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from geonp.data import open_cube, open_satellite

ESACCI_SM_FILES = [f"satellite/esacci_sm_2016-12/ESACCI-SOILMOISTURE-L3S-SSMV-PASSIVE-201612{d}000000-fv04.2.nc"
                   for d in range(27, 32)]
C3S_MONTHLY_FILES = [f"satellite/c3s_sm_2014-2017/monthly_passive_2017/C3S-SOILMOISTURE-L3S-SSMV-PASSIVE-MONTHLY-"
                     f"2017{m:02d}01000000-ICDR-v201706.0.0.nc" for m in range(7, 13)]
#: Earth radius of the MODIS sinusoidal projection, m.
MODIS_SPHERE_M = 6371007.181


def alaska_ndvi(folder: Path) -> xr.Dataset:
    """MODIS NDVI Alaska: 4 years x 4 dates stacked into one 16-step time axis (steps numbered 0..15)."""
    ds = open_satellite(folder / "satellite/gapfill_modis_ndvi_alaska_small.nc", "ndvi")
    stacked = ds["ndvi"].stack(time=("year", "doy")).transpose("time", "lat", "lon")
    steps = xr.DataArray(np.arange(stacked.sizes["time"]), dims="time")
    return xr.Dataset({"ndvi": stacked.drop_vars(["time", "year", "doy"]).assign_coords(time=steps),
                       "valid": ds["valid"]}, attrs=ds.attrs)


def esacci_soil_moisture(folder: Path, lat: tuple[float, float] | None = (30, 60),
                         lon: tuple[float, float] | None = (-10, 40)) -> xr.Dataset:
    """ESA CCI soil moisture (passive), five days of December 2016, in a lat/lon box (None: global).

    The valid area is the land seen on some day: the sea never holds a value."""
    days = [open_satellite(folder / f, "sm") for f in ESACCI_SM_FILES]
    return _daily_stack(days, "sm", lat, lon)


def c3s_soil_moisture_monthly(folder: Path) -> xr.Dataset:
    """Copernicus C3S passive soil moisture, monthly, July-December 2017, global 0.25 degrees."""
    return _daily_stack([open_satellite(folder / f, "sm") for f in C3S_MONTHLY_FILES], "sm", None, None)


def _daily_stack(days: list[xr.Dataset], variable: str, lat, lon) -> xr.Dataset:
    ds = xr.concat([d[[variable]] for d in days], "time")
    if lat is not None:
        ds = ds.sel(lat=slice(*lat), lon=slice(*lon))  # open_satellite orders latitude south to north
    ds["valid"] = ds[variable].notnull().any("time")
    return ds


def maharashtra_lst(folder: Path) -> xr.Dataset:
    """MODIS LST over western Maharashtra (7 days, degrees C) on its sinusoidal grid, given the
    latitude and longitude of each cell (the file has x/y only) and its ``domain_mask`` as valid area."""
    path = folder / "satellite/modis_lst_maharashtra_2012-05/mrainla_modis_lst_gridded.nc"
    with xr.open_dataset(path, engine="netcdf4") as raw:
        raw = raw.load()
    lat = np.degrees(raw["y"].values / MODIS_SPHERE_M)  # sinusoidal: y = R * lat, x = R * lon * cos(lat)
    lon = np.degrees(raw["x"].values[None, :] / (MODIS_SPHERE_M * np.cos(np.radians(lat))[:, None]))
    lst = raw["LST"].where(raw["domain_mask"] > 0)
    lst.attrs.update(units="degC", long_name="land surface temperature")
    return xr.Dataset({"LST": lst, "valid": raw["domain_mask"] > 0},
                      coords={"lat": (("y", "x"), np.broadcast_to(lat[:, None], lon.shape).copy()),
                              "lon": (("y", "x"), lon)}, attrs={"geonp_source": str(path)})


def npphen_evi(folder: Path, stack: str = "MegaDrought") -> xr.Dataset:
    """MODIS EVI (x 10000), an 8 x 8 window of 250 m cells, its bands (8-day composites) as time,
    with the latitude and longitude of each cell from the file's projection."""
    import rioxarray
    from pyproj import Transformer

    path = folder / "satellite/npphen_modis_evi_8x8/spatrast_2025" / f"{stack}_spatRast.tif"
    band = rioxarray.open_rasterio(path, mask_and_scale=True).load()
    dates = [d.strip('"') for d in (path.parent / "modis_dates.csv").read_text().split()[1:]]
    evi = band.rename(band="time").assign_coords(time=np.array(dates[: band.sizes["band"]], dtype="datetime64[D]"))
    lon, lat = Transformer.from_crs(band.rio.crs, "EPSG:4326", always_xy=True).transform(
        *np.meshgrid(band["x"].values, band["y"].values))
    evi = evi.drop_vars("spatial_ref", errors="ignore").assign_coords(lat=(("y", "x"), lat), lon=(("y", "x"), lon))
    evi.attrs = {"units": "1e-4", "long_name": "enhanced vegetation index x 10000"}
    ds = xr.Dataset({"evi": evi}, attrs={"geonp_source": str(path)})
    ds["valid"] = evi.notnull().any("time")
    return ds


#: Products that need assembling: name -> ``folder -> Dataset``.
OPENERS: dict[str, Callable[[Path], xr.Dataset]] = {
    "alaska_ndvi": alaska_ndvi,
    "esacci_soil_moisture": lambda folder: esacci_soil_moisture(folder, None, None),
    "c3s_soil_moisture_monthly": c3s_soil_moisture_monthly,
    "maharashtra_lst": maharashtra_lst,
    "npphen_evi": npphen_evi,
}


def open_product(folder: Path, variable: str, *, path: str | None = None, opener: str | None = None,
                 satellite: bool = True, open_kwargs: Mapping[str, Any] | None = None) -> xr.Dataset:
    """One product of the data folder as ``(time, rows, cols)`` with a ``valid`` area (module docstring).

    Args:
        folder: the data folder.
        variable: the field.
        path: the file under ``folder`` (not with ``opener``).
        opener: a name of :data:`OPENERS`, for products that need assembling.
        satellite: open ``path`` with ``open_satellite`` (QC, valid area) rather than ``open_cube``.
        open_kwargs: keywords for ``open_satellite``.

    Returns:
        The dataset, loaded into memory: ``variable`` and ``valid`` (and the coordinates).
    """
    if opener is not None:
        ds = OPENERS[opener](folder)
    elif satellite:
        ds = open_satellite(folder / path, variable, **dict(open_kwargs or {}))
    else:
        ds = open_cube(folder / path, [variable])
    da = ds[variable]
    extra = [d for d in da.dims if d not in ("time", *da.dims[-2:])]
    da = da.isel({d: 0 for d in extra})  # e.g. VIIRS's altitude axis of length 1
    if "time" not in da.dims:
        da = da.expand_dims("time")
    da = da.transpose("time", *da.dims[-2:])
    valid = ds["valid"] if "valid" in ds else da.notnull().any("time")
    valid = valid.isel({d: 0 for d in valid.dims if d not in da.dims[-2:]}).astype(bool)
    out = xr.Dataset({variable: da, "valid": valid}, attrs=ds.attrs)
    return out.drop_vars([c for c in out.coords if not set(out[c].dims) <= set(da.dims)]).load()
