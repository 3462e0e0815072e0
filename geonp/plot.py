"""Map figures of an infill output (``v``, ``v_std`` and ``v_flag`` per variable).

``plot_infill`` draws one row of panels for a variable ``v``: the input as the model saw it (``v``
where ``v_flag == 0``), the filled field ``v``, the predictive 1-sigma ``v_std`` and, given the
truth, the error on the hidden cells. Cells outside the valid area (flag 2) are light grey.

Everything stays offline: coastlines are drawn with cartopy only when the Natural Earth 110m
coastline is already on disk, read straight from that file (cartopy's downloader is never asked),
and plain lon/lat axes are drawn otherwise. matplotlib and cartopy are imported lazily, and the
figure is rendered with the Agg canvas directly, so pyplot's global backend is left alone.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

OUTSIDE_COLOUR = "lightgrey"
_COASTLINE_SPEC = ("shapefiles", "natural_earth", "110m", "physical", "coastline")


def coastline_path() -> Path | None:
    """The Natural Earth 110m coastline shapefile cartopy would use, if it is already on disk.

    Asks cartopy's configured downloader where the file lives (``config["pre_existing_data_dir"]``
    first, then ``config["data_dir"]``, typically ``.../shapefiles/natural_earth/physical/
    ne_110m_coastline.shp``) without calling its ``path`` method, which would download. None when
    cartopy is not importable or the shapefile (with its ``.shx`` and ``.dbf``) is absent.
    """
    try:
        import cartopy
        from cartopy.io import Downloader
    except ImportError:
        return None
    fmt = {"config": cartopy.config, "category": "physical", "name": "coastline", "resolution": "110m"}
    try:
        downloader = Downloader.from_config(_COASTLINE_SPEC)
        candidates = [downloader.pre_downloaded_path(fmt), downloader.target_path(fmt)]
    except Exception:  # an odd user config: no usable downloader entry
        return None
    for shp in candidates:
        if shp is not None and all(Path(shp).with_suffix(s).is_file() for s in (".shp", ".shx", ".dbf")):
            return Path(shp)
    return None


def coastlines_available() -> bool:
    """True when coastlines can be drawn offline (cartopy importable and the 110m coastline on disk)."""
    return coastline_path() is not None


def plot_infill(ds: xr.Dataset, variable: str, path: str | Path, *, time: int = 0,
                truth: xr.DataArray | None = None, hidden: xr.DataArray | None = None,
                title: str | None = None, dpi: int = 110) -> Path:
    """Write a PNG map figure of an infill output and return its path.

    Args:
        ds: the infill output, holding ``variable``, ``variable_std`` and ``variable_flag`` on an
            optional ``time`` dim and two horizontal dims (``lat``/``lon``, or ``y``/``x`` with 2-D
            ``lat``/``lon`` coordinates).
        variable: the filled variable's name.
        path: the PNG to write (parent folders are created).
        time: the time index drawn when ``ds`` has a ``time`` dim.
        truth: the complete field; adds a panel with the error ``variable - truth``.
        hidden: bool mask of the cells scored in the error panel (the cells hidden from the model);
            defaults to the infilled cells (flag 1).
        title: the figure title; defaults to the variable's name and the time.
        dpi: the PNG resolution.

    Raises:
        ValueError: a variable is missing, the shapes disagree, or matplotlib is not installed.
    """
    fig = _figure(ds, variable, time=time, truth=truth, hidden=hidden, title=title)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attach the Agg canvas: no pyplot, no change to the global backend
    fig.savefig(path, dpi=dpi, format="png")
    return path


def _figure(ds: xr.Dataset, variable: str, *, time: int = 0, truth: xr.DataArray | None = None,
            hidden: xr.DataArray | None = None, title: str | None = None,
            coastlines: bool | None = None) -> Figure:
    """The figure ``plot_infill`` saves; ``coastlines=None`` draws them when available offline."""
    for name in (variable, f"{variable}_std", f"{variable}_flag"):
        if name not in ds.variables:
            raise ValueError(f"{name!r} is not in the dataset (an infill output of {variable!r} holds "
                             f"{variable!r}, '{variable}_std' and '{variable}_flag')")
    try:
        from matplotlib.colors import ListedColormap
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as err:
        raise ValueError("plotting needs matplotlib: pip install matplotlib") from err

    da = _select(ds[variable], time, variable)
    dims = da.dims
    values = da.values.astype(np.float64)
    flag = _select(ds[f"{variable}_flag"], time, f"{variable}_flag", dims).values
    std = _select(ds[f"{variable}_std"], time, f"{variable}_std", dims).values.astype(np.float64)
    outside = flag == 2
    values[outside] = np.nan
    std[outside] = np.nan
    panels = [("observed input", np.where(flag == 0, values, np.nan), "value"),
              ("filled (observed + infilled)", values, "value"),
              ("predictive 1-sigma", std, "std")]
    if truth is not None:
        truth_values = _select(truth, time, "truth", dims).values
        scored = flag == 1 if hidden is None else _select(hidden, time, "hidden", dims).values.astype(bool)
        error = np.where(scored & ~outside, values - truth_values, np.nan)
        ok = np.isfinite(error)
        rmse = float(np.sqrt(np.mean(error[ok] ** 2))) if ok.any() else float("nan")
        panels.append((f"error on hidden cells (RMSE {rmse:.3g})", error, "error"))

    x, y, geographic = _coords(da)
    coast = coastline_path() if geographic and coastlines is not False else None
    crs = _plate_carree() if coast is not None else None

    attrs = da.attrs
    name = attrs.get("long_name") or attrs.get("standard_name") or variable
    units = attrs.get("units")
    suffix = f" [{units}]" if units else ""
    value_limits = _robust(values)
    labels = {"value": f"{name}{suffix}", "std": f"1-sigma of {name}{suffix}", "error": f"{variable} - truth{suffix}"}
    cmaps = {"value": "viridis", "std": "magma", "error": "RdBu_r"}

    ratio, scale = _aspect(x, y, stretch=geographic and crs is None)
    fig = Figure(figsize=(4.6 * len(panels), 4.2 * min(max(ratio, 0.3), 1.5) + 1.8), layout="constrained")
    grey = ListedColormap([OUTSIDE_COLOUR])
    mask = np.ma.masked_where(~outside, np.ones(outside.shape))
    for i, (panel_title, field, kind) in enumerate(panels):
        kwargs: dict[str, Any] = {"shading": "auto"}
        if crs is not None:
            kwargs["transform"] = crs
            ax = fig.add_subplot(1, len(panels), i + 1, projection=crs)
        else:
            ax = fig.add_subplot(1, len(panels), i + 1)
        ax.set_label(f"panel:{kind}")
        if outside.any():
            ax.pcolormesh(x, y, mask, cmap=grey, vmin=0, vmax=1, **kwargs)
        if kind == "error":  # diverging, symmetric about zero
            vmax = _robust(np.abs(field))[1]
            vmin = -vmax
        else:
            vmin, vmax = value_limits if kind == "value" else _robust(field)
        mesh = ax.pcolormesh(x, y, np.ma.masked_invalid(field), cmap=cmaps[kind], vmin=vmin, vmax=vmax, **kwargs)
        ax.set_title(panel_title, fontsize=10)
        _decorate(ax, coast, geographic, x, y)
        if crs is None:
            ax.set_aspect(scale)
        bar = fig.colorbar(mesh, ax=ax, orientation="horizontal", shrink=0.85, label=labels[kind])
        bar.ax.xaxis.set_major_locator(MaxNLocator(5))
        bar.ax.tick_params(labelsize=8)
    fig.suptitle(title if title is not None else _default_title(ds, variable, time))
    return fig


def _select(da: xr.DataArray, time: int, name: str, dims: tuple[Any, ...] | None = None) -> xr.DataArray:
    """The 2-D field of ``da`` at time index ``time``, transposed to ``dims`` when given."""
    if "time" in da.dims:
        n = da.sizes["time"]
        if not -n <= time < n:
            raise ValueError(f"time index {time} is out of range for {name!r} ({n} times)")
        da = da.isel(time=time)
    if da.ndim != 2:
        raise ValueError(f"{name!r} must have two horizontal dims (plus an optional 'time'), got {da.dims}")
    if dims is not None:
        if set(da.dims) != set(dims):
            raise ValueError(f"{name!r} has dims {da.dims}, expected {dims}")
        da = da.transpose(*dims)
    return da


def _coords(da: xr.DataArray) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(x, y, geographic)``: lon/lat (1-D on a lat/lon grid, else 2-D) or, lacking them, the axes."""
    ydim, xdim = da.dims
    if "lat" in da.coords and "lon" in da.coords:
        lat, lon = da.coords["lat"], da.coords["lon"]
        if lat.dims == (ydim,) and lon.dims == (xdim,):
            return lon.values, lat.values, True
        lon2 = lon.broadcast_like(da).transpose(ydim, xdim).values
        lat2 = lat.broadcast_like(da).transpose(ydim, xdim).values
        return lon2, lat2, True
    x = da.coords[xdim].values if xdim in da.coords else np.arange(da.sizes[xdim])
    y = da.coords[ydim].values if ydim in da.coords else np.arange(da.sizes[ydim])
    return x, y, False


