"""Map figures of an infill output (``v``, ``v_std`` and ``v_flag`` per variable).

:func:`map_figure` draws the panels of the TE-TNP paper's Figure 6 for one variable at one time:
the observed input (``v`` where ``v_flag == 0``), the ground truth when given, the predicted mean
(the filled field), the predictive 1-sigma ``v_std`` and the status flags; with the truth, also
the error on the hidden cells. Observed, truth and mean share one colour scale, sigma and the
error have their own; colour bars carry the CF units; the title names the variable, time and
model. ``point=(lat, lon)`` adds that cell's time series (see :mod:`geonp.maps.series`).

Everything stays offline: coastlines and borders come from the Natural Earth shapefiles shipped in
the package (:mod:`geonp.maps.natural_earth`), never from cartopy's downloader. The figure is
rendered with the Agg canvas directly, so pyplot's global backend is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

from geonp.atomic import write_atomic
from geonp.maps import natural_earth
from geonp.maps.crs import MapGrid, lonlat, map_grid, projection
from geonp.maps.selection import select_extra, time_index
from geonp.maps.series import draw_series
from geonp.maps.style import CMAPS, FLAG_COLOURS, FLAG_NAMES, OUTSIDE_COLOUR

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def plot_infill(ds: xr.Dataset, variable: str, path: str | Path, *, dpi: int = 110, **options: Any) -> Path:
    """Write the map panels of :func:`map_figure` to a PNG.

    Args:
        ds: the infill output, as for :func:`map_figure`.
        variable: the filled variable's name.
        path: the PNG to write (atomically: a temporary file renamed into place).
        dpi: resolution in dots per inch.
        options: :func:`map_figure`'s keywords (``time``, ``truth``, ``hidden``, ``region``,
            ``projection_name``, ``point``, ``title``, ``select``).

    Returns:
        ``Path(path)``.
    """
    fig = map_figure(ds, variable, **options)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # attach the Agg canvas: no pyplot, no change to the global backend
    return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))


def map_figure(ds: xr.Dataset, variable: str, *, time: int | str = 0, truth: xr.DataArray | None = None,
               hidden: xr.DataArray | None = None, region: Any = None, projection_name: str | None = None,
               point: tuple[float, float] | None = None, title: str | None = None,
               select: Mapping[str, Any] | None = None, samples: int = 0) -> Figure:
    """The map panels of one variable of an infill output at one time.

    Args:
        ds: the infill output: ``variable``, ``variable_std`` and ``variable_flag`` on an optional
            ``time`` dim and two horizontal dims (lat/lon, or y/x with 2-D lat/lon or a grid mapping).
        variable: the filled variable's name.
        time: a time index, or a date/time (``"2019-01-01T06"``; the nearest step is drawn).
        truth: the complete field on the same grid; adds the truth and error panels.
        hidden: bool mask of the cells scored in the error panel; default the infilled cells (flag 1).
        region: a region name (:mod:`geonp.data.regions`) or ``(south, north, west, east)`` degrees.
        projection_name: a :data:`geonp.maps.crs.PROJECTIONS` name; default the grid's own CRS.
        point: ``(lat, lon)`` degrees: adds that cell's time series and marks it on the maps.
        title: the figure title; default variable, time and model.
        select: ``{dim: value}`` along the variable's other dims (a pressure ``level``, an
            ensemble ``member``): a coordinate value, else an index; default the first of each.
        samples: draw the first this many coherent samples (``variable_sample``, written by
            ``geonp infill --samples``) beside the mean, on its colour scale.

    Returns:
        A matplotlib ``Figure`` (not attached to pyplot): observed, truth and error (with
        ``truth``), predicted mean, 1-sigma and flag panels, plus the series with ``point``.

    Raises:
        ValueError: a layer is missing, the shapes disagree, or an argument is out of range.
    """
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from geonp.data.cube import coordinate_names  # geonp.data loads torch: only when drawing

    # An output keeps its input's names (latitude, valid_time, ...): draw it in geonp's.
    names = {name: role for role, name in coordinate_names(ds).items()}
    ds, truth, hidden = (None if a is None else a.rename({n: r for n, r in names.items() if n in a.coords})
                         for a in (ds, truth, hidden))
    work = _layers(ds, variable, truth, hidden, samples)
    if region is not None:
        from geonp.data.regions import crop_to_region, get_region

        work = crop_to_region(work, get_region(region))
    work, chosen = select_extra(work, variable, select or {})
    t = time_index(work[variable], time)
    sel = work.isel(time=t) if "time" in work[variable].dims else work
    dims = _horizontal_dims(sel[variable], variable)
    sel = sel.transpose(*dims, ...)
    grid = map_grid(sel, variable, dims)
    crs = projection(projection_name, grid, central_longitude=_centre_lon(grid))

    values = sel[variable].values.astype(np.float64)
    flag = sel[f"{variable}_flag"].values
    std = sel[f"{variable}_std"].values.astype(np.float64)
    outside = flag == 2
    values[outside] = np.nan
    std[outside] = np.nan
    panels = [("observed", np.where(flag == 0, values, np.nan), "value")]
    scale_from = [values]
    if "__truth" in sel:
        truth_values = sel["__truth"].values.astype(np.float64)
        panels.append(("ground truth", np.where(outside, np.nan, truth_values), "value"))
        scale_from.append(truth_values[~outside])
    panels += [("predicted mean (observed + infilled)", values, "value"), ("predicted 1-sigma", std, "std"),
               ("status", flag.astype(float), "flag")]
    for i in range(samples):  # coherent samples: where the mean is smooth, they show how the field may vary
        drawn = sel[f"{variable}_sample"].isel(sample=i).transpose(*dims).values.astype(np.float64)
        panels.append((f"sample {i + 1}", np.where(outside, np.nan, drawn), "value"))
    if "__truth" in sel:
        scored = (flag == 1) if "__hidden" not in sel else sel["__hidden"].values.astype(bool)
        error = np.where(scored & ~outside, values - truth_values, np.nan)
        ok = np.isfinite(error)
        rmse = float(np.sqrt(np.mean(error[ok] ** 2))) if ok.any() else float("nan")
        panels.append((f"error on hidden cells (RMSE {rmse:.3g})", error, "error"))

    attrs = ds[variable].attrs
    name = attrs.get("long_name") or attrs.get("standard_name") or variable
    units = f" [{attrs['units']}]" if attrs.get("units") else ""
    value_limits = _robust(np.concatenate([np.ravel(v) for v in scale_from]))
    labels = {"value": f"{name}{units}", "std": f"1-sigma of {name}{units}", "error": f"{variable} - truth{units}",
              "flag": "status flag"}

    cols = 2 if len(panels) == 4 else min(len(panels), 3)
    rows = -(-len(panels) // cols)
    ratio = _aspect(grid, crs)
    series_rows = 1 if point is not None else 0
    fig = Figure(figsize=(4.4 * cols, (3.6 * min(max(ratio, 0.3), 1.5) + 1.3) * rows + 3.0 * series_rows),
                 layout="constrained")
    # Map axes keep their aspect, which the layout engine does not see: pad so titles clear the bars above.
    fig.get_layout_engine().set(h_pad=0.12, hspace=0.06)
    spec = fig.add_gridspec(rows + series_rows, cols)
    if point is not None and "time" not in work[variable].dims:
        raise ValueError(f"a point's series: {variable!r} has no time axis to draw it along")
    cell = _point_cell(sel, grid, point, dims) if point is not None else None
    flag_cmap, flag_norm = ListedColormap(FLAG_COLOURS), BoundaryNorm([-0.5, 0.5, 1.5, 2.5], 3)
    for i, (panel_title, field, kind) in enumerate(panels):
        ax = fig.add_subplot(spec[i // cols, i % cols], **({"projection": crs} if crs is not None else {}))
        ax.set_label(f"panel:{kind}")
        kwargs: dict[str, Any] = {"shading": "auto"}
        if crs is not None:
            kwargs["transform"] = grid.crs
        if kind == "flag":
            kwargs.update(cmap=flag_cmap, norm=flag_norm)
        else:
            if outside.any():
                ax.pcolormesh(grid.x, grid.y, np.ma.masked_where(~outside, np.ones(outside.shape)),
                              cmap=ListedColormap([OUTSIDE_COLOUR]), vmin=0, vmax=1, **kwargs)
            if kind == "error":  # diverging, symmetric about zero
                vmax = _robust(np.abs(field))[1]
                kwargs.update(vmin=-vmax, vmax=vmax)
            else:
                lo, hi = value_limits if kind == "value" else _robust(field)
                kwargs.update(vmin=lo, vmax=hi)
            kwargs["cmap"] = CMAPS[kind]
        mesh = ax.pcolormesh(grid.x, grid.y, np.ma.masked_invalid(field), **kwargs)
        mesh.set_label("data")
        ax.set_title(panel_title, fontsize=10)
        _decorate(ax, grid, crs)
        if cell is not None:
            _mark(ax, grid, cell)
        bar = fig.colorbar(mesh, ax=ax, orientation="horizontal", shrink=0.85, label=labels[kind])
        if kind == "flag":
            bar.set_ticks([0, 1, 2], labels=list(FLAG_NAMES))
        else:
            bar.ax.xaxis.set_major_locator(MaxNLocator(5))
        bar.ax.tick_params(labelsize=8)
    if point is not None:
        ax = fig.add_subplot(spec[rows, :])
        ax.set_label("panel:series")
        draw_series(ax, work, variable, cell, point, mark_time=t, units=units)
    fig.suptitle(title if title is not None else _default_title(ds, work, variable, t, name, chosen))
    return fig


def filled_variables(ds: xr.Dataset) -> list[str]:
    """The variables ``v`` of an infill output: those with both ``v_std`` and ``v_flag`` beside them."""
    return sorted(str(v)[:-5] for v in ds.data_vars
                  if str(v).endswith("_flag") and str(v)[:-5] in ds and f"{str(v)[:-5]}_std" in ds)


def _layers(ds: xr.Dataset, variable: str, truth: xr.DataArray | None, hidden: xr.DataArray | None,
            samples: int = 0) -> xr.Dataset:
    """The three layers of ``variable`` (plus ``__truth``/``__hidden``, and ``variable_sample`` when
    ``samples`` are drawn) as one dataset, so that a region crop and a time selection apply to all
    of them alike."""
    names = (variable, f"{variable}_std", f"{variable}_flag")
    if samples:
        if f"{variable}_sample" not in ds.variables:
            raise ValueError(f"--samples: {variable!r} has no samples ('{variable}_sample'); fill with "
                             "geonp infill --samples N")
        if samples > ds.sizes["sample"]:
            raise ValueError(f"--samples {samples}: the output holds {ds.sizes['sample']}")
        names += (f"{variable}_sample",)
    for name in names:
        if name not in ds.variables:
            raise ValueError(f"{name!r} is not in the dataset (an infill output of {variable!r} holds "
                             f"{variable!r}, '{variable}_std' and '{variable}_flag')")
    mapping = ds[variable].attrs.get("grid_mapping") or ds[variable].encoding.get("grid_mapping")
    work = ds[list(names) + ([mapping] if mapping in ds.variables else [])]  # the CRS travels along
    for key, extra in (("__truth", truth), ("__hidden", hidden)):
        if extra is None:
            continue
        label = "truth" if key == "__truth" else "hidden"
        if set(extra.dims) - set(ds[variable].dims) or extra.squeeze(drop=True).ndim < 2:
            raise ValueError(f"{label} has dims {extra.dims}, expected {ds[variable].dims} (or its horizontal dims)")
        for dim in extra.dims:
            if extra.sizes[dim] != ds.sizes[dim]:
                raise ValueError(f"{label} has {extra.sizes[dim]} cells along {dim!r}, the output {ds.sizes[dim]}")
        work[key] = (extra.dims, extra.values)
    return work


def _horizontal_dims(da: xr.DataArray, variable: str) -> tuple[str, str]:
    dims = tuple(d for d in da.dims if d != "time")
    if len(dims) != 2:
        raise ValueError(f"{variable!r} must have two horizontal dims (plus an optional 'time'), got {da.dims}")
    return dims  # type: ignore[return-value]


def _centre_lon(grid: MapGrid) -> float:
    """The central longitude of a lon/lat grid's projection: its middle, so a region never splits."""
    if grid.crs is None or grid.native is not None:
        return 0.0
    lon = np.asarray(grid.x, float)
    lon = lon[np.isfinite(lon)]
    centre = float(np.round((lon.min() + lon.max()) / 2)) if lon.size and np.ptp(lon) < 300 else 0.0
    return centre + 0.0  # never -0.0: PROJ refuses "+pm=-0.0" (a grid centred just west of Greenwich)


