"""``geonp fetch era5``: ERA5 hourly single-level fields from the Copernicus Climate Data Store into Zarr.

One CDS request per calendar month (days clipped to ``start``/``end``), each retried with
exponential back-off, downloaded to a temporary file next to the output and appended to a
chunked, consolidated Zarr store (see :mod:`geonp.data.zarr_store` for the chunking) only once
complete. ``attrs["geonp_months"]`` records the days each month holds, written after the data,
so an interrupted fetch resumes where it stopped: a run first cuts off any time steps the record
does not cover (a kill between an append and its record), then fetches only the days after the
last recorded one. A store therefore always covers one contiguous run of days.

Variables keep the short names of the CDS files (``2m_temperature`` -> ``t2m``), as float32 on
``(time, lat, lon)`` with ``lat``/``lon`` ascending and ``lon`` in [-180, 180). ``orography=True``
adds ``elevation`` (m) on ``(lat, lon)``: ERA5's invariant surface geopotential divided by g.

Credentials and the client: :mod:`geonp.data.cds` (``CDSAPI_URL``/``CDSAPI_KEY`` or ``~/.cdsapirc``).
"""

from __future__ import annotations

import calendar
import datetime as dt
import math
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from geonp.data import zarr_store
from geonp.data.cds import FetchError, cds_client, retrieve
from geonp.data.cube import open_cube
from geonp.data.elevation import G0  # ERA5 geopotential (m2 s-2) / G0 = height (m)

DATASET = "reanalysis-era5-single-levels"
FIRST_DAY = dt.date(1940, 1, 1)


@dataclass(frozen=True)
class Era5Query:
    """Validated arguments: variables (CDS names), dates, area [N, W, S, E] (deg), grid (deg), hours (UTC)."""

    variables: tuple[str, ...]
    start: dt.date
    end: dt.date
    area: tuple[float, float, float, float]
    grid: float
    hours: tuple[int, ...]

    def identity(self) -> dict[str, Any]:
        """What makes two fetches the same store (the dates may differ: a store grows forward)."""
        return {"dataset": DATASET, "variables": sorted(self.variables), "area": list(self.area),
                "grid": self.grid, "hours": list(self.hours)}

    def months(self) -> list[tuple[str, list[dt.date]]]:
        """``("YYYY-MM", days)`` for each calendar month from ``start`` to ``end``, days clipped to both."""
        out, year, month = [], self.start.year, self.start.month
        while (year, month) <= (self.end.year, self.end.month):
            first = max(self.start, dt.date(year, month, 1))
            last = min(self.end, dt.date(year, month, calendar.monthrange(year, month)[1]))
            days = [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]
            out.append((f"{year:04d}-{month:02d}", days))
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)
        return out

    def request(self, days: Sequence[dt.date], variables: Sequence[str] | None = None,
                hours: Sequence[int] | None = None) -> dict[str, Any]:
        """The CDS request body for ``days`` (all within one month)."""
        return {
            "product_type": ["reanalysis"],
            "variable": list(variables or self.variables),
            "year": [f"{days[0].year:04d}"],
            "month": [f"{days[0].month:02d}"],
            "day": [f"{d.day:02d}" for d in days],
            "time": [f"{h:02d}:00" for h in (hours or self.hours)],
            "area": list(self.area),
            "grid": [self.grid, self.grid],
            "data_format": "netcdf",
            "download_format": "unarchived",
        }

    def times(self, days: Sequence[dt.date]) -> np.ndarray:
        """The valid times of ``days`` x ``hours``, ``datetime64[ns]``, shape (len(days) * len(hours),)."""
        return np.array([np.datetime64(d) + np.timedelta64(h, "h") for d in days for h in self.hours],
                        dtype="datetime64[ns]")


def _date(value: str | dt.date, name: str) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value).strip())
    except ValueError:
        raise ValueError(f"--{name}: {value!r} is not a date (expected YYYY-MM-DD)") from None


def _area(value: str | Sequence[float]) -> tuple[float, float, float, float]:
    parts = str(value).split("/") if isinstance(value, str) else list(value)
    try:
        n, w, s, e = (float(p) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"--area: expected N/W/S/E in degrees (e.g. 60/-10/35/30), got {value!r}") from None
    if not (-90 <= s < n <= 90 and -180 <= w < e <= 360 and e - w <= 360):
        raise ValueError(f"--area: expected N/W/S/E with -90 <= S < N <= 90 and -180 <= W < E <= 360 "
                         f"(write 170/190 to cross the date line), got {value!r}")
    return n, w, s, e


