"""The days being filled, filled once more with some of their own observed cells hidden: the
second source of errors sigma calibration fits (:mod:`geonp.fill.calibrate`).

The calibration windows hide a scene's observed cells inside small windows; what they miss is how
a clouded day departs from its history as a whole (history_cv's Alboran test steps: 90% coverage
0.63 beyond 12 cells, 0.95 at the scale fitted on the truths). So each field's gappy steps get
their observed cells hidden once more under other steps' real gaps (:func:`geonp.tasks.hidden.hide_cells`,
at most half of a step's cells), the history covariates are computed again without them, and the
prepared model fills those steps: the truths of the hidden cells are known, so their standardised
errors ``z = (y - mean) / sigma`` say how wide sigma should be on these very days
(``python -m pipelines.experiments.sigma_shape``: pooled with the windows' errors, the scales
lowered validation CRPS 0.19% and put 18 of 23 distance bins in 0.85-0.95 against 16).

The model is the one fine-tuned on the whole cube, which saw these cells as observations for its
few fine-tuning steps; fine-tuning again per calibration would double its cost for a scale.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from geonp.fill.blocks import fill_block
from geonp.fill.field import Field
from geonp.fill.plan import Plan
from geonp.fill.stack import add_history
from geonp.metrics import distance_bin
from geonp.tasks.hidden import distance_to_context, hide_cells
from geonp.tasks.history import MAX_HISTORY_CELLS

#: Gappy steps refilled per field at most (drawn at random): bounds the cost on a long stack to
#: that of filling this many steps once more.
MAX_STEPS = 8


def refill_errors(p: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Standardised errors ``z [n]`` and distance-bin indices ``[n]`` (:data:`geonp.metrics.DISTANCE_BINS`,
    cells to the nearest observation of the same step) of the plan's fields' gappy steps, their
    observed cells hidden once more and filled by ``p.choice.model`` (see the module docstring).

    Fields with no gap, or larger than the history covariates' bound
    (:data:`geonp.tasks.history.MAX_HISTORY_CELLS`, read whole here), give none.
    """
    rng = np.random.default_rng([p.seed, 7919])
    zs, bins = [], []
    for f in p.fields:
        if f.gaps == 0 or f.observed == 0 or int(np.prod(f.shape)) > MAX_HISTORY_CELLS:
            continue
        z, b = _field_errors(p, f, rng)
        zs.append(z)
        bins.append(b)
    if not zs:
        return np.empty(0), np.empty(0, int)
    return np.concatenate(zs), np.concatenate(bins)


def _field_errors(p: Plan, f: Field, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """:func:`refill_errors` of one field."""
    values = f.whole()  # [T, R, C], +-inf as NaN
    valid = f.valid if f.valid.ndim == 2 else f.valid.any(0)  # hide_cells takes a horizontal mask
    gappy = np.flatnonzero((~np.isfinite(values) & valid).any((1, 2)))
    steps = np.sort(rng.choice(gappy, size=min(MAX_STEPS, gappy.size), replace=False))
    dims = f.data.dims
    masked, hidden = hide_cells(xr.DataArray(values, dims=dims), xr.DataArray(valid, dims=dims[1:]), rng,
                                steps=steps.tolist())
    hide = hidden.values
    if not hide.any():
        return np.empty(0), np.empty(0, int)
    again = Field(f.name, masked, f.valid, f.index, f.mean, f.spread,
                  observed=f.observed - int(hide.sum()), gaps=f.gaps + int(hide.sum()))
    if p.choice.covariates:
        add_history(again, p.choice.covariates, p.seed)  # blind to the hidden cells, as a real gap's are
    mean = np.full(values.shape, np.nan)
    std = np.full(values.shape, np.nan)
    rows, cols = slice(0, f.shape[1]), slice(0, f.shape[2])
    for t in np.flatnonzero(hide.any((1, 2))):
        key = (slice(t, t + 1), rows, cols)
        r = fill_block(again, key, p.choice.model, p.spec_for(again), p.elevation, p.device, p.batch_size, p.seed)
        mean[t], std[t] = r.value[0], r.std[0]
    z = (values[hide] - mean[hide]) / std[hide]
    distance = distance_to_context(masked, xr.DataArray(valid, dims=dims[1:]))[hide]
    ok = np.isfinite(z)
    return z[ok], distance_bin(distance[ok])
