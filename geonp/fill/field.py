"""The input side of infill: which variables, where data may exist, elevation, and summary stats.

A ``Field`` is one variable seen as a lazy ``[time, rows, cols]`` array (a single scene gets a
length-1 time axis) with its valid-area mask and the whole-variable statistics that windows
fall back on. Everything here reads the cube lazily; the one full pass (``summarise``) computes
the statistics of every variable in a single dask traversal.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path

import dask
import numpy as np
import xarray as xr

from geonp.data.cube import field_variables, horizontal_dims
from geonp.data.far_context import Pyramid, build_pyramid


@dataclass
class Field:
    """One variable to fill.

    ``data`` is the lazy ``[time, rows, cols]`` DataArray (dims ``dims``), ``valid`` a bool
    numpy array ``[rows, cols]`` or ``[time, rows, cols]`` (True where data may exist), ``mean``
    and ``spread`` the variable's mean and standard deviation over observed valid cells, ``gaps``
    the number of missing cells inside the valid area.
    """

    name: str
    data: xr.DataArray
    valid: np.ndarray
    mean: float = 0.0
    spread: float = 1.0
    observed: int = 0
    gaps: int = 0
    _pyramids: dict[int, Pyramid] = dataclass_field(default_factory=dict, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.data.shape)  # type: ignore[return-value]

    def pyramid(self, finest: int) -> Pyramid:
        """Block summaries of the observed cells for far context (:mod:`geonp.data.far_context`),
        from blocks of ``2**finest`` cells up; one pass over the cube on first use, then kept."""
        if finest not in self._pyramids:
            self._pyramids[finest] = build_pyramid(self.data, self.valid, finest)
        return self._pyramids[finest]

    def valid_slab(self, key: tuple[slice, slice, slice]) -> np.ndarray:
        """The valid mask over ``key``, broadcast to ``[T, R, C]``."""
        sub = self.valid[key] if self.valid.ndim == 3 else self.valid[key[1:]][None]
        return np.broadcast_to(sub, tuple(s.stop - s.start for s in key))


def select_variables(ds: xr.Dataset, variables: str | list[str] | None, source: str,
                     mask: object = None) -> list[str]:
    """Resolve ``--var``: the named variables (checked) or every field of ``ds`` but the valid mask."""
    if isinstance(variables, str):
        variables = [variables]
    fields = [v for v in field_variables(ds) if v not in ("valid", mask)]
    if not variables:
        if not fields:
            raise ValueError(f"{source}: no gridded data variable to fill")
        return fields
    for v in variables:
        if v not in ds.data_vars:
            raise ValueError(f"--var {v}: no such variable in {source} (it has: {', '.join(fields) or 'none'})")
        if not set(horizontal_dims(ds)) <= set(ds[v].dims):
            raise ValueError(f"--var {v}: not on the horizontal grid of {source} (dims {ds[v].dims})")
    return list(variables)


def valid_area(ds: xr.Dataset, valid_mask: str | Path | xr.DataArray | None, da: xr.DataArray,
               source: str) -> np.ndarray:
    """``--valid-mask``: True where data may exist, as ``[rows, cols]`` or ``[time, rows, cols]``.

    Accepts a variable name of ``ds``, a file holding one mask variable on the same grid, a bool
    DataArray, ``"observed"`` (cells observed at least once over time), or None: the cube's own
    ``valid`` variable (what ``open_satellite`` provides) when present, else every cell.
    """
    rows, cols = da.dims[1:]
    if valid_mask is None:
        if "valid" not in ds.data_vars:
            return np.ones(da.shape[1:], bool)
        mask = ds["valid"]
    elif isinstance(valid_mask, xr.DataArray):
        mask = valid_mask
    elif str(valid_mask) == "observed":
        return np.isfinite(da).any("time").compute().values
    elif str(valid_mask) in ds.variables:
        mask = ds[str(valid_mask)]
    else:
        mask = _mask_from_file(Path(valid_mask), ds)
    if not set(mask.dims) <= {"time", rows, cols} or not {rows, cols} <= set(mask.dims):
        raise ValueError(f"--valid-mask: mask dims {mask.dims} do not match the grid of {source} ({rows}, {cols})")
    dims = ("time", rows, cols) if "time" in mask.dims else (rows, cols)
    values = mask.transpose(*dims).values
    want = da.shape if "time" in mask.dims else da.shape[1:]
    if values.shape != want:
        raise ValueError(f"--valid-mask: mask shape {values.shape} does not match {source} {want}")
    if values.dtype != bool:
        values = np.nan_to_num(values.astype(np.float64), nan=0.0) > 0
    return values


def _mask_from_file(path: Path, ds: xr.Dataset) -> xr.DataArray:
    from geonp.data import open_cube

    if not path.exists():
        raise ValueError(f"--valid-mask {path}: neither a variable of the input nor an existing file")
    mask_ds = open_cube(path)
    names = list(mask_ds.data_vars)
    if len(names) != 1:
        raise ValueError(f"--valid-mask {path}: expected one mask variable, found {names}")
    mask = mask_ds[names[0]]
    if "time" in mask.dims and mask.sizes["time"] == 1:
        mask = mask.isel(time=0, drop=True)
    rows, cols = horizontal_dims(ds)
    try:
        xr.align(mask, ds[rows], ds[cols], join="exact")
    except ValueError:
        raise ValueError(f"--valid-mask {path}: its grid does not match the input's") from None
    return mask


def summarise(fields: list[Field], source: str) -> None:
    """Fill in each field's mean, spread, observed and gap counts in one pass over the cube."""
    todo = []
    for f in fields:
        valid = xr.DataArray(f.valid, dims=f.data.dims[3 - f.valid.ndim:])
        observed = np.isfinite(f.data) & valid
        x = f.data.where(observed).astype(np.float64)
        todo.append((observed.sum(), x.sum(), (x**2).sum(), (~np.isfinite(f.data) & valid).sum()))
    (results,) = dask.compute(todo)
    for f, (n, s, s2, gaps) in zip(fields, results):
        n, s, s2 = int(n), float(s), float(s2)
        if n == 0:
            raise ValueError(f"--var {f.name}: no observed value inside the valid area of {source}")
        f.observed, f.gaps = n, int(gaps)
        f.mean = s / n
        f.spread = float(np.sqrt(max(s2 / n - f.mean**2, 0.0))) or 1.0