def _hours(value: str | Iterable[int] | None) -> tuple[int, ...]:
    if value is None:
        return tuple(range(24))
    parts = [p for p in str(value).replace(" ", "").split(",") if p] if isinstance(value, str) else list(value)
    try:
        hours = sorted({int(p) for p in parts})
    except (TypeError, ValueError):
        raise ValueError(f"--hours: expected hours of the day such as 0,6,12,18, got {value!r}") from None
    bad = [h for h in hours if not 0 <= h <= 23]
    if not hours or bad:
        raise ValueError(f"--hours: every hour must lie in 0..23, got {value!r}")
    return tuple(hours)


def parse_query(variables: str | Sequence[str], start: str | dt.date, end: str | dt.date,
                area: str | Sequence[float], grid: float = 0.25, hours: str | Iterable[int] | None = None) -> Era5Query:
    """Validate the arguments of a fetch; every error is a one-line ValueError naming the argument."""
    names = [variables] if isinstance(variables, str) else list(variables or ())
    names = list(dict.fromkeys(str(v).strip() for v in names))
    if not names or any(not v or " " in v for v in names):
        raise ValueError(f"--variable: give ERA5 variable names such as 2m_temperature, got {variables!r}")
    first, last = _date(start, "start"), _date(end, "end")
    if first < FIRST_DAY:
        raise ValueError(f"--start: ERA5 begins on {FIRST_DAY}, got {first}")
    if last < first:
        raise ValueError(f"--end: {last} is before --start {first}")
    if last > dt.datetime.now(dt.UTC).date():
        raise ValueError(f"--end: {last} is in the future")
    try:
        step = float(grid)
    except (TypeError, ValueError):
        raise ValueError(f"--grid: expected a grid spacing in degrees, got {grid!r}") from None
    if not math.isfinite(step) or step <= 0:
        raise ValueError(f"--grid: the grid spacing must be > 0 degrees, got {grid!r}")
    return Era5Query(tuple(names), first, last, _area(area), step, _hours(hours))


def era5_requests(variables: str | Sequence[str], start: str | dt.date, end: str | dt.date,
                  area: str | Sequence[float], grid: float = 0.25,
                  hours: str | Iterable[int] | None = None) -> list[dict[str, Any]]:
    """The CDS requests of a fetch, one per calendar month, days clipped to ``start``/``end``.

    Args:
        variables: CDS variable names (``2m_temperature`` ...).
        start, end: first and last day (``YYYY-MM-DD`` or dates), inclusive.
        area: ``N/W/S/E`` in degrees, as a string or 4 numbers.
        grid: output grid spacing in degrees (ERA5's native grid is 0.25).
        hours: hours of the day (UTC), e.g. ``"0,6,12,18"``; default all 24.
    """
    query = parse_query(variables, start, end, area, grid, hours)
    return [query.request(days) for _, days in query.months()]


def _open_download(path: Path) -> xr.Dataset:
    """A downloaded file in geonp's convention; a zip (what the CDS sends when the fields need
    several NetCDF files) is unpacked beside it and its files merged."""
    if not zipfile.is_zipfile(path):
        return open_cube(path)
    # A folder per download: xarray caches open files by path, so names must never be reused.
    folder = path.with_suffix(".unzipped")
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if n.endswith(".nc")]
        zf.extractall(folder, members=names)
    parts = [open_cube(folder / n) for n in names]
    merged = xr.merge(parts, join="exact", combine_attrs="drop_conflicts")
    merged.set_close(lambda: [p.close() for p in parts])
    return merged


def _clean(ds: xr.Dataset) -> xr.Dataset:
    """Float32 fields with a few CF attributes, only ``time``/``lat``/``lon`` coordinates, no file encodings."""
    ds = ds.drop_vars([c for c in ds.coords if c not in ("time", "lat", "lon")])
    out = xr.Dataset(coords={c: ds[c].variable.copy() for c in ds.coords})
    for v in ds.data_vars:
        out[v] = ds[v].astype("float32")
        out[v].attrs = {k: a for k, a in ds[v].attrs.items() if k in ("units", "long_name", "standard_name")}
    for c in out.variables:
        out[c].encoding = {}
    out["lat"].attrs = {"units": "degrees_north", "standard_name": "latitude"}
    out["lon"].attrs = {"units": "degrees_east", "standard_name": "longitude"}
    return out


