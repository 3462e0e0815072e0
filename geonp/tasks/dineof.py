"""What a stack of scenes says about each of its cells: DINEOF, the EOF reconstruction of its history.

A day under a cloud is seldom unlike every other day of the same place: the same coast, the same
fronts, the same fields. DINEOF (Beckers & Rixen 2003; Alvera-Azcarate et al. 2005) uses that.
The stack is a matrix ``X [cells, steps]`` of anomalies from the mean; a gap starts at zero and
is replaced by its rank-``k`` reconstruction (the projection of ``X`` on its ``k`` leading
right singular vectors, the temporal EOFs) until the gaps stop changing. ``k`` is chosen by the
error at a cross-validation set: observed cells hidden under other steps' real gaps
(:func:`geonp.tasks.clouds.borrow_gaps`), so the set has the shapes and widths of the product's
own clouds. A donor drawn for a second step lends its gaps moved by a random offset, and a step no
other step can donate to gets synthetic clouds of a cover the set accepts: a gap-free reanalysis
under one borrowed cloud would otherwise lose the same place in every step (or nothing at all),
and no mode past the first could be validated there (on the scene suite's ERSST stack one mode
and RMSE 1.76 K before, five modes and 0.32 K after; ``pipelines/results/suite_decisions.md``).

The result serves twice: as the ``dineof`` baseline, and as the background a model compares its
cells with (:func:`geonp.tasks.history.history_covariates`), which is how a window gets every other
day of its place, whatever the time between them.

The iterations (:func:`geonp.tasks.eofs.converge`) take their temporal EOFs from ``X^T X``, by dense
eigendecomposition, Lanczos or block iteration, on the host or a GPU. Memory is ``X`` itself, in
float64: the stack must fit in memory.

The 1-sigma of a filled cell is the cross-validation RMSE of the bin of its distance to the
nearest observed cell of its step (bins of :data:`SIGMA_BINS`, made non-decreasing): a cell deep
inside a cloud is less certain than one at its rim, by as much as the product's own clouds show.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from geonp.metrics import distance_to_observed
from geonp.tasks.clouds import borrow_gaps
from geonp.tasks.eofs import DENSE_EOF_STEPS, converge

if TYPE_CHECKING:
    import torch

#: Upper edges (grid cells) of the distance bins the 1-sigma is estimated in.
SIGMA_BINS = (1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 18.0, 25.0, 40.0, np.inf)
#: Cross-validation points a distance bin needs for its own RMSE (else it takes the bin below).
MIN_BIN_POINTS = 30
#: Steps with observations a stack needs: fewer hold no history to learn modes from.
MIN_STEPS = 3
#: The least prior precision on a cell's loading (standardised units) in the held-out fit.
RIDGE_FLOOR = 1e-9
#: Share of each step's observed cells the cross-validation hides, at least and at most.
CV_LOW, CV_HIGH = 0.02, 0.15


@dataclass
class Reconstruction:
    """A stack filled by :func:`dineof`.

    ``mean`` and ``std``: float64 ``[T, R, C]``, the reconstruction everywhere in the valid area
    (also at observed cells: the low-rank fit there, not the observation) and the 1-sigma of a
    gap cell (0 at observed cells); NaN outside the valid area. ``held_out``: float64 ``[T, R, C]``,
    what the modes predict at each cell from the *other* steps of the same cell (at a gap the
    reconstruction itself; at an observed cell its leave-one-out prediction), the covariate a model
    may compare observations with, since at a gap nothing else is known. ``modes``: the EOFs kept;
    ``cv_rmse``: cross-validation RMSE per number of modes tried; ``sigma``: ``(upper edge in
    cells, 1-sigma)`` per distance bin; ``cv_points``: cells in the cross-validation set.
    """

    mean: np.ndarray
    std: np.ndarray
    held_out: np.ndarray
    modes: int
    cv_rmse: dict[int, float] = field(default_factory=dict)
    sigma: list[tuple[float, float]] = field(default_factory=list)
    cv_points: int = 0


def dineof(
    values: np.ndarray,
    valid: np.ndarray | None = None,
    *,
    rng: np.random.Generator | None = None,
    max_modes: int = 20,
    tol: float = 1e-3,
    max_iter: int = 300,
    cv_low: float = CV_LOW,
    cv_high: float = CV_HIGH,
    dense_steps: int = DENSE_EOF_STEPS,
    warm_start: bool = True,
    cv_mask: np.ndarray | None = None,
    resume: bool = False,
    device: torch.device | str | None = None,
) -> Reconstruction:
    """Fill a stack of scenes by DINEOF.

    Args:
        values: float ``[T, R, C]``: the stack, NaN (or +-inf) at gaps.
        valid: bool ``[R, C]`` or ``[T, R, C]``, True where a value can exist (sea for SST);
            None: every cell.
        rng: draws the cross-validation set; default seed 0, so the same stack gives the same fill.
        max_modes: at most this many EOFs (and never more than the observed steps minus one).
        tol: an iteration stops when the gaps change by less than ``tol`` times the anomalies'
            standard deviation (root mean square over the gaps).
        max_iter: iterations per number of modes at most.
        cv_low: each step hides at least this share of its observed cells for cross-validation.
        cv_high: and at most this share.
        dense_steps: up to this many steps the EOFs come from a dense eigendecomposition in every
            iteration; beyond, from Lanczos: with ``warm_start``, once per convergence and carried
            on by block iteration (:func:`geonp.tasks.eofs.converge`), without it in every iteration.
        warm_start: False: a long stack's EOFs from a fresh Lanczos in every iteration, the code
            before the block iteration and its reference (``pipelines/benchmarks/dineof_speed.py``:
            the held-out predictions within 3e-5 K of it on a history fold of each hourly month;
            1.5 times the block iteration's time on ERA5's, 0.8 times on the smaller WFDE5's).
        cv_mask: bool ``[T, R, C]``, the cross-validation cells drawn beforehand by
            :func:`cross_validation_cells` (``rng`` then draws nothing); None: drawn here from ``rng``.
            Drawn apart, several stacks' draws can come from one generator in turn and their
            fills then run side by side (:func:`geonp.tasks.history.history_folds`).
        resume: the final fill resumed from the cross-validation's at the chosen modes (one convergence),
            not climbed from zeros: half the time (the hourly ERA5 cube 25.0 s, 47.5 s); taken by the history
            covariate (te-pt-tnp the same to 0.02%), not the ``dineof`` baseline (0.4% worse RMSE, 4 of 11
            stacks beyond noise; tighter tolerances worse still: the climb's early stop regularises).
        device: a torch device the iterations run on (float64; :func:`geonp.tasks.eofs.converge`), a GPU's for a fill
            there; None: NumPy on the host. Everything outside the iterations stays on the host.

    Returns:
        Reconstruction: the filled stack, its 1-sigma, the held-out predictions and the modes kept.

    Raises:
        ValueError: shapes that disagree, or fewer than :data:`MIN_STEPS` steps with an observed cell.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 3:
        raise ValueError(f"dineof needs a [time, rows, cols] stack, got shape {values.shape}")
    ok = np.ones(values.shape[1:], bool) if valid is None else np.asarray(valid, bool)
    if ok.shape not in (values.shape, values.shape[1:]):
        raise ValueError(f"valid mask of shape {ok.shape} does not match the stack {values.shape}")
    ok = np.broadcast_to(ok, values.shape)
    observed = np.isfinite(values) & ok
    steps_seen = int(observed.any(axis=(1, 2)).sum())
    if steps_seen < MIN_STEPS:
        raise ValueError(f"dineof needs at least {MIN_STEPS} steps with observed cells, got {steps_seen}")
    if cv_mask is None:
        cv_mask = cross_validation_cells(values, ok, np.random.default_rng(0) if rng is None else rng, cv_low, cv_high)
    elif np.shape(cv_mask) != values.shape:
        raise ValueError(f"cross-validation mask of shape {np.shape(cv_mask)} does not match the stack {values.shape}")
    cv_mask = np.asarray(cv_mask, bool) & observed  # only observed cells can be hidden

    cells = ok.any(axis=0)  # [R, C]: the rows of the matrix
    truth = values[:, cells].T  # [N, T]
    seen = observed[:, cells].T  # [N, T]
    centre = float(truth[seen].mean())
    spread = float(truth[seen].std()) or 1.0
    anomaly = np.where(seen, (truth - centre) / spread, 0.0)  # [N, T], standardised

    cv = cv_mask[:, cells].T  # [N, T]
    limit = max(1, min(max_modes, steps_seen - 1))
    work = np.where(cv, 0.0, anomaly)
    unknown = ~seen | cv
    cv_rmse: dict[int, float] = {}
    best_k, best_err, best_pred, best_work = 1, np.inf, None, None
    for k in range(1, limit + 1):
        work = converge(work, unknown, k, tol, max_iter, dense_steps, warm_start, device)  # a new array
        err = float(np.sqrt(np.mean((work[cv] - anomaly[cv]) ** 2))) * spread if cv.any() else np.nan
        cv_rmse[k] = err
        if err < best_err or best_pred is None:
            best_k, best_err, best_pred, best_work = k, err, work[cv].copy(), work if resume else None
        elif k >= best_k + 3:  # three more modes without a better score: noise from here on
            break

    # The final fill with the cross-validation cells back in, raised a mode at a time as above (a start
    # from zeros at many modes lets the extra modes explain the zeros instead of the data), or resumed.
    if resume:  # the cross-validation's matrices let go first: the stack is held once fewer
        start, work, best_work = np.where(seen, anomaly, best_work), None, None
        filled = converge(start, ~seen, best_k, tol, max_iter, dense_steps, warm_start, device)
    else:
        filled = np.where(seen, anomaly, 0.0)
        for k in range(1, best_k + 1):
            filled = converge(filled, ~seen, k, tol, max_iter, dense_steps, warm_start, device)
    # The rank-k fit everywhere: at a gap it is the converged value (a fixed point), at an observed
    # cell the part of the observation the modes explain, so a residual there is what they miss.
    power, vectors = np.linalg.eigh(filled.T @ filled)
    lead = vectors[:, -best_k:]  # [T, k]
    mean = np.full(values.shape, np.nan)
    mean[:, cells] = (centre + spread * ((filled @ lead) @ lead.T)).T
    # Prior on a cell's loadings: mode k's mean square loading over the cells, against the noise
    # the cross-validation saw (both in standardised units).
    noise = (best_err / spread) ** 2 if np.isfinite(best_err) else 1.0
    # Floored: a field the modes fit exactly (a constant one: no cross-validation error) still gets
    # a prior, so a cell's system stays solvable; no real stack comes near the floor.
    ridge = np.maximum(noise * len(filled) / np.maximum(power[-best_k:], 1e-12), RIDGE_FLOOR)  # [k]
    held_out = np.full(values.shape, np.nan)
    held_out[:, cells] = (centre + spread * _leave_one_out(np.where(seen, anomaly, 0.0), seen, lead, ridge)).T

    # 1-sigma by distance to the nearest observed cell, from the cross-validation errors.
    sigma: list[tuple[float, float]] = []
    std = np.full(values.shape, np.nan)
    std[ok] = 0.0
    gap = ok & ~observed
    if cv.any() and best_pred is not None:
        cv_dist = distance_to_observed(observed & ~cv_mask)[:, cells].T[cv]  # [n_cv], same order as work[cv]
        sigma = _sigma_by_distance((best_pred - anomaly[cv]) * spread, cv_dist)
        edges = np.array([e for e, _ in sigma])
        levels = np.array([s for _, s in sigma])
        dist = distance_to_observed(observed)[gap]
        std[gap] = levels[np.minimum(np.searchsorted(edges, dist, side="left"), len(levels) - 1)]
    else:  # nothing could be hidden: the spread of the anomalies is the honest sigma
        std[gap] = spread
    return Reconstruction(mean, std, held_out, best_k, cv_rmse, sigma, int(cv.sum()))


def cross_validation_cells(values: np.ndarray, valid: np.ndarray | None, rng: np.random.Generator,
                           low: float = CV_LOW, high: float = CV_HIGH) -> np.ndarray:
    """The cells :func:`dineof` hides to choose its number of modes: bool ``[T, R, C]``.

    Observed cells hidden under other steps' real gaps, a repeated donor's moved (on a gap-free
    stack under one cloud every step would lose the same place, whose cells no mode can then be
    fitted to); synthetic clouds of a cover the shares accept where no step can donate. Each step
    hides ``low`` to ``high`` of its observed cells.

    Args:
        values: float ``[T, R, C]``, NaN (or +-inf) at gaps.
        valid: bool ``[R, C]`` or ``[T, R, C]``, True where a value can exist; None: every cell.
        rng: draws the donors, their offsets and the synthetic clouds.
        low, high: as :func:`dineof`'s ``cv_low`` and ``cv_high``.

    Returns:
        True at the observed cells hidden.
    """
    ok = np.broadcast_to(np.ones(values.shape[1:], bool) if valid is None else np.asarray(valid, bool), values.shape)
    observed = np.isfinite(values) & ok
    mask, _ = borrow_gaps(observed, ~np.isfinite(values) & ok, rng, low=low, high=high,
                          cover=(low + high) / 2, min_observed=20, move_repeats=True)
    return mask


def _leave_one_out(anomaly: np.ndarray, seen: np.ndarray, lead: np.ndarray, ridge: np.ndarray,
                   chunk: int = 65536) -> np.ndarray:
    """Each cell's anomaly predicted from its other observed steps: ``[N, T]``.

    At DINEOF's fixed point a cell's loadings on the temporal EOFs ``lead [T, k]`` are the least
    squares fit of its observed steps, so its value at step ``t`` is ``u . v_t``; here the fit has
    a ridge (``ridge [k]``, a prior on each mode's loading), so a cell seen on few steps keeps
    loadings of the size the modes have rather than the wild ones an exact fit of two values
    gives. Refitted without step ``t`` itself, the prediction at an observed step is
    ``x - e / (1 - h)`` (``e`` the fit's residual, ``h`` the step's leverage), the leave-one-out
    identity of ridge regression, exact for every step: a cell seen once is predicted by the prior
    alone (the mean), never by a fit that holds its own value. ``chunk`` cells at a time keep the
    ``[cells, k, k]`` systems small.
    """
    out = np.empty_like(anomaly)
    for start in range(0, len(anomaly), chunk):
        x, w = anomaly[start:start + chunk], seen[start:start + chunk].astype(np.float64)  # [n, T]
        gram = np.einsum("nt,tk,tl->nkl", w, lead, lead, optimize=True) + np.diag(ridge)  # [n, k, k]
        loadings = np.linalg.solve(gram, np.einsum("nt,tl->nl", w * x, lead)[..., None])[..., 0]  # [n, k]
        fitted = loadings @ lead.T  # [n, T]
        # Leverage of each step, h = v_t^T G^-1 v_t, from one more solve against every v_t.
        solved = np.linalg.solve(gram, np.broadcast_to(lead.T, (len(x), *lead.T.shape)))  # [n, k, T]
        leverage = np.einsum("tk,nkt->nt", lead, solved)  # [n, T], below 1 with a positive ridge
        loo = x - (x - fitted) / np.maximum(1.0 - leverage, 1e-12)
        out[start:start + chunk] = np.where(w > 0, loo, fitted)
    return out


def _sigma_by_distance(errors: np.ndarray, distance: np.ndarray) -> list[tuple[float, float]]:
    """``(upper edge, RMSE)`` per :data:`SIGMA_BINS` bin of the cross-validation ``errors`` at
    ``distance`` cells from the nearest observation. A bin with too few points takes the nearest
    bin below it that has enough (the first such bin for those before it; the overall RMSE when
    none has), and the RMSE never decreases with distance."""
    edges = np.array(SIGMA_BINS)
    which = np.searchsorted(edges, distance, side="left")
    rmse = [float(np.sqrt(np.mean(errors[which == b] ** 2))) if (which == b).sum() >= MIN_BIN_POINTS else None
            for b in range(len(edges))]
    known = [r for r in rmse if r is not None]
    level = known[0] if known else float(np.sqrt(np.mean(errors**2)))
    out = []
    for edge, r in zip(edges, rmse):
        level = max(level, r) if r is not None else level
        out.append((float(edge), level))
    return out
