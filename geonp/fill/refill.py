"""The days being filled, filled once more with some of their own observed cells hidden: the
second source of errors sigma calibration fits (:mod:`geonp.fill.calibrate`).

The calibration windows hide a scene's observed cells inside small windows; what they miss is how
a clouded day departs from its history as a whole (history_cv's Alboran test steps: 90% coverage
0.63 beyond 12 cells, 0.95 at the scale fitted on the truths). So up to :data:`MAX_STEPS` of each
field's gappy steps get their observed cells hidden once more under other steps' real gaps
(:func:`geonp.tasks.hidden.hide_cells`, at most half of a step's cells; a third of the stack at a
time, the rest staying as history), the history covariates are computed again without them, and
the prepared model fills those steps. The truths of the hidden cells are known, so their
standardised errors ``z = (y - mean) / sigma`` say how wide sigma should be on these very days.

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
#: Rounds the chosen steps are refilled in (step index modulo this): a round hides cells in at most
#: a third of the stack, so a hidden cell keeps its history. Hiding every gappy step at once took
#: a hidden cell's other days with it: on ESA CCI soil moisture (5 days, all gappy) the scales came
#: out 1.1-2.6 where the validation split's own hidden days needed 0.7-1.3.
ROUNDS = 3


def refill_errors(p: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standardised errors ``z [n]``, distance-bin indices ``[n]`` (:data:`geonp.metrics.DISTANCE_BINS`,
    cells to the nearest observation of the same step) and weights ``[n]`` of the plan's fields'
    gappy steps, their observed cells hidden once more and filled by ``p.choice.model`` (see the
    module docstring). A refilled cell's weight is the number of its step's real gap cells it stands
    for, scaled to average 1 over a field: a mostly clouded day counts for more than a day with a
    few gaps (ESA CCI soil moisture, validation: the four days with only their own gaps wanted
    scales of 1.2-2.2, the two clouded days being scored 0.7-1.1).

    Fields with no gap, or larger than the history covariates' bound
    (:data:`geonp.tasks.history.MAX_HISTORY_CELLS`, read whole here), give none.
    """
    rng = np.random.default_rng([p.seed, 7919])
    parts = [_field_errors(p, f, rng) for f in p.fields
             if f.gaps and f.observed and int(np.prod(f.shape)) <= MAX_HISTORY_CELLS]
    if not parts:
        return np.empty(0), np.empty(0, int), np.empty(0)
    return tuple(np.concatenate(arrays) for arrays in zip(*parts, strict=True))  # type: ignore[return-value]


def _field_errors(p: Plan, f: Field, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`refill_errors` of one field: its chosen steps refilled in :data:`ROUNDS` rounds."""
    values = f.whole()  # [T, R, C], +-inf as NaN
    valid = f.valid if f.valid.ndim == 2 else f.valid.any(0)  # hide_cells takes a horizontal mask
    gaps = (~np.isfinite(values) & valid).sum((1, 2))  # [T] the cells the fill fills, per step
    gappy = np.flatnonzero(gaps)
    chosen = np.sort(rng.choice(gappy, size=min(MAX_STEPS, gappy.size), replace=False))
    zs, bins, steps_of = [], [], []
    for r in range(ROUNDS):
        steps = chosen[chosen % ROUNDS == r]
        if steps.size:
            z, b, t = _round_errors(p, f, values, valid, steps, rng)
            zs.append(z)
            bins.append(b)
            steps_of.append(t)
    z, b, t = np.concatenate(zs), np.concatenate(bins), np.concatenate(steps_of)
    weight = gaps[t] / np.bincount(t, minlength=gaps.size)[t]  # the gap cells each refilled cell stands for
    return z, b, weight / weight.mean() if weight.size else weight


def _round_errors(p: Plan, f: Field, values: np.ndarray, valid: np.ndarray, steps: np.ndarray,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Errors, distance bins and steps of one round's refilled cells: ``steps`` of
    ``values [T, R, C]`` (``valid [R, C]``) hidden once more and filled, every other step as it is."""
    dims = f.data.dims
    horizontal = xr.DataArray(valid, dims=dims[1:])
    masked, hidden = hide_cells(xr.DataArray(values, dims=dims), horizontal, rng, steps=steps.tolist())
    hide = hidden.values
    if not hide.any():
        return np.empty(0), np.empty(0, int), np.empty(0, int)
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
    distance = distance_to_context(masked, horizontal)[hide]
    ok = np.isfinite(z)
    return z[ok], distance_bin(distance[ok]), np.nonzero(hide)[0][ok]