def _decorate(ax: Axes, coastline: Path | None, geographic: bool, x: np.ndarray, y: np.ndarray) -> None:
    """Coastlines and lon/lat ticks on a map, or plain lon/lat (or x/y) axis labels."""
    ax.tick_params(labelsize=8)
    if coastline is None:
        ax.set_xlabel("longitude [°E]" if geographic else "x")
        ax.set_ylabel("latitude [°N]" if geographic else "y")
        return
    from cartopy.feature import ShapelyFeature
    from cartopy.mpl.ticker import LatitudeFormatter, LongitudeFormatter
    from matplotlib.ticker import MaxNLocator

    crs = _plate_carree()
    ax.add_feature(ShapelyFeature(_coastline_geometries(str(coastline)), crs), facecolor="none",
                   edgecolor="black", linewidth=0.6)
    # Plain ticks rather than cartopy's gridliner labels: the same on PlateCarree, and far quicker to draw.
    for values, set_ticks, axis, formatter in ((x, ax.set_xticks, ax.xaxis, LongitudeFormatter()),
                                               (y, ax.set_yticks, ax.yaxis, LatitudeFormatter())):
        lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
        ticks = MaxNLocator(5, steps=[1, 2, 3, 5, 10]).tick_values(lo, hi)
        set_ticks(ticks[(ticks >= lo) & (ticks <= hi)], crs=crs)
        axis.set_major_formatter(formatter)
    ax.grid(linewidth=0.3, color="grey", alpha=0.6)


