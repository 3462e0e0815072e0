"""Analog scenes: a day predicted from the days that look most like it, whenever they were.

Persistence (the nearest steps in time) assumes the closest day is the most alike; in a stack of
scenes weeks or years apart, or around a front that came and went, it need not be. Here every
other step ``s`` is a candidate predictor of step ``t``: the linear map ``y_t = a + b y_s`` is
fitted over the cells both observe, and its residual RMSE says how alike the two days are. A cell
of ``t`` is then predicted from the best-matching steps that observe it, weighted by the inverse
of their residual variance: the offset and the scale of the day-to-day relation are learned, not
copied (the spirit of R gapfill's neighbouring images and of per-pixel regressions on the history).

All pair fits come from a handful of ``[T, T]`` matrix products over the cells, so a stack costs
``T^2 * cells`` operations. At an observed cell the prediction never uses the cell's own value at
``t`` (only its values on other steps); the fitted ``a, b`` include it among hundreds of cells.
"""

from __future__ import annotations

import numpy as np

#: Cells two steps must both observe for their relation to be fitted.
MIN_COMMON = 50
#: Steps that may predict a cell: the best-matching ones (by residual RMSE) that observe it.
ANALOGS = 5


def analog_prediction(values: np.ndarray, analogs: int = ANALOGS, min_common: int = MIN_COMMON) -> np.ndarray:
    """Each cell of each step predicted from the ``analogs`` best-matching other steps.

    Args:
        values: ``[T, R, C]``, NaN at gaps (and outside the valid area).
        analogs: how many of the best-matching steps that observe a cell predict it.
        min_common: cells two steps must share for one to predict the other.

    Returns:
        float64 ``[T, R, C]``: the inverse-residual-variance weighted mean of ``a_ts + b_ts y_s``
        over the chosen steps ``s``; NaN where no step that matches observes the cell.
    """
    t_count = values.shape[0]
    flat = values.reshape(t_count, -1).astype(np.float64)
    seen = np.isfinite(flat)
    o = seen.astype(np.float64)  # [T, N]
    # Centre each step first: sums of squares of raw values (kelvin, say) lose the anomalies' digits.
    mean = np.where(seen, flat, 0.0).sum(1) / np.maximum(o.sum(1), 1)  # [T]
    y = np.where(seen, flat - mean[:, None], 0.0)
    n = o @ o.T  # [t, s]: cells both observe
    st = y @ o.T  # [t, s]: sum of y_t over the cells t shares with s (its transpose: the sums of y_s)
    stt = (y * y) @ o.T  # sums of y_t^2 likewise
    sts = y @ y.T
    with np.errstate(invalid="ignore", divide="ignore"):
        mt, ms = st / n, st.T / n
        var_t, var_s = stt / n - mt**2, stt.T / n - ms**2
        cov = sts / n - mt * ms
        slope = cov / var_s
        resid = np.maximum(var_t - slope * cov, 0.0)  # residual variance of y_t given y_s
    # Relative tests: a step flat over the shared cells (sea ice, a saturated product) has a
    # variance of rounding error, whose slope would be noise over noise.
    scale = np.maximum(stt.T / n, 1e-300)
    usable = (n >= min_common) & (var_s > 1e-10 * scale) & np.isfinite(resid)
    np.fill_diagonal(usable, False)
    resid = np.where(usable, resid, np.inf)
    out = np.full(flat.shape, np.nan)
    for t in range(t_count):
        order = np.argsort(resid[t])
        order = order[np.isfinite(resid[t, order])]
        if not order.size:
            continue
        floor = 1e-12 * max(float(var_t[t, order].max()), 1e-300)  # relative to the day's own variance
        total = np.zeros(flat.shape[1])
        weight = np.zeros(flat.shape[1])
        taken = np.zeros(flat.shape[1], np.int64)
        for s in order:  # best match first; a cell takes the first ``analogs`` steps that observe it
            use = seen[s] & (taken < analogs)
            if not use.any():
                continue
            w = 1.0 / max(resid[t, s], floor)
            pred = mt[t, s] + slope[t, s] * (y[s] - ms[t, s])
            total[use] += w * pred[use]
            weight[use] += w
            taken[use] += 1
            if (taken >= analogs).all():
                break
        have = weight > 0
        out[t, have] = mean[t] + total[have] / weight[have]
    return out.reshape(values.shape)
