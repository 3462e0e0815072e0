"""The output in the input's own layout: its dimension names and order, coordinates and attributes.

geonp fills a cube in its working convention (:mod:`geonp.data.cube`: ``(time, lat, lon)``,
latitude ascending, longitude in [-180, 180), a time axis even for one scene). A user aligns the
result with the file they gave, so :func:`restore_layout` maps each output layer back:

* a dimension gets the input's name again (``latitude``, ``valid_time``, a projected ``y``);
* a reversed axis (ERA5's latitude runs north to south) or a longitude rolled from 0..360 is
  put back in the input's order, matched by coordinate value (so a repeated wrap column of a
  global grid is repeated again);
* a time axis the input did not have is removed (a scalar time coordinate comes back as it was);
* every input coordinate on the output's dimensions comes back with its values, attributes and
  time encoding (``valid_time``, ERA5's ``number``, 2-D lat/lon of a projected grid), and so do
  the variables CF ties to them (bounds such as ``time_bnds`` and ``vertices_latitude``, the grid
  mapping, cell measures and auxiliary coordinates a layer names); coordinates of the working
  cube the input did not have (an elevation input) are dropped;
* global attributes are the input's, every one as it was, then geonp's provenance under ``geonp_``
  names (``history`` gains a line at the top; ``title`` only where the input has none).
  ``Conventions`` names the CF version geonp writes (the input's, when it differs, is kept as
  ``geonp_input_conventions``), and a ``bounds`` attribute whose variable the input did not
  carry through (HadISST's ``time`` names a ``time_bnds`` that a one-variable read leaves
  behind) is dropped rather than left pointing at nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import xarray as xr

from geonp.data.cube import cf_references
from geonp.fill.output import SAMPLE_DIM, coordinate_encoding
from geonp.tasks.windows import STATIC_STEP

#: Suffixes of the layers beside each filled variable.
_LAYERS = ("", "_std", "_flag", "_sample")


def restore_layout(out: xr.Dataset, like: xr.Dataset, renamed: Mapping[str, str]) -> xr.Dataset:
    """``out`` (layers ``v``, ``v_std``, ``v_flag`` in the working convention) in ``like``'s layout.

    Args:
        out: the filled layers on the cube's dimensions (e.g. ``[time, lat, lon]``).
        like: the input as the user gave it (before :func:`geonp.data.cube.to_convention`).
        renamed: ``{convention name: the input's name}`` (:func:`geonp.data.cube.renamed_from`).

    Returns:
        A Dataset whose layers have the input variable's dimensions (names and order) and whose
        coordinates and global attributes are the input's, plus ``out``'s provenance attributes.

    Raises:
        ValueError: an output coordinate cannot be matched to the input's (not expected for an
            output of this input).
    """
    layers, bases = {}, set()
    for name in out.data_vars:
        base = next((str(name)[: -len(s)] for s in _LAYERS[1:] if str(name).endswith(s)), str(name))
        if base not in like.data_vars:
            raise ValueError(f"{base!r} is not a variable of the input")
        layers[name] = _as_input(out[name], like[base], like, renamed)
        bases.add(base)
    result = xr.Dataset(layers)
    dims = set(result.dims)
    result = result.assign_coords({c: _input_coordinate(like[c]) for c in like.coords
                                   if set(like[c].dims) <= dims and c not in result.data_vars})
    for name in _companions(like, sorted(bases), list(result.coords)):
        if name not in result.variables:
            result[name] = _input_coordinate(like[name])
    _drop_dangling_bounds(result)
    result.attrs = _global_attributes(like.attrs, out.attrs)
    return result


def _drop_dangling_bounds(ds: xr.Dataset) -> None:
    """Remove, in place, ``bounds`` attributes that name a variable ``ds`` does not hold (CF
    requires the named variable to exist; a reader that follows it would fail)."""
    for var in ds.variables.values():
        for where in (var.attrs, var.encoding):
            if where.get("bounds") and str(where["bounds"]) not in ds.variables:
                del where["bounds"]


def _companions(like: xr.Dataset, layers: list[str], coords: list[str]) -> list[str]:
    """Input variables that CF ties to the output's layers or coordinates, which travel with them:
    a coordinate's ``bounds`` (``time_bnds``, ``lat_bnds``, ``vertices_latitude``, and their own
    bounds in turn), and what a layer names in ``grid_mapping``, ``cell_measures`` or ``coordinates``."""
    found: list[str] = []
    todo = list(coords) + [name for layer in layers for name in cf_references(like[layer])]
    seen = set()
    while todo:
        name = todo.pop(0)
        if name in seen or name not in like.variables:
            continue
        seen.add(name)
        if name not in coords:
            found.append(name)
        todo += cf_references(like[name])
    return found


def _as_input(layer: xr.DataArray, source: xr.DataArray, like: xr.Dataset, renamed: Mapping[str, str]) -> xr.DataArray:
    """One layer with ``source``'s dimension names, order and coordinate order."""
    layer = layer.reset_coords(drop=True)
    for dim in list(layer.dims):
        if dim == SAMPLE_DIM:  # the samples' own dimension, which the input has not: kept first
            continue
        target = _input_dim(str(dim), source, like, renamed)
        if target is None:  # a time axis the working cube added to a single scene
            if layer.sizes[dim] != 1:
                raise ValueError(f"{layer.name!r}: the output's {dim!r} has {layer.sizes[dim]} steps, the input none")
            layer = layer.isel({dim: 0}, drop=True)
            continue
        # Only the horizontal axes are ever reordered (flipped, rolled) by the working convention;
        # time, levels and members keep the input's order, whatever their values (NaN included).
        order = _order(layer, str(dim), like, target, renamed) if dim in ("lat", "lon") else None
        if order is not None:
            layer = layer.isel({dim: order})
        if dim != target:
            layer = layer.rename({dim: target})
    # The working coordinates go (the input's come back whole in restore_layout).
    layer = layer.drop_vars(list(layer.coords))
    first = [SAMPLE_DIM] if SAMPLE_DIM in layer.dims else []
    return layer.transpose(*first, *[d for d in source.dims if d in layer.dims], ...)


