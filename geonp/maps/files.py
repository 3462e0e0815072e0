"""``geonp plot``: read an infill output (and optionally the truth) from disk and write a PNG map."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from geonp.data.readers import netcdf_engine
from geonp.maps.figure import filled_variables, plot_infill

#: The finest ``--dpi``: a print-quality map; beyond it the figure's pixels outgrow memory.
MAX_DPI = 1200


def plot_file(output: str | Path, out: str | Path, *, variable: str | None = None, time: int | str = 0,
              region: str | None = None, projection_name: str | None = None, truth: str | Path | None = None,
              point: str | None = None, dpi: int = 110, select: list[str] | None = None, samples: int = 0) -> Path:
    """Draw ``output`` (a store ``geonp infill`` wrote) to the PNG ``out``; returns its path.

    Args:
        output: the infill output (Zarr or NetCDF).
        out: the PNG to write.
        variable: the filled variable; default the output's only one.
        time: a time index, or a date/time (``2019-01-01T06``, nearest step).
        region: a region name or ``"S,N,W,E"`` degrees.
        projection_name: see :data:`geonp.maps.crs.PROJECTIONS`.
        truth: a file holding the complete field (``variable``, or its only variable) on the same grid.
        point: ``"LAT,LON"``: add that cell's time series.
        dpi: PNG resolution.
        select: ``["DIM=VALUE", ...]``: which level, member ... to draw (default the first of each).
        samples: how many of the output's coherent samples to draw beside the mean.

    Returns:
        ``Path(out)``, the PNG written.

    Raises:
        ValueError / FileNotFoundError: one line naming the file, variable or argument at fault.
    """
    output, out = Path(output), Path(out)
    if out.suffix.lower() != ".png":
        raise ValueError(f"-o {out}: geonp plot writes PNG files; name it *.png")
    if not 1 <= int(dpi) <= MAX_DPI:  # a figure at 10^5 dpi asks for terabytes of pixels
        raise ValueError(f"--dpi must be between 1 and {MAX_DPI}, got {dpi}")
    if int(samples) < 0:
        raise ValueError(f"--samples must be >= 0, got {samples}")
    ds = _open(output, "infill output")
    if ds.attrs.get("geonp_status") == "incomplete":  # geonp.fill.finished.STATUS: blocks not yet written are blank
        raise ValueError(f"{output}: an unfinished fill (geonp_status incomplete); run its geonp infill command "
                         "again to finish it, then plot")
    filled = filled_variables(ds)
    if not filled:
        raise ValueError(f"{output}: not an infill output (no VAR with VAR_std and VAR_flag layers)")
    if variable is None:
        if len(filled) > 1:
            raise ValueError(f"{output} holds several filled variables ({', '.join(filled)}): choose one with --var")
        variable = filled[0]
    elif variable not in filled:
        raise ValueError(f"--var {variable}: {output} has no filled variable of that name (it has {', '.join(filled)})")
    truth_da = None
    if truth is not None:
        tds = _open(Path(truth), "--truth")
        only = list(tds.data_vars)[0] if len(tds.data_vars) == 1 else None
        name = variable if variable in tds.data_vars else only
        if name is None:
            raise ValueError(f"--truth {truth}: has no variable {variable!r} and more than one variable")
        truth_da = tds[name]
        try:
            truth_da = truth_da.transpose(*[d for d in ds[variable].dims if d in truth_da.dims])
        except ValueError:
            raise ValueError(f"--truth {truth}: {name!r} has dims {truth_da.dims}, the output's {variable!r} "
                             f"{ds[variable].dims}") from None
        _check_same_grid(truth_da, ds[variable], truth)
    return plot_infill(ds, variable, out, time=_time(time), truth=truth_da, region=_region(region),
                       projection_name=projection_name, point=_point(point) if point else None, dpi=dpi,
                       select=_select(select or []), samples=samples)


def _check_same_grid(truth: xr.DataArray, filled: xr.DataArray, path: str | Path) -> None:
    """Refuse a truth whose numeric coordinates (latitudes, longitudes, levels) differ from the
    output's: of the same shape, it would be compared cell by cell with another place."""
    for dim in truth.dims:
        if dim not in truth.coords or dim not in filled.coords:
            continue
        a, b = np.asarray(truth[dim].values), np.asarray(filled[dim].values)
        if a.shape != b.shape or not (np.issubdtype(a.dtype, np.number) and np.issubdtype(b.dtype, np.number)):
            continue
        span = float(np.ptp(b)) if b.size > 1 else 1.0
        if not np.allclose(a, b, rtol=0.0, atol=1e-6 * max(span, 1e-12)):
            raise ValueError(f"--truth {path}: its {dim} runs {a.min():g}..{a.max():g}, the output's "
                             f"{b.min():g}..{b.max():g}: not the same grid")


def _open(path: Path, what: str) -> xr.Dataset:
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        if path.is_dir() or path.suffix == ".zarr":
            return xr.open_zarr(path)
        return xr.open_dataset(path, engine=netcdf_engine(path))
    except Exception as err:  # noqa: BLE001 - any reader failure is the same to the user: not a dataset
        raise ValueError(f"{what} {path} is not a readable Zarr or NetCDF dataset ({type(err).__name__})") from None


def _select(items: list[str]) -> dict[str, str]:
    """``["plev=500", "member=2"]`` as ``{"plev": "500", "member": "2"}``."""
    out = {}
    for item in items:
        dim, sep, value = item.partition("=")
        if not sep or not dim or not value:
            raise ValueError(f"--select {item!r}: expected DIM=VALUE, e.g. plev=500")
        out[dim.strip()] = value.strip()
    return out


def _time(text: int | str) -> int | str:
    """An index when ``text`` is an integer, else the date/time string."""
    try:
        return int(text)
    except (TypeError, ValueError):
        return str(text)


def _region(text: str | None) -> str | tuple[float, ...] | None:
    """A region name, or ``S,N,W,E`` as four floats."""
    if text is None or "," not in text:
        return text
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--region {text!r}: expected a region name or S,N,W,E in degrees") from None
    if len(values) != 4:
        raise ValueError(f"--region {text!r}: expected S,N,W,E (four numbers)")
    return values


def _point(text: str) -> tuple[float, float]:
    try:
        lat, lon = (float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--point {text!r}: expected LAT,LON in degrees, e.g. 52.5,13.4") from None
    return lat, lon