def _decorate(ax: Axes, grid: MapGrid, crs: Any | None) -> None:
    """Coastlines, borders and lon/lat ticks on a map, or plain x/y axis labels."""
    ax.tick_params(labelsize=8)
    if crs is None:
        ax.set_xlabel("x")
        ax.set_ylabel("y")
        ax.set_aspect("equal" if np.ptp(grid.y) and np.ptp(grid.x) else "auto")
        return
    import cartopy.crs as ccrs
    from cartopy.feature import ShapelyFeature

    lon, lat = lonlat(grid)
    extent = float(np.nanmax(lon) - np.nanmin(lon)) if np.isfinite(lon).any() else 360.0
    scale = natural_earth.scale_for(extent)
    pc = ccrs.PlateCarree()
    bbox = None
    if np.isfinite(lon).any() and extent < 300:  # a regional map: only the lines near it
        bbox = (float(np.nanmin(lon)) - 10, float(np.nanmin(lat)) - 10, float(np.nanmax(lon)) + 10,
                float(np.nanmax(lat)) + 10)
    for layer, width, style in (("coastline", 0.7, "-"), ("borders", 0.4, ":")):
        ax.add_feature(ShapelyFeature([natural_earth.lines(layer, scale, bbox)], pc), facecolor="none",
                       edgecolor="black", linewidth=width, linestyle=style)
    if isinstance(crs, ccrs.PlateCarree):
        from matplotlib.ticker import FuncFormatter, MaxNLocator

        # Plain matplotlib ticks in the map's own x/y (degrees, x shifted by the central longitude):
        # cartopy's gridliner and formatters compare CRSs per tick, which took seconds per figure.
        centre = float(crs.proj4_params.get("pm", crs.proj4_params.get("lon_0", 0.0)))  # PlateCarree: pm
        for values, offset, set_ticks, axis, hemispheres in ((lon, centre, ax.set_xticks, ax.xaxis, "EW"),
                                                             (lat, 0.0, ax.set_yticks, ax.yaxis, "NS")):
            lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
            ticks = MaxNLocator(5, steps=[1, 2, 3, 5, 10]).tick_values(lo, hi)
            set_ticks(ticks[(ticks >= lo) & (ticks <= hi)] - offset)  # also switches the axis on
            axis.set_major_formatter(FuncFormatter(lambda v, _, o=offset, h=hemispheres: _degrees(v + o, h)))
        ax.grid(linewidth=0.3, color="grey", alpha=0.6)
    else:
        ax.gridlines(linewidth=0.3, color="grey", alpha=0.6)
    _fit_view(ax, grid, crs, lon, lat)  # last: setting ticks may widen the view


