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
#: Cells of a stack whose semivariances are computed in one pass (each pass holds a few arrays this large).
STACK_CELLS = 1 << 22


def fit_binned(lag: np.ndarray, gam: np.ndarray, cnt: np.ndarray, model: str, extent: float) -> list[float]:
    """Fit PyKrige's ``model`` variogram to an experimental one: mean lag ``lag``, semivariance
    ``gam`` and pair count ``cnt`` per bin (``[B]`` each); ``extent`` bounds the range (4x)."""
    from pykrige.ok import OrdinaryKriging

    func = OrdinaryKriging.variogram_dict[model]
    w = np.sqrt(cnt)
    if model == "linear":
        top = max(gam.max(), 2 * MIN_NUGGET)
        x0, lo, hi = [top / lag.max(), gam.min()], [0.0, MIN_NUGGET], [np.inf, top]
        x0 = np.clip(x0, lo, hi)
    else:
        x0, lo, hi = (a[0] for a in _start(lag[None], gam[None], cnt[None], extent))
    # Pair-count weighted least squares, then Cressie's (1985) weights N_h / gamma^2, which trust
    # the short lags more. PyKrige's own fit (6 unweighted lags up to the largest distance) missed
    # short-range structure: up to 3x the RMSE on 30 x 30 sinusoid fields, singular Gaussian fits.
    m = least_squares(lambda p: w * (func(p, lag) - gam), x0, bounds=(lo, hi)).x
    m = least_squares(lambda p: w * (gam / func(p, lag) - 1.0), m, bounds=(lo, hi)).x
    return [float(v) for v in m]


def _start(lag: np.ndarray, gam: np.ndarray, cnt: np.ndarray, extent: float) -> tuple[np.ndarray, ...]:
    """``(start, lower, upper)``, each ``[S, 3]``, of ``[partial sill, range, nugget]`` for ``S``
    experimental variograms (``[S, B]`` each, ``cnt`` 0 at padding): the sill from the largest
    semivariance, the nugget from the smallest, the range half the largest lag (at most 4 ``extent``)."""
    real = cnt > 0
    top = np.maximum(np.where(real, gam, -np.inf).max(1), 2 * MIN_NUGGET)
    low = np.where(real, gam, np.inf).min(1)
    far = np.where(real, lag, -np.inf).max(1)
    lower = np.stack([np.zeros_like(top), 1e-6 * far, np.full_like(top, MIN_NUGGET)], 1)
    upper = np.stack([10 * top, np.full_like(top, 4 * extent), top], 1)
    return np.clip(np.stack([top - low, far / 2, low], 1), lower, upper), lower, upper