def _existing(out: Path, query: Era5Query) -> zarr_store.StoreState | None:
    """The store at ``out`` when it holds this fetch (cut back to what its record covers); None when absent."""
    state = zarr_store.read_state(out)
    if state is None:
        return None
    stored = state.attrs.get("geonp_era5")
    if stored is None:
        raise ValueError(f"{out} is not a geonp ERA5 store: pass --overwrite to replace it or choose another -o")
    wanted = query.identity()
    diff = [k for k in wanted if stored.get(k) != wanted[k]]
    if diff:
        shown = "; ".join(f"{k}: stored {stored.get(k)}, asked {wanted[k]}" for k in diff)
        raise ValueError(f"{out} holds a different ERA5 fetch ({shown}): pass --overwrite to replace it "
                         "or choose another -o")
    spans = state.attrs.get("geonp_months", {})
    if spans:
        first = dt.date.fromisoformat(min(s[0] for s in spans.values()))
        last = dt.date.fromisoformat(max(s[1] for s in spans.values()))
        if not first <= query.start <= last + dt.timedelta(days=1):
            raise ValueError(f"--start: {out} holds {first} to {last} and can only grow forward without a gap, "
                             f"so --start must lie in {first}..{last + dt.timedelta(days=1)}; "
                             "pass --overwrite to start again")
    return state


def _committed(out: Path, state: zarr_store.StoreState, query: Era5Query) -> None:
    """Cut off time steps appended after the last recorded month (a kill before its record was written)."""
    spans = state.attrs.get("geonp_months", {})
    days = sum((dt.date.fromisoformat(b) - dt.date.fromisoformat(a)).days + 1 for a, b in spans.values())
    n = days * len(query.hours)
    if any(state.shapes[v][0] < n for v in ["time", *state.time_variables]):
        raise ValueError(f"{out} records {days} days but holds fewer time steps: pass --overwrite")
    zarr_store.truncate_time(out, n)  # every array on time, each may have been resized or not
    last = max((dt.date.fromisoformat(s[1]) for s in spans.values()), default=None)
    if last is not None and zarr_store.read_times(out, n - 1, n)[0] != query.times([last])[-1]:
        raise ValueError(f"{out}: the time axis does not end where its record says: pass --overwrite")