def _fit_view(ax: Axes, grid: MapGrid, crs: Any, lon: np.ndarray, lat: np.ndarray) -> None:
    """Show the grid's cells and no more (coastlines drawn around it must not widen the map)."""
    if grid.native is not None and crs is grid.native:
        x, y = np.asarray(grid.x, float), np.asarray(grid.y, float)
    else:
        import cartopy.crs as ccrs

        pts = crs.transform_points(ccrs.PlateCarree(), lon, lat)
        x, y = pts[..., 0], pts[..., 1]
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if x.size < 2 or y.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return
    # Half a cell beyond the outermost centres, as pcolormesh draws them.
    half_x = 0.5 * np.ptp(x) / max(np.shape(grid.x)[-1] - 1, 1)
    half_y = 0.5 * np.ptp(y) / max(np.shape(grid.y)[0] - 1, 1)
    ax.set_xlim(x.min() - half_x, x.max() + half_x)
    ax.set_ylim(y.min() - half_y, y.max() + half_y)


def _degrees(value: float, hemispheres: str) -> str:
    """``12.5`` -> ``12.5°E`` (longitudes wrapped to [-180, 180)), ``-30`` -> ``30°S``."""
    if hemispheres == "EW":
        value = (value + 180) % 360 - 180
    suffix = hemispheres[0] if value > 0 else hemispheres[1] if value < 0 else ""
    return f"{abs(value):g}°{suffix}"


