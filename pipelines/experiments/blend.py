"""A fill checked on the input itself: several fillers blended by distance to the nearest observation.

A neural process learns its covariance on its training fields; on an input unlike them it can
lose to plain interpolation, most of all deep inside wide gaps, while near the observations it
wins. The input says which: hide some of its observed cells under copies of the gap shapes it
really has (:func:`check_cells`), fill those cells with each filler, and learn, per bin of
distance to the nearest observation, the blend of the fillers that fills them best and the
sigma scale that covers them (:func:`fit_blend`). The real gaps then get that blend at their
own distance (:func:`apply_blend`). Bins with few checked cells lean on the blend of all bins
together (:data:`SHRINK_CELLS` pseudo-cells), so a scene with few checked cells far from its
observations keeps the blend its near cells chose.

This module holds the arithmetic only: which fillers, and how a run fills the checked cube, are
the caller's (``pipelines.experiments.self_check``). Measured on the scene suite's validation
split and not adopted (``pipelines/results/suite_decisions.md``): the blends a scene's own checked
cells chose lost to te-pt-tnp alone, so this stays an experiment, not a part of ``geonp infill``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from geonp.metrics import WIDE_DISTANCE_BINS, Bins, distance_bin
from geonp.tasks.clouds import random_clouds

#: The share of a step's observed cells the self-check hides: enough cells to learn a blend per
#: distance bin, few enough that the checked cube's gaps stay like the input's.
CHECK_SHARE = (0.10, 0.30)
#: Steps with fewer observed cells are not checked (nothing to learn from, and little to lose).
MIN_CHECKED = 50
#: Translated copies of a step's own gaps tried as the shapes to hide under.
SHIFTS = 16
#: Checked cells of a distance bin at which its own blend and the all-bins blend weigh the same.
SHRINK_CELLS = 200
#: The blend weights are searched on a grid of this step over the simplex.
WEIGHT_STEP = 0.05
#: Sigma scales stay within these limits (as :mod:`geonp.fill.calibrate`'s).
SCALE_LIMITS = (0.5, 4.0)
#: The standard normal's 95% quantile: the half-width of the central 90% interval, in sigmas.
Z90 = 1.6448536269514722


def check_cells(observed: np.ndarray, gaps: np.ndarray, rng: np.random.Generator,
                share: tuple[float, float] = CHECK_SHARE) -> np.ndarray:
    """Observed cells to hide for the self-check: each step's own gap shapes, moved elsewhere.

    Only steps with gaps are checked (the others have nothing to fill), each under one of
    :data:`SHIFTS` translations (with wrap-around) of its own gaps that hides ``share`` of its
    observed cells: the checked cells then lie as far from the observations as the step's real
    gaps do, and the step's neighbours in time keep their values there, as they do at its real
    gaps (the gaps of *another* step, at their own place, would take that history away from
    every step at once). Without such a translation (gaps too large or too small to move), the
    step gets smooth random clouds of ``share``'s middle cover; a step with fewer than
    :data:`MIN_CHECKED` observed cells is left alone.

    Args:
        observed, gaps: bool ``[S, R, C]``: cells holding a value, and cells inside the valid
            area that do not (the gaps a fill must fill).
        rng: the randomness; same state, same cells.
        share: the least and most of a step's observed cells to hide.

    Returns:
        bool ``[S, R, C]``, True at the observed cells to hide.
    """
    observed, gaps = np.asarray(observed, bool), np.asarray(gaps, bool)
    n_steps, rows, cols = observed.shape
    low, high = share
    hidden = np.zeros_like(observed)
    for t in range(n_steps):
        n_obs = observed[t].sum()
        if n_obs < MIN_CHECKED or not gaps[t].any():
            continue
        moved = [np.roll(gaps[t], (int(rng.integers(rows)), int(rng.integers(cols))), axis=(0, 1)) & observed[t]
                 for _ in range(SHIFTS)]
        usable = [m for m in moved if low <= m.sum() / n_obs <= high]
        if usable:
            hidden[t] = usable[int(rng.integers(len(usable)))]
        elif rows > 1 and cols > 1:
            hidden[t] = random_clouds((rows, cols), (low + high) / 2, rng) & observed[t]
    return hidden


@dataclass(frozen=True)
class Blend:
    """What the self-check learnt: per distance bin, the fillers' weights and a sigma scale.

    ``fillers`` name the columns of ``weights [bins, K]`` (each row sums to one); ``scales
    [bins]`` multiply the blended sigma; ``cells [bins]`` count the checked cells of each bin."""

    fillers: tuple[str, ...]
    weights: np.ndarray
    scales: np.ndarray
    cells: np.ndarray
    bins: Bins = WIDE_DISTANCE_BINS

    def describe(self) -> str:
        """One line per bin for provenance: ``"1: te-pt-tnp 0.85, linear 0.15, sigma x1.04 (812 cells); ..."``."""
        parts = []
        for (label, _), w, s, n in zip(self.bins, self.weights, self.scales, self.cells):
            mix = ", ".join(f"{f} {x:.2f}" for f, x in zip(self.fillers, w) if x > 0)
            parts.append(f"{label}: {mix}, sigma x{s:.3g} ({int(n)} cells)")
        return "; ".join(parts)


def _simplex(k: int, step: float = WEIGHT_STEP) -> np.ndarray:
    """Every weight vector ``[P, k]`` on the simplex grid of ``step``."""
    n = int(round(1 / step))
    grid = [c for c in product(range(n + 1), repeat=k - 1) if sum(c) <= n]
    return np.array([[*c, n - sum(c)] for c in grid], float) / n


def best_weights(err: np.ndarray) -> np.ndarray:
    """The simplex weights ``[K]`` minimising the squared error of the blend, from the fillers'
    errors ``err [K, n]`` (prediction minus truth) at the same cells; ties go to the first filler."""
    gram = err @ err.T  # the blend's squared error is w G w
    grid = _simplex(err.shape[0])
    sse = np.einsum("pk,kl,pl->p", grid, gram, grid)
    return grid[int(np.argmin(np.round(sse, 12)))]


def coverage_scale(abs_z: np.ndarray) -> float:
    """The sigma scale that puts 90% of errors ``|z| [n]`` inside the central 90% interval."""
    return float(np.quantile(abs_z, 0.9) / Z90)


def fit_blend(truth: np.ndarray, distance: np.ndarray, means: np.ndarray, stds: np.ndarray,
              fillers: tuple[str, ...], bins: Bins = WIDE_DISTANCE_BINS) -> Blend:
    """Learn a :class:`Blend` from the checked cells.

    Args:
        truth: the hidden values ``[n]``.
        distance: each cell's distance to the nearest observation of the checked cube, in grid
            cells ``[n]`` (as :func:`geonp.metrics.distance_to_observed` gives it).
        means, stds: each filler's prediction ``[K, n]`` (1-sigma in ``stds``).
        fillers: the fillers' names, ``K`` of them, the one to trust without evidence first.
        bins: the distance bins.

    Returns:
        The weights (squared error, per bin, shrunk towards all bins' by :data:`SHRINK_CELLS`), and
        sigma scales putting 90% of each bin's cells in the central 90% interval of the blend
        (shrunk the same way), within :data:`SCALE_LIMITS`. Cells where a filler gave no finite
        prediction are left out. With no usable cell: the first filler alone, scale 1.
    """
    means, stds = np.asarray(means, float), np.asarray(stds, float)
    ok = np.isfinite(truth) & np.isfinite(means).all(0) & np.isfinite(stds).all(0) & (stds > 0).all(0)
    truth, distance, means, stds = truth[ok], distance[ok], means[:, ok], stds[:, ok]
    k, nb = len(fillers), len(bins)
    first = np.eye(k)[0]
    if truth.size == 0:
        return Blend(tuple(fillers), np.tile(first, (nb, 1)), np.ones(nb), np.zeros(nb, int), bins)
    which = distance_bin(distance, bins)
    err = means - truth
    overall = best_weights(err)
    weights = np.tile(overall, (nb, 1))
    cells = np.bincount(which, minlength=nb)
    for b in range(nb):
        here = which == b
        if here.any():
            weights[b] = (cells[b] * best_weights(err[:, here]) + SHRINK_CELLS * overall) / (cells[b] + SHRINK_CELLS)
    blended, sigma = _mix(weights[which].T, means, stds)
    z = np.abs(blended - truth) / sigma
    everywhere = coverage_scale(z)
    scales = np.full(nb, everywhere)
    for b in range(nb):
        here = which == b
        if here.any():
            scales[b] = (cells[b] * coverage_scale(z[here]) + SHRINK_CELLS * everywhere) / (cells[b] + SHRINK_CELLS)
    return Blend(tuple(fillers), weights, np.clip(scales, *SCALE_LIMITS), cells, bins)


def _mix(w: np.ndarray, means: np.ndarray, stds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The blend of ``means [K, ...]`` with weights ``w [K, ...]``, and its sigma before scaling: the
    weighted mean of the fillers' sigmas (a blend is as sure as the fillers it leans on)."""
    return (w * means).sum(0), (w * stds).sum(0)


def apply_blend(blend: Blend, distance: np.ndarray, means: np.ndarray,
                stds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The blended mean and sigma at cells ``distance [...]`` from the nearest observation, from the
    fillers' ``means``/``stds [K, ...]`` there (``blend.fillers`` order)."""
    which = distance_bin(distance, blend.bins)
    w = np.moveaxis(blend.weights[which], -1, 0)  # [K, ...]
    mean, sigma = _mix(w, np.asarray(means, float), np.asarray(stds, float))
    return mean, sigma * blend.scales[which]
