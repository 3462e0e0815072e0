"""One cell's time series from an infill output: the filled value with its +-2 sigma band,
observed and infilled steps marked (``geonp plot --point LAT,LON``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

if TYPE_CHECKING:
    from matplotlib.axes import Axes

from geonp.maps.style import FLAG_COLOURS


def cell_series(ds: xr.Dataset, variable: str, cell: tuple[int, int]) -> xr.Dataset:
    """``value``, ``std``, ``flag`` (and ``truth`` when ``ds`` holds ``__truth``) of ``variable`` at
    ``cell = (row, col)`` over time (1-D each)."""
    da = ds[variable]
    dims = [d for d in da.dims if d != "time"]
    at = {dims[0]: cell[0], dims[1]: cell[1]}
    layers = {"value": variable, "std": f"{variable}_std", "flag": f"{variable}_flag", "truth": "__truth"}
    return xr.Dataset({key: ds[name].isel(at) for key, name in layers.items() if name in ds})


def draw_series(ax: Axes, ds: xr.Dataset, variable: str, cell: tuple[int, int], point: tuple[float, float],
                mark_time: int | None = None, units: str = "") -> None:
    """Draw ``variable``'s series at ``cell`` on ``ax``: a line through every step, a +-2 sigma band
    where infilled, observed steps as dots and infilled steps as open circles; ``mark_time`` (an
    index) gets a vertical line (the time the maps show). The truth, when ``ds`` holds ``__truth``,
    is drawn dashed."""
    s = cell_series(ds, variable, cell)
    t = s["time"].values if "time" in s.coords else np.arange(s.sizes.get("time", 1))
    if t.dtype == object:
        # cftime dates (a climate model's noleap or 360_day calendar): nc-time-axis teaches
        # matplotlib to place and label them; importing it registers the converter.
        import nc_time_axis  # noqa: F401
    value, std, flag = (np.atleast_1d(s[k].values) for k in ("value", "std", "flag"))
    value = np.where(flag == 2, np.nan, value.astype(float))
    band = np.where(flag == 1, 2 * std.astype(float), 0.0)
    ax.fill_between(t, value - band, value + band, color=FLAG_COLOURS[1], alpha=0.25, linewidth=0,
                    label="+-2 sigma")
    ax.plot(t, value, color="black", linewidth=0.8)
    if "truth" in s:
        ax.plot(t, np.atleast_1d(s["truth"].values), color="grey", linewidth=0.8, linestyle="--", label="truth")
    for code, marker, face, label in ((0, "o", FLAG_COLOURS[0], "observed"), (1, "o", "none", "infilled")):
        sel = flag == code
        if sel.any():
            ax.plot(t[sel], value[sel], linestyle="none", marker=marker, markersize=4, markerfacecolor=face,
                    markeredgecolor=FLAG_COLOURS[code], label=label)
    if mark_time is not None and len(t) > 1:
        ax.axvline(t[mark_time], color="red", linewidth=0.8, alpha=0.7)
    ax.set_title(f"{variable} at {point[0]:.3f}N, {point[1]:.3f}E (cell row {cell[0]}, col {cell[1]})", fontsize=10)
    ax.set_ylabel(f"{variable}{units}")
    ax.legend(fontsize=8, loc="best")
    ax.tick_params(labelsize=8)
