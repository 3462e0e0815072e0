"""The cells an evaluation hides: a field's observed cells under real gaps, and how far each lies from what stays.

:func:`hide_cells` copies *real* gap patterns: a time step is masked with the gaps of another step
of the same cube (the one gap-borrowing rule, :func:`geonp.tasks.clouds.borrow_gaps`), so the
hidden cells have the sizes, shapes and coastal bias of the product's own clouds; a single scene
falls back to synthetic clouds. :func:`hide_under_mask` hides the cells under a cloud mask the user
gives instead (another product's, another day's). :func:`distance_to_context` is the distance from
each cell to the nearest cell a model still sees, for scores by distance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from geonp.metrics import distance_to_observed
from geonp.tasks.clouds import DONOR_GIVEN, borrow_gaps

MIN_OBSERVED = 50  # a step with fewer observed cells is too small to hide from and still fill
MIN_HIDDEN = 0.10  # a donor should hide at least this fraction of a step's observed cells


def hide_cells(
    da: xr.DataArray,
    valid: xr.DataArray | None,
    rng: np.random.Generator,
    *,
    max_hidden: float = 0.5,
    cover: float = 0.3,
    min_observed: int = MIN_OBSERVED,
    steps: Sequence[int] | None = None,
) -> tuple[xr.DataArray, xr.DataArray]:
    """Hide observed cells of ``da`` under real gap patterns of its other time steps.

    For each step ``t`` with at least ``min_observed`` observed cells (finite and valid), a donor
    step ``s != t`` is drawn with ``rng`` among those whose gaps (NaN and valid) would hide
    between 10% and ``max_hidden`` of ``t``'s observed cells, and ``t``'s observed cells under
    ``s``'s gaps are hidden. Without such a donor (one scene, a gap-free cube) the step gets
    ``random_clouds`` of ``cover`` instead, redrawn up to 10 times until it hides 10% to
    ``max_hidden`` of the observed cells (else the largest draw below ``max_hidden``).

    Args:
        da: the field, dims: the two horizontal ones (those of ``valid``; else ``lat``/``lon``,
            or the last two) and optionally ``time`` (any other dims count as steps too). May be
            dask-backed: it is computed once; it is never modified.
        valid: bool on the two horizontal dims, True where a value is possible; None: everywhere.
        rng: the randomness (donor choice, clouds); same state, same result.
        max_hidden: the largest fraction of a step's observed cells to hide, in (0, 1).
        cover: cloud fraction of the synthetic clouds, in (0, 1).
        min_observed: steps with fewer observed cells are left untouched.
        steps: hide cells in these steps only (C order over the non-horizontal dims); the others
            stay whole, as history, and lend their gaps. None: every step.

    Returns:
        ``(masked, hidden)``: a numpy-backed copy of ``da`` (float) with the hidden cells NaN, and
        a bool DataArray on ``da``'s dims, True at the hidden cells. ``hidden.attrs["geonp_donor"]``
        holds one int per step (steps in C order over the non-horizontal dims): the donor step,
        -1 for synthetic clouds, -2 for untouched.
    """
    if not 0.0 < max_hidden < 1.0:
        raise ValueError(f"max_hidden must be a fraction in (0, 1), got {max_hidden!r}")
    hdims = _horizontal_dims(da, valid)
    step_dims = [d for d in da.dims if d not in hdims]
    ordered = da.transpose(*step_dims, *hdims)
    # One compute, and always a fresh C-ordered float array: NaN must fit, the input must stay
    # intact, and the reshape below must be a view (a transposed copy in "K" order is not).
    values = np.array(ordered.values, dtype=np.result_type(ordered.dtype, np.float32), copy=True, order="C")
    ny, nx = values.shape[-2:]
    cube = values.reshape(-1, ny, nx)  # a view: writing NaN here writes into ``values``
    ok = np.ones((ny, nx), bool) if valid is None else np.asarray(valid.transpose(*hdims).values, dtype=bool)
    hidden, donors = borrow_gaps(np.isfinite(cube) & ok, ~np.isfinite(cube) & ok, rng,
                                 low=min(MIN_HIDDEN, max_hidden / 2), high=max_hidden, cover=cover,
                                 min_observed=min_observed, steps=steps)
    cube[hidden] = np.nan

    def wrap(data: np.ndarray, name: str, attrs: dict) -> xr.DataArray:
        out = xr.DataArray(data.reshape(values.shape), dims=ordered.dims, coords=ordered.coords, name=name,
                           attrs=attrs)
        return out.transpose(*da.dims)

    masked = wrap(values, da.name, dict(da.attrs))
    mask = wrap(hidden, f"{da.name}_hidden", {"long_name": "cell hidden for evaluation",
                                              "geonp_donor": donors})
    return masked, mask


def hide_under_mask(da: xr.DataArray, valid: xr.DataArray | None, under: xr.DataArray | np.ndarray,
                    name: str = "the dataset") -> tuple[xr.DataArray, xr.DataArray]:
    """Hide the observed cells of ``da`` that lie under the gaps of ``under``, as :func:`hide_cells` returns them.

    Args:
        da: the field (any dims; computed once, never modified).
        valid: bool on the two horizontal dims, True where a value is possible; None: everywhere.
        under: bool, True under a cloud: a DataArray aligned by dimension name with ``da``, or an
            array broadcastable to ``da``'s shape by position (e.g. ``[rows, cols]``).
        name: the data, for the error message.

    Returns:
        ``(masked, hidden)``; every step's donor is :data:`DONOR_GIVEN`.

    Raises:
        ValueError: a mask whose shape does not fit ``da``, or one that hides nothing.
    """
    if isinstance(under, xr.DataArray):  # by dimension name, then by position (coordinates may differ by rounding)
        missing = set(under.dims) - set(da.dims)
        if missing:
            raise ValueError(f"{name}: the hide-under mask has dims {sorted(map(str, missing))} that {da.name!r} lacks")
        ordered = under.transpose(*[d for d in da.dims if d in under.dims])
        under = ordered.values.reshape([under.sizes[d] if d in under.dims else 1 for d in da.dims])
    under = np.asarray(under)
    if under.dtype.kind not in "bi":  # a float mask's NaN would read as cloud
        raise ValueError(f"{name}: the hide-under mask must be boolean (True under a cloud), got {under.dtype}")
    under = under.astype(bool)
    try:
        cover = np.broadcast_to(under, da.shape)
    except ValueError:
        raise ValueError(f"{name}: a hide-under mask of shape {under.shape} does not fit {da.name!r} of shape "
                         f"{da.shape}") from None
    hdims = _horizontal_dims(da, valid)
    ok = np.ones(da.shape, bool)
    if valid is not None:  # Variables broadcast by dimension name, without aligning coordinates
        ok = (da.variable.copy(data=ok) & valid.variable.astype(bool)).transpose(*da.dims).values
    values = np.array(da.values, dtype=np.result_type(da.dtype, np.float32), copy=True)
    hidden = np.isfinite(values) & ok & cover
    if not hidden.any():
        raise ValueError(f"{name}: the hide-under mask covers no observed cell of {da.name!r}")
    values[hidden] = np.nan
    steps = int(np.prod([n for d, n in da.sizes.items() if d not in hdims]))
    masked = da.copy(data=values)
    mask = xr.DataArray(hidden, dims=da.dims, coords=da.coords, name=f"{da.name}_hidden",
                        attrs={"long_name": "cell hidden for evaluation", "geonp_donor": np.full(steps, DONOR_GIVEN)})
    return masked, mask


def _horizontal_dims(da: xr.DataArray, valid: xr.DataArray | None) -> tuple[str, str]:
    """``da``'s two horizontal dims, in ``da``'s order: ``valid``'s, else lat/lon, 2-D lat's, the last two."""
    if valid is not None:
        if valid.ndim != 2 or not set(valid.dims) <= set(da.dims):
            raise ValueError(f"the valid mask has dims {valid.dims}; it must be 2 of {da.name!r}'s {da.dims}")
        names = set(valid.dims)
    elif {"lat", "lon"} <= set(da.dims):
        names = {"lat", "lon"}
    elif "lat" in da.coords and da["lat"].ndim == 2:
        names = set(da["lat"].dims)
    else:
        if da.ndim < 2:
            raise ValueError(f"{da.name!r} has dims {da.dims}: it needs two horizontal dims")
        names = set(da.dims[-2:])
    return tuple(d for d in da.dims if d in names)  # type: ignore[return-value]


def distance_to_context(masked: xr.DataArray, valid: xr.DataArray) -> np.ndarray:
    """Distance from each cell to the nearest cell of its step that a model sees.

    Args:
        masked: the field with the hidden cells NaN (as :func:`hide_cells` returns it).
        valid: bool on the two horizontal dims, True where a value is possible.

    Returns:
        Distances in grid cells (0 at a seen cell), float, shaped and ordered as ``masked``'s dims.
    """
    hdims = _horizontal_dims(masked, valid)
    ordered = masked.transpose(*[d for d in masked.dims if d not in hdims], *hdims)
    # By position, as hide_cells does: xarray's alignment could drop cells whose coordinates differ by rounding.
    seen = np.isfinite(ordered.values) & np.asarray(valid.transpose(*hdims).values, dtype=bool)
    distance = xr.DataArray(distance_to_observed(seen), dims=ordered.dims)
    return distance.transpose(*masked.dims).values
