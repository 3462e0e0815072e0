"""Scores of samples as a whole: do filled cells err together as the truth says they do?

Per-cell scores (RMSE, CRPS, coverage) cannot tell coherent samples from independent per-cell
draws of the same mean and sigma. These can (issue #55):

* the **energy score** (Gneiting & Raftery 2007) of the samples over a scene's hidden cells, a
  multivariate CRPS; lower is better;
* the **variogram score** of order 0.5 (Scheuerer & Hamill 2015), which scores the differences
  between pairs of cells, i.e. the spatial structure itself; lower is better;
* the **coverage of 90% intervals of block means**: the mean over each contiguous hidden patch and
  over each block of 8 x 8 cells, against the truth's; the interval is the prediction interval
  of one more draw from ``n`` samples, the samples' block mean +- ``t(0.95, n - 1) sqrt(1 + 1/n)``
  of their standard deviation (Student's t: the mean and s.d. are themselves estimated from the
  ``n`` samples), so that samples drawn from the distribution the truth comes from cover 0.90 in
  expectation. The plain +- 1.645 s.d. covers 0.87 at ``n = 16`` (0.79 for the 5-95% percentiles
  of 16 samples). Independent per-cell draws give a block mean the s.d.
  ``sqrt(sum sigma^2) / n``, far too narrow where errors are correlated.

Each is given beside the same figure for independent per-cell draws from the fill's mean and sigma
(:func:`independent_draws`), so the table says what coherence buys.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage
from scipy.special import stdtrit

#: Cells a side of the square blocks whose means are scored.
BLOCK = 8
#: Hidden cells the variogram score looks at, at most (it scores every pair: quadratic).
VS_CELLS = 1000


def independent_draws(mean: np.ndarray, std: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` draws ``[n, *shape]`` of every cell on its own from ``Normal(mean, std)``."""
    return mean[None] + std[None] * rng.standard_normal((n, *mean.shape))


def patches_and_blocks(hidden: np.ndarray, block: int = BLOCK) -> dict[str, np.ndarray]:
    """Group labels of the hidden cells of a scene ``hidden [R, C]`` (bool): ``{"patch": [M],
    "block": [M]}`` for the ``M`` hidden cells in row-major order, the contiguous hidden patch
    (4-connected) and the ``block x block`` square each lies in."""
    labels, _ = ndimage.label(hidden)
    rows, cols = np.nonzero(hidden)
    per_row = -(-hidden.shape[1] // block)
    return {"patch": labels[hidden], "block": (rows // block) * per_row + cols // block}


def interval_halfwidth(n: int, level: float = 0.90) -> float:
    """Half-width, in the samples' standard deviations (``ddof=1``), of the central ``level``
    prediction interval of one more draw from ``n >= 2`` Gaussian samples:
    ``t((1 + level) / 2, n - 1) * sqrt(1 + 1/n)`` (1.807 at ``n = 16``; 1.645 as ``n`` grows)."""
    return float(stdtrit(n - 1, (1.0 + level) / 2.0) * np.sqrt(1.0 + 1.0 / n))


def block_mean_coverage(truth: np.ndarray, samples: np.ndarray, groups: np.ndarray,
                        min_cells: int = 2) -> tuple[float, int]:
    """Share of groups whose true mean lies in the samples' 90% prediction interval of that mean
    (:func:`interval_halfwidth`).

    Args:
        truth: ``[M]`` the true values of the hidden cells.
        samples: ``[n, M]`` the samples at those cells.
        groups: ``[M]`` a group label per cell (:func:`patches_and_blocks`).
        min_cells: groups with fewer cells are left out (one cell is the per-cell coverage).

    Returns:
        ``(coverage, groups scored)``; NaN coverage when no group has ``min_cells`` cells or
        there are fewer than two samples.
    """
    n = len(samples)
    if n < 2:  # one sample has no spread: no interval
        return float("nan"), 0
    ids, where, counts = np.unique(groups, return_inverse=True, return_counts=True)
    sums = np.stack([np.bincount(where, s, ids.size) for s in samples])  # [n, G]
    means = sums / counts
    true = np.bincount(where, truth, ids.size) / counts
    keep = counts >= min_cells
    if not keep.any():
        return float("nan"), 0
    centre, spread = means.mean(0), means.std(0, ddof=1)
    inside = np.abs(true - centre) <= interval_halfwidth(n) * spread
    return float(inside[keep].mean()), int(keep.sum())


def sample_scores(truth: np.ndarray, samples: np.ndarray, hidden: np.ndarray,
                  rng: np.random.Generator) -> dict[str, float]:
    """Energy score, variogram score and block-mean coverage of ``samples [n, R, C]`` of one scene at
    its ``hidden [R, C]`` cells against ``truth [R, C]``; the spread ratio (the samples' per-cell s.d.
    over their mean) is left to the caller, who knows sigma. The variogram score looks at up to
    :data:`VS_CELLS` hidden cells drawn by ``rng``."""
    import scoringrules as sr

    y, fct = truth[hidden], samples[:, hidden]  # [M], [n, M]
    groups = patches_and_blocks(hidden)
    pick = np.sort(rng.choice(y.size, size=min(VS_CELLS, y.size), replace=False))
    patch, patches = block_mean_coverage(y, fct, groups["patch"])
    block, blocks = block_mean_coverage(y, fct, groups["block"])
    return {"energy": float(sr.es_ensemble(y, fct)), "variogram": float(sr.vs_ensemble(y[pick], fct[:, pick])),
            "patch_cov90": patch, "patches": patches, "block_cov90": block, "blocks": blocks}


def cube_sample_scores(truth: np.ndarray, samples: np.ndarray, mean: np.ndarray, std: np.ndarray,
                       hidden: np.ndarray, seed: int = 0) -> dict[str, float]:
    """:func:`sample_scores` of ``samples [n, T, R, C]`` on every step of a cube with hidden cells
    (``truth``, ``mean``, ``std``, ``hidden``: ``[T, R, C]``), and of as many independent per-cell
    draws from ``mean`` and ``std`` (keys prefixed ``independent_``): energy and variogram scores
    averaged over the steps, block-mean coverages pooled over their groups; plus ``spread_ratio``,
    the median over hidden cells of the samples' s.d. over ``std``."""
    rng = np.random.default_rng([seed, 55])
    n = samples.shape[0]
    parts: dict[str, list] = {}
    for t in np.flatnonzero(hidden.reshape(hidden.shape[0], -1).any(1)):
        draws = {"": samples[:, t], "independent_": independent_draws(mean[t], std[t], n, rng)}
        for prefix, fields in draws.items():
            for key, value in sample_scores(truth[t], fields, hidden[t], np.random.default_rng([seed, int(t)])).items():
                parts.setdefault(prefix + key, []).append(value)
    out: dict[str, float] = {}
    for prefix in ("", "independent_"):
        for key in ("energy", "variogram"):
            out[prefix + key] = float(np.mean(parts[prefix + key]))
        for key, count in (("patch_cov90", "patches"), ("block_cov90", "blocks")):
            weights = np.asarray(parts[prefix + count], float)
            values = np.nan_to_num(np.asarray(parts[prefix + key], float))
            out[prefix + key] = float((values * weights).sum() / weights.sum()) if weights.sum() else float("nan")
    spread = samples[:, hidden].std(0, ddof=1) / std[hidden] if n > 1 else np.full(1, np.nan)
    out["spread_ratio"] = float(np.nanmedian(spread))
    return out
