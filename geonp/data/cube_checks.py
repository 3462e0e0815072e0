"""What makes a variable or a coordinate of a cube unusable, each with its one-line message.

:func:`geonp.data.cube.open_cube` calls these as it brings a file into geonp's convention: which
variables are flags rather than fields, which hold something other than numbers, whether a field
holds any value, and whether the horizontal coordinates are whole and on the sphere.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

#: How far beyond +-90 degrees a latitude may lie (float rounding of a grid's pole row).
POLE_TOLERANCE = 1e-6


def is_flag(da: xr.DataArray) -> bool:
    """Flag/QC variables describe other variables; they are not fields to fill."""
    low = str(da.name).lower()
    return any(k in da.attrs for k in ("flag_values", "flag_masks", "flag_meanings")) \
        or low.startswith("qc") or low.endswith(("_qc", "qc_day", "qc_night")) or "flag" in low or low == "mask"


def numeric(da: xr.DataArray) -> bool:
    """Numbers or a boolean mask, not text, dates or objects."""
    return bool(np.issubdtype(da.dtype, np.number) or da.dtype == bool)


def not_numbers(ds: xr.Dataset, name: str, fields: list[str]) -> str:
    """The message for a variable of text, dates or objects asked to be filled."""
    kind = {"U": "text", "S": "text", "O": "object", "M": "date", "m": "duration"}.get(ds[name].dtype.kind)
    return (f"variable {name!r} holds {kind or ds[name].dtype} values, not numbers; "
            f"the file's numeric fields: {', '.join(fields) or 'none'}")


def unreadable(what: str, err: Exception) -> str:
    """The message for data a codec could not decode: ``what`` failed, and why."""
    return f"{what} ({type(err).__name__}: {err}); is the file damaged or incomplete?"


def check_not_empty(ds: xr.Dataset) -> None:
    """Raise if a field holds no finite value, or a chunk of it cannot be decoded; reads chunks
    only until it finds a value."""
    for v in [v for v in ds.data_vars if not is_flag(ds[v])]:
        data = ds[v].data
        blocks = data.blocks.ravel() if hasattr(data, "blocks") else [data]
        try:
            found = any(bool(np.isfinite(np.asarray(block)).any()) for block in blocks)
        except RuntimeError as err:  # a chunk its codec cannot decode (Zstd, Blosc, HDF5)
            raise ValueError(unreadable(f"variable {v!r} could not be read", err)) from err
        if not found:
            raise ValueError(f"variable {v!r} holds no finite value (all NaN or fill)")


def check_coordinates(ds: xr.Dataset) -> None:
    """Refuse a 1-D lat or lon with missing values, and 1-D latitudes beyond the poles: either
    would otherwise surface as a monotonicity error, or not at all. A 2-D (curvilinear) grid is
    left to its own fill values and valid range."""
    for axis in ("lat", "lon"):
        if ds[axis].ndim != 1:
            continue
        values = np.asarray(ds[axis].values, dtype=float)
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{axis} holds {int(np.sum(~np.isfinite(values)))} missing values (NaN)")
        if axis == "lat" and np.any(np.abs(values) > 90.0 + POLE_TOLERANCE):
            raise ValueError(f"lat runs from {values.min():g} to {values.max():g} degrees: latitudes lie "
                             "within -90..90 (is it another coordinate?)")