def _point_cell(sel: xr.Dataset, grid: MapGrid, point: tuple[float, float], dims: tuple[str, str]) -> tuple[int, int]:
    """``(row, col)`` of the cell nearest to ``point = (lat, lon)``; an error when it lies off the grid."""
    lat0, lon0 = point
    if not (-90 <= lat0 <= 90 and -180 <= lon0 <= 360):
        raise ValueError(f"the point {lat0},{lon0}: expected latitude,longitude in degrees")
    if grid.crs is None:
        raise ValueError("a point needs lat/lon coordinates, and the grid has none")
    lon, lat = lonlat(grid)
    dlon = (lon - lon0 + 180) % 360 - 180
    d2 = (lat - lat0) ** 2 + (dlon * np.cos(np.deg2rad(lat0))) ** 2
    row, col = np.unravel_index(np.nanargmin(d2), d2.shape)
    # The widest cell side along either axis: a grid may hold latitude along its columns.
    spacing = max([float(np.nanmax(np.abs(np.diff(c, axis=a)), initial=0)) for c in (lat, lon) for a in (0, 1)]
                  + [1e-9])
    if np.sqrt(d2[row, col]) > 2 * spacing:
        raise ValueError(f"the point {lat0},{lon0} lies outside the grid (nearest cell "
                         f"{lat[row, col]:.3f},{lon[row, col]:.3f})")
    return int(row), int(col)