def fetch_era5(variables: str | Sequence[str], start: str | dt.date, end: str | dt.date,
               area: str | Sequence[float], grid: float = 0.25, hours: str | Iterable[int] | None = None,
               out: str | os.PathLike = "era5.zarr", *, orography: bool = False, overwrite: bool = False,
               client: Any = None, retries: int = 3, backoff: float = 30.0, zarr_format: int = 3,
               verbose: bool = True) -> Path:
    """Fetch ERA5 single-level fields into the Zarr store ``out``, resuming an interrupted fetch.

    Args:
        variables, start, end, area, grid, hours: as for :func:`era5_requests`.
        out: the Zarr store; an existing one must hold the same variables, area, grid and hours
            (it is then extended forward), unless ``overwrite``.
        overwrite: replace an existing store that holds another fetch.
        orography: also store ``elevation`` (m, on (lat, lon)) = ERA5 geopotential / 9.80665.
        client: an object with cdsapi's ``retrieve(name, request, target)``; default a
            ``cdsapi.Client`` with the credentials of :func:`geonp.data.cds.cds_credentials`.
        retries: further attempts per request after a failure.
        backoff: seconds before the first retry; the ``i``-th waits ``backoff * 2**i`` s.
        zarr_format: 3 (default) or 2, for a new store.
        verbose: progress lines on stderr.

    Returns:
        ``Path(out)``: a store with float32 ``(time, lat, lon)`` fields under the CDS short names.

    Raises:
        ValueError: bad arguments, missing credentials, a refused request or an incompatible ``out``.
        FetchError: a request still failed after ``retries``; what was appended stays, rerun to resume.
    """
    query = parse_query(variables, start, end, area, grid, hours)
    if int(retries) < 0 or not float(backoff) >= 0:
        raise ValueError(f"--retries must be >= 0 and --backoff >= 0 s, got {retries} and {backoff}")
    if zarr_format not in (2, 3):
        raise ValueError(f"--zarr-format must be 2 or 3, got {zarr_format}")
    out = Path(out)
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if verbose else (lambda msg: None)
    if overwrite and out.exists() and not zarr_store.is_zarr(out):
        raise ValueError(f"{out} exists and is not a Zarr store; refusing to replace it")
    state = None if overwrite else _existing(out, query)
    spans: dict[str, list[str]] = dict(state.attrs.get("geonp_months", {})) if state else {}
    last = max((dt.date.fromisoformat(s[1]) for s in spans.values()), default=None)
    todo = [(m, [d for d in days if last is None or d > last]) for m, days in query.months()]
    todo = [(m, days) for m, days in todo if days]
    need_orography = orography and not (state and state.attrs.get("geonp_orography"))
    if not todo and not need_orography:
        say(f"{out}: already holds {query.start} to {query.end}; nothing to fetch")
        return out
    client, key = (client, None) if client is not None else cds_client(say, progress=verbose)
    # Nothing committed yet (or --overwrite): whatever is there, even a half-created store, goes.
    if out.exists() and (overwrite or not (spans or state.attrs.get("geonp_orography"))):
        zarr_store.remove(out)
        state = None
    if state is not None:
        _committed(out, state, query)
    attrs = {"geonp_era5": query.identity(), "geonp_orography": False,
             "source": "ERA5 hourly data on single levels, Copernicus Climate Change Service (CDS)",
             **(state.attrs if state else {}), "geonp_months": spans}
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.download-*"):  # left by a fetch that was killed
        shutil.rmtree(stale, ignore_errors=True)
    steps = len(query.hours)
    # Downloads land beside the output (same file system, cleaned up whatever happens).
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.download-") as tmp:
        work = Path(tmp)
        if need_orography:
            request = query.request([query.start], ["geopotential"], query.hours[:1])
            target = retrieve(client, DATASET, request, work / "z.nc", "ERA5 orography", retries, backoff, say, key)
            with _open_download(target) as raw:
                if "z" not in raw:
                    raise FetchError(f"ERA5 orography: expected variable 'z', the file holds {list(raw.data_vars)}")
                z = raw["z"].isel(time=0, drop=True) if "time" in raw["z"].dims else raw["z"]
                elev = _clean(xr.Dataset({"elevation": z / G0}))
                elev["elevation"].attrs = {"units": "m", "standard_name": "surface_altitude",
                                           "long_name": "surface elevation (ERA5 geopotential / 9.80665)"}
                zarr_store.write(out, elev, attrs, steps, zarr_format)
            attrs["geonp_orography"] = True
            zarr_store.update_attrs(out, {"geonp_orography": True})
            say(f"{out}: stored elevation (m)")
        for month, days in todo:
            full = len(days) == calendar.monthrange(days[0].year, days[0].month)[1]
            what = f"ERA5 {month}" if full else f"ERA5 {month} (day {days[0].day})" if len(days) == 1 else \
                f"ERA5 {month} (days {days[0].day}-{days[-1].day})"
            say(f"{what}: requesting {', '.join(query.variables)}")
            target = retrieve(client, DATASET, query.request(days), work / f"{month}.nc", what, retries, backoff,
                              say, key)
            with _open_download(target) as raw:
                ds = _clean(raw)
                if not np.array_equal(ds["time"].values, query.times(days)):
                    raise FetchError(f"{what}: the CDS served {ds.sizes.get('time', 0)} time steps, "
                                     f"expected {len(days) * steps}")
                stored = zarr_store.read_state(out)
                if stored is not None and stored.time_variables not in ([], sorted(map(str, ds.data_vars))):
                    raise FetchError(f"{what}: the file holds {sorted(map(str, ds.data_vars))}, "
                                     f"the store {stored.time_variables}")
                zarr_store.write(out, ds, attrs, steps, zarr_format)
            target.unlink()
            # Recorded only now that the data are in: a kill before this line is undone on resume.
            spans[month] = [spans.get(month, [days[0].isoformat()])[0], days[-1].isoformat()]
            attrs["geonp_months"] = spans
            zarr_store.update_attrs(out, {"geonp_months": spans})
            say(f"{what}: appended {len(days) * steps} time steps to {out}")
    return out
