"""Scores for probabilistic predictions: per-task log-likelihood for training, and the
point-wise skill scores of gap-filling evaluations (RMSE, MAE, NLL, CRPS, coverage, interval score),
with two diagnostics: errors by distance to the nearest observed cell, and PIT histograms.

CRPS and the interval score of a Gaussian predictive are closed forms (Gneiting & Raftery 2007),
written here rather than taken from ``scoringrules``: every te-pt-tnp fill scores CRPS (its nugget
check), and where numba is installed, importing ``scoringrules`` compiles its kernels in every
process, 3-5 s on 2 cores and up to 12 s on a GPU machine's cold start. ``scoringrules`` stays the library of the
multivariate scores of samples (``geonp.sample_scores``), checked against these in the tests.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import ndimage, special
from torch.distributions import Normal


def task_log_likelihood(dist: Normal, yt: torch.Tensor, mask_t: torch.Tensor) -> torch.Tensor:
    """Mean log-likelihood per present target point, one value per task.

    Args:
        dist: the predictive ``Normal``, loc/scale ``[B, Nt, Dy]``.
        yt: the target values ``[B, Nt, Dy]``.
        mask_t: bool ``[B, Nt]``, True where a target is present; padded targets count as nothing.

    Returns:
        ``[B]``: nats per present target point, output dimensions summed (differentiable).
    """
    log_p = dist.log_prob(torch.where(mask_t[..., None], yt, dist.loc.detach())).sum(-1)  # [B, Nt]
    log_p = log_p * mask_t
    return log_p.sum(-1) / mask_t.sum(-1).clamp(min=1)


def _as_float64(x) -> np.ndarray:
    """``x`` as float64 (at least): the normal's functions below give float64, as scipy.stats' do."""
    x = np.asarray(x)
    return x.astype(np.promote_types(x.dtype, np.float64), copy=False)


def normal_cdf(z) -> np.ndarray:
    """The standard normal's CDF ``Phi(z)``, elementwise (``scipy.special.ndtr``, which
    ``scipy.stats.norm.cdf`` calls: importing ``scipy.stats`` took 0.37 s of every command's start)."""
    return special.ndtr(_as_float64(z))


def normal_pdf(z) -> np.ndarray:
    """The standard normal's density ``phi(z)``, elementwise (``scipy.stats.norm.pdf``'s formula)."""
    z = _as_float64(z)
    return np.exp(-(z**2) / 2.0) / np.sqrt(2 * np.pi)


def normal_ppf(p) -> np.ndarray:
    """The standard normal's quantile ``Phi^-1(p)`` (``scipy.special.ndtri`` in ``p``'s own precision,
    then float64, as ``norm.ppf``)."""
    q = special.ndtri(np.asarray(p))
    return q.astype(np.promote_types(q.dtype, np.float64))