def _mark(ax: Axes, grid: MapGrid, cell: tuple[int, int]) -> None:
    lon, lat = lonlat(grid)
    kwargs: dict[str, Any] = {}
    if grid.crs is not None:
        import cartopy.crs as ccrs

        kwargs["transform"] = ccrs.PlateCarree()
    ax.plot(lon[cell], lat[cell], marker="x", color="red", markersize=8, mew=2, **kwargs)


def _aspect(grid: MapGrid, crs: Any | None) -> float:
    """Height / width of the drawn map (in the projection's units)."""
    if crs is None:
        xs, ys = np.ravel(grid.x).astype(float), np.ravel(grid.y).astype(float)
    else:
        import cartopy.crs as ccrs

        lon, lat = lonlat(grid)
        pts = crs.transform_points(ccrs.PlateCarree(), lon, lat)
        xs, ys = pts[..., 0], pts[..., 1]
    xs, ys = xs[np.isfinite(xs)], ys[np.isfinite(ys)]
    if xs.size < 2 or ys.size < 2 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
        return 1.0
    return float(np.ptp(ys) / np.ptp(xs))


def _robust(values: np.ndarray) -> tuple[float, float]:
    """The 2nd and 98th percentiles of the finite values, widened when they coincide."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return 0.0, 1.0
    lo, hi = (float(p) for p in np.percentile(finite, [2, 98]))
    if hi <= lo:
        pad = 0.5 * max(abs(lo), 1.0)
        lo, hi = lo - pad, hi + pad
    return lo, hi


def _default_title(ds: xr.Dataset, work: xr.Dataset, variable: str, t: int, name: str, chosen: str = "") -> str:
    """Variable (and the level or member drawn), time (when the output has a time axis) and model."""
    parts = [f"{name} ({variable})" if name != variable else variable]
    if chosen:
        parts.append(f"[{chosen}]")
    if "time" in work[variable].dims and "time" in work.coords:
        from geonp.data.calendar import format_time

        parts.append("at " + format_time(work["time"].values[t]))
    if ds.attrs.get("geonp_model"):
        parts.append(f"filled by {ds.attrs['geonp_model']}")
    return " ".join(parts)
