"""Synthetic cloud masks: smooth random blobs, for hiding cells when a cube has only one scene.

Real clouds are spatially coherent: gaps come in blobs tens of cells across, not as isolated
pixels. Scoring a gap filler on salt-and-pepper gaps flatters it (every hidden cell has an
observed neighbour), so the masks here threshold a smooth Gaussian random field instead:
white noise blurred with a Gaussian kernel, cut at the quantile that gives the cover asked for.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import ndimage


def random_clouds(
    shape: tuple[int, int],
    cover: float,
    rng: np.random.Generator,
    scale: float | tuple[float, float] = 8.0,
) -> np.ndarray:
    """A boolean cloud mask of ``shape`` with a fraction ``cover`` of its cells cloudy (True).

    Args:
        shape: ``(rows, cols)``, each at least 1.
        cover: fraction of cells to cover, strictly between 0 and 1.
        rng: the source of randomness (the mask is a function of its state).
        scale: standard deviation of the smoothing kernel in cells; a pair ``(rows, cols)`` makes
            anisotropic clouds (streaks). Blobs are a few ``scale`` across.

    Returns:
        ``bool [rows, cols]``; exactly ``round(cover * rows * cols)`` cells True up to ties.

    Raises:
        ValueError: a shape that is not two positive integers, a cover outside (0, 1) or a
            scale that is not positive.
    """
    if len(shape) != 2 or any(int(n) != n or n < 1 for n in shape):
        raise ValueError(f"shape must be two positive integers (rows, cols), got {shape!r}")
    if not 0.0 < cover < 1.0:
        raise ValueError(f"cover must be a fraction strictly between 0 and 1, got {cover!r}")
    sigma = np.broadcast_to(np.asarray(scale, dtype=float), (2,))
    if np.any(sigma <= 0):
        raise ValueError(f"scale must be positive (cells), got {scale!r}")
    noise = rng.standard_normal(tuple(int(n) for n in shape))
    # "wrap" keeps the field stationary up to the edges: "reflect" would make edge blobs
    # mirror images, slightly larger than interior ones.
    field = ndimage.gaussian_filter(noise, sigma=tuple(sigma), mode="wrap")
    # Rank-based threshold rather than np.quantile: it hits the cover to the cell.
    n_cloud = int(round(cover * field.size))
    mask = np.zeros(field.size, dtype=bool)
    if n_cloud:
        mask[np.argpartition(field.ravel(), field.size - n_cloud)[field.size - n_cloud:]] = True
    return mask.reshape(field.shape)


#: Marks in ``borrow_gaps``'s donors: synthetic clouds, and a step left untouched.
DONOR_CLOUDS, DONOR_NONE = -1, -2
#: A step hidden under a mask the caller gave (``geonp.evaluate.evaluate``'s ``hide_under``).
DONOR_GIVEN = -3
CLOUD_TRIES = 10  # synthetic cloud draws per step before settling for the nearest acceptable one


def borrow_gaps(
    observed: np.ndarray,
    gaps: np.ndarray,
    rng: np.random.Generator,
    *,
    low: float = 0.10,
    high: float = 0.5,
    cover: float = 0.3,
    min_observed: int = 50,
    steps: np.ndarray | list[int] | None = None,
    move_repeats: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Cells to hide in each step of a stack: its observed cells under another step's real gaps.

    For each step ``t`` (of ``steps``, default all) with at least ``min_observed`` observed
    cells, a donor step ``s != t`` is drawn among those whose gaps would hide between ``low`` and
    ``high`` of ``t``'s observed cells. Without one (a single scene, a gap-free stack) the step
    gets :func:`random_clouds` of ``cover`` instead, redrawn up to 10 times until it hides
    ``low`` to ``high`` (else the largest draw below ``high``).

    Args:
        observed, gaps: bool ``[S, R, C]``: cells holding a value, and cells that could but do not
            (a real gap inside the valid area).
        rng: the randomness (donor choice, clouds); same state, same result.
        low, high: the share of a step's observed cells to hide, ``0 <= low < high < 1``.
        cover: cloud fraction of the synthetic clouds (keep it within ``low`` to ``high``: a
            draw that hides more than ``high`` is refused).
        min_observed: steps with fewer observed cells are left untouched.
        steps: the steps to hide cells in; the others are only donors.
        move_repeats: a donor drawn again hides its gaps moved by a random offset (cyclic over
            the grid, redrawn up to 10 times until it hides ``low`` to ``high``), so no two steps
            lose the same cells to one donor. Where a stack has one real cloud (a gap-free field
            under one borrowed mask) every step would otherwise lose the same place, a hole in
            the whole history that the fill itself never faces.

    Returns:
        ``(hidden, donors)``: bool ``[S, R, C]`` (True: hide), and int ``[S]``: each step's donor,
        ``DONOR_CLOUDS`` (-1) for synthetic clouds, ``DONOR_NONE`` (-2) for untouched.
    """
    observed, gaps = np.asarray(observed, bool), np.asarray(gaps, bool)
    n_steps, ny, nx = observed.shape
    if steps is not None and any(not 0 <= int(s) < n_steps for s in steps):
        raise ValueError(f"steps to hide must be in 0..{n_steps - 1}, got {list(steps)}")
    n_obs = observed.sum(axis=(1, 2))
    gap_rows = gaps.reshape(n_steps, -1).astype(np.float32)
    hidden = np.zeros_like(observed)
    donors = np.full(n_steps, DONOR_NONE, dtype=np.int64)
    used = np.zeros(n_steps, bool)
    for t in range(n_steps) if steps is None else [int(s) for s in steps]:
        if n_obs[t] < min_observed:
            continue
        # Share of t's observed cells that each step's gaps would hide (one matrix product).
        share = gap_rows @ observed[t].ravel().astype(np.float32) / n_obs[t]
        share[t] = np.nan
        usable = np.flatnonzero((share >= low) & (share <= high))
        if usable.size:
            donors[t] = int(rng.choice(usable))
            hidden[t] = gaps[donors[t]] & observed[t]
            if move_repeats and used[donors[t]]:
                moved = _within(lambda donor=gaps[donors[t]], seen=observed[t]: seen & moved_randomly(donor, rng),
                                n_obs[t], low, high)
                hidden[t] = hidden[t] if moved is None else moved
            used[donors[t]] = True
            continue
        clouds = _within(lambda seen=observed[t]: random_clouds((ny, nx), cover, rng) & seen, n_obs[t], low, high)
        if clouds is not None:
            hidden[t], donors[t] = clouds, DONOR_CLOUDS
    return hidden, donors


def moved_randomly(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``mask [R, C]`` rolled by a random offset (cyclic over the grid): the same cloud shapes at
    another place, for hiding cells where a real gap pattern should not fall where it fell."""
    return np.roll(mask, (int(rng.integers(mask.shape[0])), int(rng.integers(mask.shape[1]))), axis=(0, 1))


def _within(draw: Callable[[], np.ndarray], n_observed: int, low: float, high: float) -> np.ndarray | None:
    """The first of :data:`CLOUD_TRIES` masks ``draw()`` gives that hides ``low`` to ``high`` of a
    step's ``n_observed`` cells, else the largest below ``high``, else None."""
    best, best_share = None, 0.0
    for _ in range(CLOUD_TRIES):
        mask = draw()
        share = mask.sum() / n_observed
        if low <= share <= high:
            return mask
        if best_share < share <= high:
            best, best_share = mask, share
    return best
