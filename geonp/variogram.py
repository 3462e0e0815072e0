"""Variograms of gridded scenes: the experimental variogram from every pair of observed cells
along a scene's rows, columns and diagonals, PyKrige's variogram families fitted to it, and the
nugget share a scene's fit gives each of a field's steps (of what a linear drift leaves of them,
:func:`drift_residuals`, where there is one).

The kriging baselines (:mod:`geonp.models.field_kriging`, :mod:`geonp.models.kriging`) fit their
variograms here, and so does the ``nugget`` covariate (:mod:`geonp.tasks.history`), which hands a
scene's own nugget to te-pt-tnp's local kriging head: a low layer, importing nothing of geonp.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares

MIN_NUGGET = 1e-4  # standardised; without a nugget, Gaussian variograms give singular kriging systems
#: Observed cells a scene needs for its own variogram; sparser scenes get the field's spread.
MIN_SCENE_POINTS = 30


def fit_binned(lag: np.ndarray, gam: np.ndarray, cnt: np.ndarray, model: str, extent: float) -> list[float]:
    """Fit PyKrige's ``model`` variogram to an experimental one: mean lag ``lag``, semivariance
    ``gam`` and pair count ``cnt`` per bin (``[B]`` each); ``extent`` bounds the range (4x)."""
    from pykrige.ok import OrdinaryKriging

    func = OrdinaryKriging.variogram_dict[model]
    w = np.sqrt(cnt)
    top = max(gam.max(), 2 * MIN_NUGGET)
    if model == "linear":
        x0, lo, hi = [top / lag.max(), gam.min()], [0.0, MIN_NUGGET], [np.inf, top]
    else:
        x0 = [top - gam.min(), lag.max() / 2, gam.min()]
        lo, hi = [0.0, 1e-6 * lag.max(), MIN_NUGGET], [10 * top, 4 * extent, top]
    x0 = np.clip(x0, lo, hi)
    # Pair-count weighted least squares, then Cressie's (1985) weights N_h / gamma^2, which trust
    # the short lags more. PyKrige's own fit (6 unweighted lags up to the largest distance) missed
    # short-range structure: up to 3x the RMSE on 30 x 30 sinusoid fields, singular Gaussian fits.
    m = least_squares(lambda p: w * (func(p, lag) - gam), x0, bounds=(lo, hi)).x
    m = least_squares(lambda p: w * (gam / func(p, lag) - 1.0), m, bounds=(lo, hi)).x
    return [float(v) for v in m]


def grid_semivariance(values: np.ndarray, max_lag: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The experimental variogram of a gridded scene from every pair of observed cells along its
    rows, columns and both diagonals, ``1..max_lag`` steps apart (``values [R, C]``, NaN missing).

    Returns ``(lag, semivariance, pairs)`` per distinct distance in cells, those with pairs only.
    Every pair counts, the short lags most of all, which a random sample of points misses (on a
    1-degree global SST scene, 2000 random cells left the first bin 0-10 cells wide and the nugget
    three times too large).
    """
    rows, cols = values.shape
    lags, gams, counts = [], [], []
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        for k in range(1, max_lag + 1):
            r, c = k * dr, k * dc
            if r >= rows or abs(c) >= cols:
                break
            a = values[: rows - r, max(0, -c): cols - max(0, c)]  # cell (i, j) ...
            b = values[r:, max(0, c): cols - max(0, -c)]  # ... and cell (i + r, j + c)
            diff = (a - b)[np.isfinite(a) & np.isfinite(b)]
            if diff.size:
                lags.append(k * np.hypot(dr, dc))
                gams.append(0.5 * float(np.mean(diff**2)))
                counts.append(diff.size)
    # One bin per distinct distance: rows and columns (and the two diagonals) pooled by pair count.
    distinct, which = np.unique(np.round(lags, 9), return_inverse=True)
    cnt = np.bincount(which, counts, len(distinct))
    gam = np.bincount(which, np.array(gams) * np.array(counts), len(distinct)) / np.maximum(cnt, 1)
    return distinct, gam, cnt


