"""Named geographic regions, cropping a cube to one, and selecting a period of its steps.

The three European regions are those of the TE-TNP paper's ERA5 experiment (Ashman et
al., ICML 2024, section 5.3): train in one, test in the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr


@dataclass(frozen=True)
class Region:
    """A latitude/longitude box in degrees (lon in [-180, 180)), bounds inclusive.

    Attributes:
        name: the name it is registered and reported under.
        lat: ``(south, north)`` in degrees north, ``-90 <= south < north <= 90``.
        lon: ``(west, east)`` in degrees east, ``-180 <= west < east <= 180``.
    """

    name: str
    lat: tuple[float, float]
    lon: tuple[float, float]

    def __post_init__(self) -> None:
        if not -90.0 <= self.lat[0] < self.lat[1] <= 90.0:
            raise ValueError(f"region {self.name!r}: latitude bounds {self.lat} must satisfy "
                             "-90 <= south < north <= 90")
        if not -180.0 <= self.lon[0] < self.lon[1] <= 180.0:
            raise ValueError(f"region {self.name!r}: longitude bounds {self.lon} must satisfy "
                             "-180 <= west < east <= 180")


REGIONS: dict[str, Region] = {}


def register_region(region: Region) -> Region:
    """Add ``region`` to the registry under its name (replacing one of the same name)."""
    REGIONS[region.name] = region
    return region


for _r in (
    Region("central_europe", lat=(42.0, 53.0), lon=(8.0, 28.0)),
    Region("western_europe", lat=(42.0, 53.0), lon=(-4.0, 8.0)),
    Region("northern_europe", lat=(53.0, 62.0), lon=(8.0, 28.0)),
):
    register_region(_r)


def get_region(region: str | Region | Sequence[float] | Mapping[str, Sequence[float]]) -> Region:
    """The ``Region`` a user's description names.

    Args:
        region: a registered name (``"central_europe"``, ``"western_europe"``,
            ``"northern_europe"`` or one added with :func:`register_region`), a ``Region``,
            ``(south, north, west, east)`` in degrees, or ``{"lat": [south, north], "lon":
            [west, east]}`` (optionally with ``"name"``).

    Returns:
        The ``Region`` (named ``"custom"`` when given by its bounds).

    Raises:
        ValueError: an unknown name, or bounds that are not four numbers in range.
    """
    if isinstance(region, Region):
        return region
    if isinstance(region, str):
        if region not in REGIONS:
            raise ValueError(f"unknown region {region!r}; known: {', '.join(sorted(REGIONS))} "
                             "(or give south, north, west, east)")
        return REGIONS[region]
    if isinstance(region, Mapping):
        return Region(str(region.get("name", "custom")), tuple(region["lat"]), tuple(region["lon"]))  # type: ignore[arg-type]
    values = [float(v) for v in region]
    if len(values) != 4:
        raise ValueError(f"a custom region is south, north, west, east; got {region!r}")
    return Region("custom", (values[0], values[1]), (values[2], values[3]))


def crop_to_region(ds: xr.Dataset, region: Region) -> xr.Dataset:
    """The part of ``ds`` inside ``region`` (lazy). On a projected grid: the smallest y/x box
    holding every cell whose centre lies in the region.

    Raises:
        ValueError: when no grid cell lies inside the region.
    """
    if "lat" in ds.dims:
        # Slices follow each coordinate's order (many products store latitude north to south).
        bounds = {dim: slice(*(lim if ds[dim].size < 2 or ds[dim][-1] >= ds[dim][0] else lim[::-1]))
                  for dim, lim in (("lat", region.lat), ("lon", region.lon))}
        out = ds.sel(bounds)
        empty = out.sizes["lat"] == 0 or out.sizes["lon"] == 0
    else:
        lat, lon = ds["lat"].values, ds["lon"].values
        inside = (lat >= region.lat[0]) & (lat <= region.lat[1]) & (lon >= region.lon[0]) & (lon <= region.lon[1])
        empty = not inside.any()
        if not empty:
            ydim, xdim = ds["lat"].dims
            rows, cols = np.nonzero(inside.any(axis=1))[0], np.nonzero(inside.any(axis=0))[0]
            out = ds.isel({ydim: slice(rows[0], rows[-1] + 1), xdim: slice(cols[0], cols[-1] + 1)})
    if empty:
        source = ds.attrs.get("geonp_source", "the cube")
        raise ValueError(f"region {region.name!r} (lat {region.lat}, lon {region.lon}) holds no grid cell of {source}")
    return out


def select_time(cube: xr.Dataset, time: Sequence[str] | None, source: str = "the cube") -> xr.Dataset:
    """The steps of ``cube`` from ``time[0]`` to ``time[1]`` (inclusive dates); all when None."""
    if time is None:
        return cube
    if "time" not in cube.dims or len(time) != 2:
        raise ValueError(f"{source}: time: [first, last] needs a cube with a time axis and two dates, got {time!r}")
    out = cube.sel(time=slice(str(time[0]), str(time[1])))
    if out.sizes["time"] == 0:
        raise ValueError(f"{source}: no time step between {time[0]} and {time[1]}")
    return out