def fit_exponential_many(lag: np.ndarray, gam: np.ndarray, cnt: np.ndarray, extent: float) -> np.ndarray:
    """:func:`fit_binned`'s exponential fit of many experimental variograms at once: the distances
    ``lag [L]`` and each variogram's semivariance and pairs ``[S, L]`` (:func:`grid_semivariance` of a
    stack; a distance without pairs weighs nothing, and each variogram needs pairs at three distances
    or more, as :func:`step_variograms` sees to); ``extent`` bounds the range (4x). Returns
    ``[S, 3]``: ``[partial sill, range, nugget]`` per variogram.

    The same two weighted least-squares fits from the same start, by a Levenberg-Marquardt of all
    variograms together (the range as its logarithm, moved by at most a factor e a step, so that a
    step cannot leap to a vanishing range, a pure-nugget fit the trust region of SciPy's fit never
    reaches). On the 744 hourly steps of fill_speed's ERA5 cube the nugget shares agree with
    SciPy's fits to 2.7e-5 (median 1e-12; the largest where SciPy stops early along a flat
    valley); the fits take 0.24 s against 3.6 s (SciPy's ``least_squares`` is Python a step), and
    :func:`step_variograms` with the stack's semivariances 0.46 s against 5.3 s (Intel Xeon).
    """
    lag = np.broadcast_to(lag, gam.shape)
    start, lower, upper = _start(lag, gam, cnt, extent)
    to_q = lambda p: np.stack([p[:, 0], np.log(p[:, 1]), p[:, 2]], 1)  # noqa: E731
    w = np.sqrt(cnt)

    def model(q: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The exponential variogram ``[n, B]`` and its derivatives by ``q`` ``[n, B, 3]`` of ``rows``."""
        distance, range_ = lag[rows], np.exp(q[:, 1:2])
        decay = np.exp(-3.0 * distance / range_)
        value = q[:, 0:1] * (1.0 - decay) + q[:, 2:3]
        slope = -q[:, 0:1] * decay * 3.0 * distance / range_  # by log range
        return value, np.stack([1.0 - decay, slope, np.ones_like(decay)], -1)

    def counted(q, rows):  # pair-count weights
        value, d = model(q, rows)
        return w[rows] * (value - gam[rows]), w[rows][..., None] * d

    def cressie(q, rows):  # Cressie's weights
        value, d = model(q, rows)
        return w[rows] * (gam[rows] / value - 1.0), (-w[rows] * gam[rows] / value**2)[..., None] * d

    q = _levenberg_marquardt(counted, to_q(start), to_q(lower), to_q(upper))
    q = _levenberg_marquardt(cressie, q, to_q(lower), to_q(upper))
    return np.stack([q[:, 0], np.exp(q[:, 1]), q[:, 2]], 1)


def _levenberg_marquardt(residuals, q: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                         max_steps: int = 200) -> np.ndarray:
    """Bounded least squares of many variogram fits at once: ``residuals(q [n, 3], rows [n])`` gives
    ``(r [n, B], dr/dq [n, B, 3])`` of the problems ``rows``; ``q [S, 3]`` (the second the log range,
    which a step moves by at most 1) starts within ``lower`` and ``upper``. A parameter at a bound
    its gradient pushes against stays out of the step (projected Levenberg-Marquardt, Marquardt's
    scaling); a problem stops when a step lowers its cost by under 1e-12 of it, moves no parameter
    by 1e-10 of itself, its damping passes 1e16 (no step lowers the cost) or its cost is nil;
    after ``max_steps`` steps every problem stops where it is. Returns the fitted ``q``."""
    q, rows = q.copy(), np.arange(len(q))
    r, d = residuals(q, rows)
    cost, damping, eye = 0.5 * np.sum(r**2, 1), np.full(len(q), 1e-3), np.eye(q.shape[1])
    for _ in range(max_steps):
        now, lo, hi = q[rows], lower[rows], upper[rows]
        gradient, curvature = np.einsum("nbp,nb->np", d, r), np.einsum("nbp,nbq->npq", d, d)
        free = ~(((now <= lo) & (gradient > 0)) | ((now >= hi) & (gradient < 0)))
        scale = np.maximum(np.diagonal(curvature, axis1=1, axis2=2), 1e-30)
        damped = curvature + damping[:, None, None] * scale[:, :, None] * eye
        system = np.where(free[:, :, None] & free[:, None, :], damped, eye)
        step = np.linalg.solve(system, np.where(free, -gradient, 0.0)[..., None])[..., 0]
        step /= np.maximum(1.0, np.abs(step[:, 1:2]))  # the log range moves by at most 1
        trial = np.clip(now + step, lo, hi)
        r_new, d_new = residuals(trial, rows)
        cost_new = 0.5 * np.sum(r_new**2, 1)
        better = np.isfinite(cost_new) & (cost_new < cost)
        still = np.all(np.abs(trial - now) <= 1e-10 * (np.abs(now) + 1e-10), 1)
        done = (better & (cost - cost_new <= 1e-12 * cost)) | still | (cost <= 1e-300)
        q[rows] = np.where(better[:, None], trial, now)
        r, d = np.where(better[:, None], r_new, r), np.where(better[:, None, None], d_new, d)
        cost = np.where(better, cost_new, cost)
        damping = np.where(better, np.maximum(damping / 3, 1e-12), damping * 4)
        going = ~done & (damping < 1e16)
        if not going.any():
            break
        rows, r, d, cost, damping = rows[going], r[going], d[going], cost[going], damping[going]
    return q


def grid_semivariance(values: np.ndarray, max_lag: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The experimental variogram of a gridded scene from every pair of observed cells along its
    rows, columns and both diagonals, ``1..max_lag`` steps apart (``values [R, C]``, NaN missing),
    or of each step of a stack ``[T, R, C]`` at once.

    Returns ``(lag, semivariance, pairs)`` per distinct distance in cells: for a scene ``[L]`` each,
    the distances with pairs only; for a stack ``lag [L]`` and ``[T, L]`` for the others, over every
    distance of the grid (0 pairs and semivariance where a step has none).
    Every pair counts, the short lags most of all, which a random sample of points misses (on a
    1-degree global SST scene, 2000 random cells left the first bin 0-10 cells wide and the nugget
    three times too large).
    """
    stack = np.asarray(values, np.float64)  # float32 sums would lose the short lags' small differences
    stack = stack[None] if stack.ndim == 2 else stack
    rows, cols = stack.shape[1:]
    finite = np.isfinite(stack)
    filled = np.where(finite, stack, 0.0)
    lags, sums, counts = [], [], []
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        for k in range(1, max_lag + 1):
            r, c = k * dr, k * dc
            if r >= rows or abs(c) >= cols:
                break
            a = np.s_[:, : rows - r, max(0, -c): cols - max(0, c)]  # cell (i, j) ...
            b = np.s_[:, r:, max(0, c): cols - max(0, -c)]  # ... and cell (i + r, j + c)
            pair = finite[a] & finite[b]
            diff = filled[a] - filled[b]
            diff *= pair  # 0 unless both cells are observed
            lags.append(k * np.hypot(dr, dc))
            sums.append(np.einsum("tij,tij->t", diff, diff))
            counts.append(np.count_nonzero(pair, axis=(1, 2)))
    if not lags:  # a single cell, or no lag asked for
        none = np.zeros((len(stack), 0))
        return (np.zeros(0), none[0], none[0]) if values.ndim == 2 else (np.zeros(0), none, none)
    # One bin per distinct distance: rows and columns (and the two diagonals) pooled by pair count.
    distinct, which = np.unique(np.round(lags, 9), return_inverse=True)
    pool = np.zeros((len(lags), len(distinct)))
    pool[np.arange(len(lags)), which] = 1.0
    cnt = np.array(counts, np.float64).reshape(len(lags), -1).T @ pool  # [T, L]
    gam = 0.5 * (np.array(sums).reshape(len(lags), -1).T @ pool) / np.maximum(cnt, 1)
    if values.ndim == 2:
        keep = cnt[0] > 0
        return distinct[keep], gam[0, keep], cnt[0, keep]
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
    baseline fits it (all steps' fits at once, :func:`fit_exponential_many`): per step ``(observed
    cells, s.d., [partial sill, range in cells, nugget])`` (sill and nugget in units of the step's
    variance), None for a step with fewer than :data:`MIN_SCENE_POINTS` observed cells or too few
    lags to fit."""
    values = np.asarray(values, np.float64)
    ok = np.broadcast_to(True if valid is None else np.asarray(valid, bool), values.shape)  # a view, no copy
    fits: list[tuple[int, float, list[float]] | None] = [None] * len(values)
    chunk = max(1, STACK_CELLS // max(1, int(np.prod(values.shape[1:]))))  # steps a pass holds
    found = []  # per pass: steps fitted, their observed cells, s.d., semivariances and pairs [n, L]
    lag = np.zeros(0)
    with np.errstate(all="ignore"):  # as fit_grid_variogram: degenerate fits are bounded anyway
        for first in range(0, len(values), chunk):
            seen = np.isfinite(values[first:first + chunk]) & ok[first:first + chunk]
            counts = seen.sum(axis=(1, 2))
            use = counts >= MIN_SCENE_POINTS  # enough cells for a variogram
            if not use.any():
                continue
            observed = np.where(seen[use], values[first:first + chunk][use], np.nan)
            mean, scale = np.nanmean(observed, axis=(1, 2)), np.nanstd(observed, axis=(1, 2))
            scale = np.where(scale > 0, scale, 1.0)
            lag, gam, cnt = grid_semivariance((observed - mean[:, None, None]) / scale[:, None, None], max_lag)
            found.append((first + np.flatnonzero(use), counts[use], scale, gam, cnt))
        if not found:
            return fits
        steps, counts, scale, gam, cnt = (np.concatenate([f[j] for f in found]) for j in range(5))
        enough = (cnt > 0).sum(axis=1) >= 3  # fewer distances with pairs: nothing to fit
        params = fit_exponential_many(lag, gam[enough], cnt[enough], float(max(values.shape[1:])))
    for t, n, sd, p in zip(steps[enough], counts[enough], scale[enough], params):
        fits[t] = (int(n), float(sd), [float(v) for v in p])
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