def crps_normal(y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """CRPS of ``Normal(mean, std)`` at ``y``, elementwise in ``y``'s units (arrays broadcast):
    ``std * (z (2 Phi(z) - 1) + 2 phi(z) - 1 / sqrt(pi))`` with ``z = (y - mean) / std``."""
    z = (y - mean) / std
    return std * (z * (2.0 * normal_cdf(z) - 1.0) + 2.0 * normal_pdf(z) - 1.0 / math.sqrt(math.pi))


def interval_score(y: np.ndarray, lower: np.ndarray, upper: np.ndarray, alpha: float) -> np.ndarray:
    """Interval score of the central ``1 - alpha`` interval ``[lower, upper]`` at ``y``,
    elementwise in ``y``'s units: its width plus ``2 / alpha`` times how far ``y`` falls outside."""
    return (upper - lower) + (2.0 / alpha) * (np.maximum(lower - y, 0.0) + np.maximum(y - upper, 0.0))


def mean_and_stderr(values: torch.Tensor) -> tuple[float, float]:
    """Mean and standard error of the mean of per-task scores.

    Args:
        values: 1-D tensor of per-task scores (e.g. :func:`task_scores`).

    Returns:
        ``(mean, standard error)`` as floats; the standard error is NaN for a single value.
    """
    values = values.double()
    n = values.numel()
    stderr = values.std(unbiased=True).item() / n**0.5 if n > 1 else float("nan")
    return values.mean().item(), stderr


@torch.no_grad()
def task_scores(model, batches: list, device: torch.device | str = "cpu", shift: float = 0.0) -> torch.Tensor:
    """Per-task mean log-likelihood of ``model`` on fixed batches, in evaluation mode.

    Args:
        model: a model in the calling convention (``model(xc, yc, xt, mask_c, mask_t)``).
        batches: ``geonp.data.Batch`` objects (e.g. a task source's ``validation``).
        device: where to run the model.
        shift: added to every input location first (the TE-TNP paper's test-time Δ).

    Returns:
        ``[num_tasks]`` float32 on the CPU: nats per target point (see
        :func:`task_log_likelihood`). The model's training mode is restored afterwards.
    """
    was_training = getattr(model, "training", False)
    model.eval()
    scores = []
    for batch in batches:
        b = batch.shifted(shift).to(device) if shift else batch.to(device)
        dist = model(b.xc, b.yc, b.xt, b.mask_c, b.mask_t)
        scores.append(task_log_likelihood(dist, b.yt, b.mask_t).cpu())
    model.train(was_training)
    return torch.cat(scores)


def gaussian_skill(y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> dict[str, float]:
    """Skill of Gaussian predictions ``N(mean, std^2)`` at held-out truths ``y``.

    Args:
        y: the truths, any shape.
        mean: predicted means, ``y``'s shape and units.
        std: predicted standard deviations (1-sigma), ``y``'s shape and units. A point where
            any of the three is NaN, or ``std <= 0``, is dropped.

    Returns:
        In ``y``'s units unless stated: ``n`` points scored, ``rmse``, ``mae``, ``nll`` (nats
        per point), ``crps`` (closed form), ``coverage_50``/``coverage_90``/``coverage_95``
        (fraction of ``y`` inside the central 50%/90%/95% interval), ``interval_score_90``
        (Gneiting & Raftery 2007, alpha = 0.1; width plus penalties).

    Raises:
        ValueError: no point can be scored.
    """
    y, mean, std = _scorable(y, mean, std)
    if y.size == 0:
        raise ValueError("no point with a finite truth, mean and standard deviation to score")
    err = mean - y
    scores = {
        "n": int(y.size),
        "rmse": float(np.sqrt(np.mean(err**2))),
        "mae": float(np.mean(np.abs(err))),
        "nll": float(np.mean(0.5 * np.log(2 * math.pi * std**2) + 0.5 * (err / std) ** 2)),
        "crps": float(np.mean(crps_normal(y, mean, std))),
    }
    for level in (0.50, 0.90, 0.95):
        half = normal_ppf(0.5 + level / 2) * std
        scores[f"coverage_{round(level * 100)}"] = float(np.mean(np.abs(err) <= half))
    half = normal_ppf(0.95) * std
    scores["interval_score_90"] = float(np.mean(interval_score(y, mean - half, mean + half, 0.1)))
    return scores


#: Bins of distance to the nearest observed cell, in grid cells: (label, inclusive upper edge).
#: A hidden cell next to an observed one (edge-adjacent) is at distance 1, a diagonal one at sqrt(2).
DISTANCE_BINS: tuple[tuple[str, float], ...] = (("1", 1.0), ("2-3", 3.0), ("4-6", 6.0), ("7-12", 12.0),
                                                (">12", math.inf))
#: The same bins with the far one split, for scenes under wide clouds, where a fill deep inside a
#: cloud (beyond 25 cells) behaves unlike one near its rim.
WIDE_DISTANCE_BINS: tuple[tuple[str, float], ...] = DISTANCE_BINS[:-1] + (("13-25", 25.0), (">25", math.inf))
Bins = tuple[tuple[str, float], ...]


def distance_to_observed(observed: np.ndarray) -> np.ndarray:
    """Euclidean distance, in grid cells, from every cell to the nearest observed cell of its step.

    Args:
        observed: bool ``[..., R, C]``: the last two axes are the horizontal grid, any leading
            axes are steps (time, ...); True where a model can see a value.

    Returns:
        float64 of ``observed``'s shape: 0 at observed cells, 1 next to one, sqrt(2) diagonal to
        one, ...; ``inf`` everywhere on a step with no observed cell. Distances count cells, not
        metres: on a lat/lon grid a cell's width shrinks with latitude and this ignores it.
    """
    observed = np.asarray(observed, dtype=bool)
    if observed.ndim < 2:
        raise ValueError(f"observed must have two horizontal axes, got shape {observed.shape}")
    steps = observed.reshape(-1, *observed.shape[-2:])
    out = np.full(steps.shape, np.inf)
    for t, seen in enumerate(steps):
        # Per step: a transform over the whole array would measure across time too. Without any
        # observed cell, scipy measures to the array's border instead; inf says "nothing seen".
        if seen.any():
            out[t] = ndimage.distance_transform_edt(~seen)
    return out.reshape(observed.shape)


def distance_bin(distance: np.ndarray, bins: Bins = DISTANCE_BINS) -> np.ndarray:
    """Index into ``bins`` (default :data:`DISTANCE_BINS`) of each distance (grid cells, any shape;
    upper edges inclusive)."""
    edges = np.array([edge for _, edge in bins[:-1]])
    return np.searchsorted(edges, np.asarray(distance, dtype=np.float64), side="left")


def binned_rmse(err: np.ndarray, distance: np.ndarray, bins: Bins = DISTANCE_BINS) -> dict[str, dict[str, float]]:
    """RMSE and MAE of errors ``err`` grouped by ``distance`` into ``bins`` (default :data:`DISTANCE_BINS`).

    Args:
        err: prediction minus truth, in the variable's units, any shape; NaN drops a point.
        distance: the points' distances to the nearest observed cell in grid cells (same shape),
            e.g. from ``distance_to_observed``; ``inf`` falls in the last bin.
        bins: ``(label, inclusive upper edge)`` pairs, the last edge ``inf``.

    Returns:
        ``{label: {"n", "rmse", "mae"}}`` for every bin in order, ``n`` the points scored;
        ``rmse``/``mae`` NaN for an empty bin.
    """
    err = np.asarray(err, dtype=np.float64).ravel()
    distance = np.asarray(distance, dtype=np.float64).ravel()
    if err.shape != distance.shape:
        raise ValueError(f"err has {err.size} points but distance {distance.size}")
    keep = np.isfinite(err) & ~np.isnan(distance)
    which = distance_bin(distance[keep], bins)
    err = err[keep]
    out = {}
    for i, (label, _) in enumerate(bins):
        e = err[which == i]
        out[label] = {"n": int(e.size), "rmse": float(np.sqrt(np.mean(e**2))) if e.size else math.nan,
                      "mae": float(np.mean(np.abs(e))) if e.size else math.nan}
    return out


def binned_coverage(err: np.ndarray, std: np.ndarray, distance: np.ndarray, level: float = 0.9,
                    bins: Bins = DISTANCE_BINS) -> dict[str, float]:
    """Coverage of the central ``level`` Gaussian interval grouped by ``distance`` into ``bins``
    (default :data:`DISTANCE_BINS`).

    Args:
        err: prediction minus truth (any units, any shape); NaN drops a point.
        std: the predicted 1-sigma in the same units (same shape); a point with std <= 0 or NaN is dropped.
        distance: grid cells to the nearest observed cell (same shape), as for :func:`binned_rmse`.
        level: the interval's probability, strictly between 0 and 1.
        bins: as for :func:`binned_rmse`.

    Returns:
        ``{label: fraction of the bin's points inside the interval}`` for every bin in order,
        NaN for an empty bin. A calibrated model is near ``level`` in every bin; the bins show
        where it is not (e.g. too sure a few cells inside a gap, too cautious next to data).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be strictly between 0 and 1, got {level}")
    err, std, distance = (np.asarray(a, dtype=np.float64).ravel() for a in (err, std, distance))
    if not err.shape == std.shape == distance.shape:
        raise ValueError(f"err, std and distance have {err.size}, {std.size} and {distance.size} points")
    keep = np.isfinite(err) & np.isfinite(std) & (std > 0) & ~np.isnan(distance)
    inside = np.abs(err[keep]) <= normal_ppf(0.5 + level / 2) * std[keep]
    which = distance_bin(distance[keep], bins)
    return {label: float(inside[which == i].mean()) if np.any(which == i) else math.nan
            for i, (label, _) in enumerate(bins)}


def pit_histogram(y: np.ndarray, mean: np.ndarray, std: np.ndarray, bins: int = 10) -> list[int]:
    """Histogram of the probability integral transform ``Phi((y - mean) / std)``.

    Calibrated predictions give flat counts; too narrow ones a U (truths in the tails), too wide
    ones a hump, a biased mean a slope.

    Args:
        y: the truths, any shape.
        mean: predicted means, ``y``'s shape and units.
        std: predicted standard deviations, ``y``'s shape and units (a point with a non-finite
            value or ``std <= 0`` is dropped).
        bins: number of equal bins of [0, 1].

    Returns:
        ``bins`` counts, from PIT 0 to 1.
    """
    y, mean, std = _scorable(y, mean, std)
    counts, _ = np.histogram(normal_cdf((y - mean) / std), bins=bins, range=(0.0, 1.0))
    return [int(c) for c in counts]


def _scorable(y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The points with a finite truth, mean and std > 0, as flat float64 arrays."""
    y, mean, std = (np.asarray(a, dtype=np.float64).ravel() for a in (y, mean, std))
    keep = np.isfinite(y) & np.isfinite(mean) & np.isfinite(std) & (std > 0)
    return y[keep], mean[keep], std[keep]
