"""Where a field can have values: the one rule infill, evaluate and ``open_satellite`` share.

A missing cell is a *gap* (something to fill) inside the valid area and *never valid* outside it
(land for SST, sea for land temperature, outside a swath). :func:`valid_area` decides, first
rule that applies:

1. a mask the user names (``valid_mask=`` / ``--valid-mask``): a variable of the data, a file
   (its one variable, or the one whose name contains "mask"), a ``(file, variable)`` pair or a
   DataArray on the same grid (for lat/lon grids, a larger grid holding it); values > 0.5 or
   True are valid, NaN is not. Or one of two words: ``observed`` (cells observed in at least one
   time step) or ``all`` (every cell);
2. the data's own ``valid`` variable: what ``open_satellite`` writes from the product's QC, a
   user's mask or, by default, the cells observed at least once over the product's time steps;
3. otherwise every cell: a plain cube (a reanalysis with a region missing in every step, say)
   has its holes filled unless a mask says they are land.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import xarray as xr

from geonp.data.cube import horizontal_dims, open_cube

MaskSpec = str | os.PathLike | tuple[str | os.PathLike, str] | xr.DataArray


def valid_area(ds: xr.Dataset, da: xr.DataArray, spec: MaskSpec | None = None,
               source: str = "the input") -> tuple[xr.DataArray, str]:
    """The valid area of field ``da`` of ``ds`` (where it may hold data), by geonp's one rule.

    Args:
        ds: the cube holding ``da`` (and maybe a ``valid`` variable or the named mask).
        da: the field.
        spec: the user's mask: a variable of ``ds``, a file, a ``(file, variable)`` pair or a
            DataArray (values > 0.5 are valid); ``"observed"`` (cells observed in some time
            step) or ``"all"``. None: ``ds["valid"]`` if present (what ``open_satellite``
            writes), else every cell.
        source: how to name the input in error messages.

    Returns:
        ``(mask, how)``: a bool DataArray on the horizontal dims in ``da``'s order (with a time
        dim too when a named mask varies in time; callers that need a static area reduce it
        with ``any``), and a phrase saying how it was decided (for the output's attributes).

    Raises:
        ValueError: one line naming ``source`` or the mask: a mask that cannot be found or is
            on another grid.
    """
    hdims = [d for d in da.dims if d in horizontal_dims(ds)]
    if isinstance(spec, str) and spec in ("observed", "all") and spec not in ds.variables:
        how = "observed at least once" if spec == "observed" else "every cell"
        mask = _observed(da, hdims) if spec == "observed" else xr.ones_like(da.isel(_first(da, hdims)), dtype=bool)
    elif spec is not None:
        mask, how = resolve_mask(ds, spec, source), f"valid_mask {describe(spec)}"
    elif "valid" in ds.variables:
        mask, how = ds["valid"], str(ds["valid"].attrs.get("geonp_valid_area", f"the 'valid' variable of {source}"))
    else:
        mask, how = xr.ones_like(da.isel(_first(da, hdims)), dtype=bool), "every cell (no valid mask given)"
    keep = [d for d in da.dims if d in mask.dims]
    extra = [d for d in mask.dims if d not in keep]
    mask = mask.any(extra) if extra else mask
    mask = mask.transpose(*keep)
    mask = mask if mask.dtype == bool else mask > 0.5
    return mask.drop_vars([c for c in mask.coords if c not in da.coords], errors="ignore"), how


def resolve_mask(ds: xr.Dataset, spec: MaskSpec, name: str) -> xr.DataArray:
    """The user's mask as bool on ``ds``'s horizontal grid (other dims kept; reduced by the caller)."""
    if isinstance(spec, xr.DataArray):
        mask, where = spec, "the valid_mask DataArray"
    elif isinstance(spec, tuple):
        mask, where = open_cube(spec[0], spec[1])[spec[1]], str(spec[0])
    elif isinstance(spec, str) and spec in ds.variables:
        mask, where = ds[spec], f"{name} variable {spec!r}"
    elif is_file(str(spec)):
        where = str(spec)
        mask = _pick_mask_variable(open_cube(spec), where)
    else:
        raise ValueError(f"{name}: valid mask {str(spec)!r} is neither a variable nor an existing file "
                         "(nor 'observed' or 'all')")
    mask = _on_grid(mask, ds, where, name)
    return mask if mask.dtype == bool else (mask > 0.5)  # NaN compares False: not valid


def is_file(spec: str) -> bool:
    return "://" in spec or Path(spec).exists()


def describe(spec: MaskSpec) -> str:
    if isinstance(spec, xr.DataArray):
        return f"DataArray {spec.name!r}"
    if isinstance(spec, tuple):
        return f"{spec[1]!r} of {spec[0]}"
    return repr(str(spec))


def _first(da: xr.DataArray, hdims: list[str]) -> dict[str, int]:
    return {d: 0 for d in da.dims if d not in hdims}


def _observed(da: xr.DataArray, hdims: list[str]) -> xr.DataArray:
    others = [d for d in da.dims if d not in hdims]
    finite = np.isfinite(da)
    return finite.any(others) if others else finite


def _pick_mask_variable(mds: xr.Dataset, where: str) -> xr.DataArray:
    hdims = set(horizontal_dims(mds))
    names = [str(v) for v in mds.data_vars if hdims <= set(mds[v].dims)]
    if len(names) > 1:
        names = [v for v in names if "mask" in v.lower()] or names
    if len(names) != 1:
        raise ValueError(f"{where}: cannot tell which variable is the mask ({', '.join(names) or 'none'}); "
                         "pass valid_mask=(path, variable)")
    return mds[names[0]]


def _on_grid(mask: xr.DataArray, ds: xr.Dataset, where: str, name: str) -> xr.DataArray:
    """``mask`` on ``ds``'s horizontal grid: the same grid, or a larger grid holding it (regular grids)."""
    hdims = horizontal_dims(ds)
    if not set(hdims) <= set(mask.dims):
        raise ValueError(f"{name}: the mask from {where} has dims {mask.dims}, not the grid's {hdims}")
    if hdims == ("lat", "lon"):
        mask = mask.sortby(list(hdims))  # a user's DataArray may run north to south
        index = {}
        for axis in hdims:
            target, source = ds[axis].values.astype(float), mask[axis].values.astype(float)
            step = float(np.median(np.diff(target))) if target.size > 1 else 1.0
            nearest = _nearest(source, target)
            if np.any(np.abs(source[nearest] - target) > 1e-3 * step):
                raise ValueError(f"{name}: the mask from {where} is not on the same grid ({axis} "
                                 f"{source.min():g}..{source.max():g} vs {target.min():g}..{target.max():g}, "
                                 f"{source.size} vs {target.size} points)")
            index[axis] = nearest
        return mask.isel(index).assign_coords({a: ds[a] for a in hdims})
    same = all(mask.sizes[d] == ds.sizes[d] for d in hdims) and all(
        np.allclose(mask[d].values, ds[d].values) for d in hdims if d in mask.coords and d in ds.coords)
    if not same:
        raise ValueError(f"{name}: the mask from {where} is not on the same grid "
                         f"({dict(mask.sizes)} vs {dict(ds.sizes)})")
    return mask.drop_vars([c for c in mask.coords if c not in hdims], errors="ignore")


def _nearest(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Index of the nearest ``source`` value (ascending) to each ``target`` value."""
    if source.size == 1:
        return np.zeros(target.size, dtype=int)
    i = np.clip(np.searchsorted(source, target), 1, source.size - 1)
    return np.where(target - source[i - 1] <= source[i] - target, i - 1, i)