def _input_dim(dim: str, source: xr.DataArray, like: xr.Dataset, renamed: Mapping[str, str]) -> str | None:
    """The input's dimension for the working dimension ``dim``; None for an added time axis."""
    if dim in source.dims:
        return dim
    name = renamed.get(dim, dim)
    if name in source.dims:
        return name
    if name in like.variables and like[name].ndim == 1 and like[name].dims[0] in source.dims:
        return str(like[name].dims[0])  # e.g. 1-D lat on a dimension called y
    if dim in ("time", STATIC_STEP):
        return None
    raise ValueError(f"{source.name!r}: cannot find the input's dimension for the output's {dim!r}")


def _order(layer: xr.DataArray, dim: str, like: xr.Dataset, target: str,
           renamed: Mapping[str, str]) -> np.ndarray | None:
    """Positions along the working ``dim`` of each of the input's cells along ``target`` (None: same order)."""
    here = _working_values(layer, dim)
    name = renamed.get(dim, dim)
    there = like[name] if name in like.variables and like[name].ndim == 1 else like.coords.get(target)
    if here is None or there is None or there.dims != (target,):
        return None
    values = np.asarray(there.values)
    if not (np.issubdtype(values.dtype, np.number) and np.issubdtype(here.dtype, np.number)):
        positions = pd.Index(here).get_indexer(values)
        if (positions < 0).any():
            raise ValueError(f"cannot match the output's {dim!r} to the input's {target!r} "
                             f"(e.g. {values[positions < 0][0]!r})")
        return None if np.array_equal(positions, np.arange(here.size)) else positions
    values, here = values.astype(float), here.astype(float)
    spacing = np.median(np.abs(np.diff(here))) if here.size > 1 else 1.0
    # Longitudes as the input has them, or as the working cube may have made them (wrapped to
    # [-180, 180), or 0..360 to keep a grid across the antimeridian contiguous).
    for candidate in ([values, (values + 180.0) % 360.0 - 180.0, values % 360.0] if dim == "lon" else [values]):
        positions = _nearest(here, candidate)
        if np.all(np.abs(here[positions] - candidate) <= 1e-3 * spacing):
            return None if np.array_equal(positions, np.arange(here.size)) else positions
    raise ValueError(f"cannot match the output's {dim!r} to the input's {target!r}")


def _working_values(layer: xr.DataArray, dim: str) -> np.ndarray | None:
    return np.asarray(layer[dim].values) if dim in layer.coords and layer[dim].dims == (dim,) else None


def _nearest(axis: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index into ``axis`` (monotonic, ascending or descending) of its nearest cell to each of ``values``."""
    if axis.size == 1:
        return np.zeros(values.shape, int)
    order = np.argsort(axis, kind="stable")
    ascending = axis[order]
    right = np.clip(np.searchsorted(ascending, values), 1, axis.size - 1)
    left = right - 1
    return order[np.where(np.abs(ascending[right] - values) < np.abs(ascending[left] - values), right, left)]


def _input_coordinate(coord: xr.DataArray) -> xr.DataArray:
    """An input coordinate as it was, with only the encoding that says how it is stored."""
    out = coord.reset_coords(drop=True).copy()
    out.encoding = coordinate_encoding(coord)
    return out


def _global_attributes(given: Mapping, provenance: Mapping) -> dict:
    """Every global attribute of the input as it was, then geonp's: ``geonp_*`` ones, the
    ``Conventions`` geonp writes to (the input's kept as ``geonp_input_conventions`` when it
    differs), a ``title`` where the input has none, and this run's ``history`` line above the input's."""
    attrs = {k: v for k, v in given.items() if not str(k).startswith("geonp_")}
    for key, value in provenance.items():
        if key == "history" and given.get("history"):
            attrs["history"] = f"{value}\n{given['history']}"
        elif key == "Conventions":
            if given.get("Conventions") and given["Conventions"] != value:
                attrs["geonp_input_conventions"] = given["Conventions"]
            attrs[key] = value
        elif str(key).startswith("geonp_") or key not in attrs:
            attrs[key] = value
    return attrs