def fit_grid_variogram(values: np.ndarray, variogram_model: str, max_lag: int = 64) -> list[float] | None:
    """The ``variogram_model`` variogram ``[partial sill, range, nugget]`` (range in cells) fitted to
    every pair of observed cells of ``values [R, C]`` (NaN missing) along its rows, columns and
    diagonals up to ``max_lag`` cells apart (:func:`grid_semivariance`, :func:`fit_binned`); None
    when fewer than three distances have pairs."""
    # Degenerate fits overflow or divide by zero; the parameters are bounded anyway. numpy's errstate,
    # not warnings.catch_warnings: history folds fit on several threads at once, and catch_warnings
    # swaps the whole process's filters (overlapping threads left them silenced for good).
    with np.errstate(all="ignore"):
        lag, gam, cnt = grid_semivariance(values, max_lag)
        if len(lag) < 3:
            return None
        return fit_binned(lag, gam, cnt, variogram_model, float(max(values.shape)))


def step_variograms(values: np.ndarray, valid: np.ndarray | None = None,
                    max_lag: int = 64) -> list[tuple[int, float, list[float]] | None]:
    """The exponential variogram fitted to each step of ``values [T, R, C]`` (NaN missing;
    ``valid [R, C]`` or ``[T, R, C]``, None: everywhere), standardised per step as the ``kriging``
    baseline fits it: per step ``(observed cells, s.d., [partial sill, range in cells, nugget])``
    (sill and nugget in units of the step's variance), None for a step with fewer than
    :data:`MIN_SCENE_POINTS` observed cells or too few lags to fit."""
    values = np.asarray(values, np.float64)
    ok = np.ones(values.shape, bool) if valid is None else np.broadcast_to(np.asarray(valid, bool), values.shape)
    fits: list[tuple[int, float, list[float]] | None] = []
    for t, step in enumerate(values):
        seen = np.isfinite(step) & ok[t]
        params = None
        if seen.sum() >= MIN_SCENE_POINTS:
            scale = float(step[seen].std()) or 1.0
            params = fit_grid_variogram(np.where(seen, (step - step[seen].mean()) / scale, np.nan), "exponential",
                                        max_lag)
        fits.append(None if params is None else (int(seen.sum()), scale, params))
    return fits


def step_nugget_shares(values: np.ndarray, valid: np.ndarray | None = None, max_lag: int = 64) -> np.ndarray:
    """The nugget's share of the variance, ``nugget / (partial sill + nugget)``, of each step's
    :func:`step_variograms` fit (same arguments).

    A share near 0 says the scene is smooth at the grid's scale (a neighbour one cell away is a
    near-copy), near 1 that a cell's own noise or microscale dominates. Returns ``float64 [T]``,
    NaN for a step with fewer than :data:`MIN_SCENE_POINTS` observed cells or too few lags to fit.
    """
    return np.array([np.nan if fit is None else fit[2][2] / (fit[2][0] + fit[2][2])
                     for fit in step_variograms(values, valid, max_lag)], np.float64)


def drift_residuals(values: np.ndarray, observed: np.ndarray, drifts: np.ndarray) -> np.ndarray:
    """What a linear drift on ``drifts [P, T, R, C]`` leaves of each step of ``values [T, R, C]``
    at its ``observed`` cells (NaN elsewhere): per step, the least-squares fit of the observed
    values on ``[1, drifts]`` subtracted. With no drift (``P = 0``), too few observed cells (under
    ten per coefficient) or a singular fit, the step's mean is subtracted instead. Kriging with an
    external drift needs the covariance of these residuals, not of the field: where the history
    explains a day, what is left is rougher (NDVI) or smoother than the day itself."""
    out = np.full(values.shape, np.nan)
    for t in range(len(values)):
        seen = observed[t]
        y = values[t][seen]
        if y.size == 0:
            continue
        design = np.column_stack([np.ones(y.size), *(d[t][seen] for d in drifts)])
        fitted = np.full(y.size, y.mean())
        if len(drifts) and y.size >= 10 * design.shape[1]:
            coef, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
            if rank == design.shape[1]:
                fitted = design @ coef
        out[t][seen] = y - fitted
    return out
