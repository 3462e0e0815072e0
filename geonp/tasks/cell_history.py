"""What a cell's own other steps say about it: persistence and climatology, per cell.

The simplest history covariates (:func:`geonp.tasks.history.history_covariates`): each looks at
one cell's time series alone, never at its neighbours, and never at the step it predicts, so a
model compares an observation with what the rest of its history says, as it must at a gap.
"""

from __future__ import annotations

import numpy as np

__all__ = ["nearest_steps", "other_steps_mean", "other_steps_spread"]


def nearest_steps(values: np.ndarray) -> np.ndarray:
    """Each cell at each step interpolated in time from its nearest *other* observed steps.

    ``values [T, R, C]`` (NaN at gaps) -> float64 ``[T, R, C]``: linear in the step index between
    the nearest observed step before and the nearest after; the one there is at either end; NaN
    where the cell is observed on no other step.
    """
    t_count = values.shape[0]
    seen = np.isfinite(values)
    before_v, before_t = np.full(values.shape, np.nan), np.full(values.shape, np.nan)
    after_v, after_t = np.full(values.shape, np.nan), np.full(values.shape, np.nan)
    last_v, last_t = np.full(values.shape[1:], np.nan), np.full(values.shape[1:], np.nan)
    for t in range(t_count):  # the latest observed step strictly before t
        before_v[t], before_t[t] = last_v, last_t
        last_v = np.where(seen[t], values[t], last_v)
        last_t = np.where(seen[t], t, last_t)
    last_v, last_t = np.full(values.shape[1:], np.nan), np.full(values.shape[1:], np.nan)
    for t in range(t_count - 1, -1, -1):  # the earliest observed step strictly after t
        after_v[t], after_t[t] = last_v, last_t
        last_v = np.where(seen[t], values[t], last_v)
        last_t = np.where(seen[t], t, last_t)
    steps = np.arange(t_count, dtype=np.float64)[:, None, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = (steps - before_t) / (after_t - before_t)  # 0 at the step before, 1 at the one after
    both = before_v + share * (after_v - before_v)
    return np.where(np.isfinite(both), both, np.where(np.isfinite(before_v), before_v, after_v))


def other_steps_mean(values: np.ndarray) -> np.ndarray:
    """Each cell at each step, the mean of its *other* observed steps: ``values [T, R, C]`` (NaN at
    gaps) -> float64 ``[T, R, C]``, NaN where the cell is observed on no other step."""
    seen = np.isfinite(values)
    total = np.where(seen, values, 0.0).sum(0)  # [R, C]
    count = seen.sum(0)  # [R, C]
    others = count[None] - seen  # [T, R, C]: the other steps holding the cell
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(others > 0, (total[None] - np.where(seen, values, 0.0)) / others, np.nan)


def other_steps_spread(values: np.ndarray) -> np.ndarray:
    """Each cell at each step, the standard deviation (ddof 0) of its *other* observed steps.

    ``values [T, R, C]`` (NaN at gaps) -> float64 ``[T, R, C]``, NaN where the cell is observed on
    fewer than two other steps. Beside ``mean`` in a kriging drift it lets a day's anomaly scale
    with how much each cell varies: ``a + b * mean + c * spread`` is the same standardised anomaly
    everywhere in a window, a warm day warmer where the cell swings more.
    """
    seen = np.isfinite(values)
    count = seen.sum(0)  # [R, C]
    with np.errstate(invalid="ignore", divide="ignore"):
        centre = np.where(count > 0, np.where(seen, values, 0.0).sum(0) / count, 0.0)  # [R, C]
    # Sums of the values less each cell's own mean: leaving one step out of them does not cancel
    # the large mean of, say, a temperature in kelvin.
    dev = np.where(seen, values - centre[None], 0.0)  # [T, R, C]
    s1, s2 = dev.sum(0), (dev**2).sum(0)  # [R, C]
    others = count[None] - seen  # [T, R, C]
    with np.errstate(invalid="ignore", divide="ignore"):
        m1 = (s1[None] - dev) / others
        var = (s2[None] - dev**2) / others - m1**2
    return np.where(others >= 2, np.sqrt(np.maximum(var, 0.0)), np.nan)