def _plate_carree() -> Any:
    """cartopy's PlateCarree projection (imported only when coastlines are drawn)."""
    import cartopy.crs as ccrs

    return ccrs.PlateCarree()


@functools.lru_cache(maxsize=4)
def _coastline_geometries(path: str) -> tuple[Any, ...]:
    """The coastline geometries read straight from ``path`` (cartopy's downloader is never involved)."""
    from cartopy.io.shapereader import Reader

    reader = Reader(path)
    try:
        return tuple(reader.geometries())
    finally:
        reader.close()


def _aspect(x: np.ndarray, y: np.ndarray, stretch: bool) -> tuple[float, float]:
    """``(height / width of the map, y-to-x scale)``; ``stretch`` widens degrees of latitude by 1/cos(latitude)."""
    xs, ys = np.asarray(x, float), np.asarray(y, float)
    xs, ys = xs[np.isfinite(xs)], ys[np.isfinite(ys)]
    if xs.size < 2 or ys.size < 2 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
        return 1.0, 1.0
    scale = 1.0 / max(float(np.cos(np.deg2rad(np.median(ys)))), 0.2) if stretch else 1.0
    return float(np.ptp(ys) * scale / np.ptp(xs)), scale


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


def _default_title(ds: xr.Dataset, variable: str, time: int) -> str:
    """``variable`` and, when the output has a time axis, the drawn time."""
    if "time" not in ds[variable].dims or "time" not in ds.coords:
        return variable
    t = ds["time"].values[time]
    stamp = np.datetime_as_string(t, unit="m") if np.issubdtype(np.asarray(t).dtype, np.datetime64) else str(t)
    return f"{variable} at {stamp}"
