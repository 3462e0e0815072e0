"""Which step of an infill output a map draws: the time (an index or a date on the file's own
calendar) and one index of each further dimension (a pressure level, an ensemble member)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr


def select_extra(work: xr.Dataset, variable: str, select: Mapping[str, Any]) -> tuple[xr.Dataset, str]:
    """``work`` at one index of each of ``variable``'s dims beyond time and the horizontal ones, and
    those choices as text (``"plev=500"``); ``select`` gives a coordinate value or an index per dim."""
    da = work[variable]
    if "lat" in work.coords and work["lat"].ndim == 2:
        hdims = work["lat"].dims
    elif "lat" in da.dims and "lon" in da.dims:
        hdims = ("lat", "lon")
    else:
        hdims = tuple(d for d in da.dims if d != "time")[-2:]
    extra = [d for d in da.dims if d not in hdims and d != "time"]
    unknown = [d for d in select if d not in extra]
    if unknown:
        raise ValueError(f"--select {unknown[0]}: {variable!r} has no such dim to choose along "
                         f"(its others are {', '.join(extra) or 'none'})")
    index, text = {}, []
    for dim in extra:
        index[dim] = 0 if dim not in select else _position(work, dim, select[dim])
        value = work[dim].values[index[dim]] if dim in work.coords else index[dim]
        text.append(f"{dim}={value}")
    return work.isel(index), ", ".join(text)


def _position(work: xr.Dataset, dim: str, wanted: Any) -> int:
    """The index along ``dim`` whose coordinate equals ``wanted`` (a value or its text), else the
    index ``wanted`` itself."""
    n = work.sizes[dim]
    if dim in work.coords:
        values = np.asarray(work[dim].values)
        for candidate in (wanted, _number(wanted)):
            if candidate is None:
                continue
            hits = np.flatnonzero(np.isclose(values.astype(float), float(candidate))) \
                if np.issubdtype(values.dtype, np.number) and isinstance(candidate, int | float) \
                else np.flatnonzero(values.astype(str) == str(candidate))
            if hits.size:
                return int(hits[0])
    number = _number(wanted)
    if isinstance(number, int) and -n <= number < n:
        return number % n
    shown = ", ".join(map(str, work[dim].values[:8])) if dim in work.coords else f"indices 0..{n - 1}"
    raise ValueError(f"--select {dim}={wanted}: not a value of {dim} ({shown})")


def _number(text: Any) -> int | float | None:
    for kind in (int, float):
        try:
            return kind(text)
        except (TypeError, ValueError):
            continue
    return None


def time_index(da: xr.DataArray, time: int | str) -> int:
    """The index of ``time`` (an index, or a date/time matched to the nearest step) along ``da``'s time."""
    if "time" not in da.dims:
        return 0
    n = da.sizes["time"]
    if isinstance(time, int | np.integer):
        if not -n <= time < n:
            raise ValueError(f"time index {time} is out of range for {da.name!r} ({n} times)")
        return int(time) % n
    if "time" not in da.coords:
        raise ValueError(f"--time {time!r}: {da.name!r} has no time coordinate; give an index instead")
    from geonp.data.calendar import format_time, nearest_step  # geonp.data loads torch: only when drawing

    times = da["time"].values
    try:
        index, distance = nearest_step(times, str(time))
    except ValueError as err:
        raise ValueError(f"--time {time!r}: {err}; give an index or a date/time such as 2019-01-01T06") from None
    if distance > 1.0:
        raise ValueError(f"--time {time}: the output covers {format_time(times[0])} to {format_time(times[-1])}")
    return index
