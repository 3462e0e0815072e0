"""Synthetic cloud masks: smooth random blobs, for hiding cells when a cube has only one scene.

Real clouds are spatially coherent: gaps come in blobs tens of cells across, not as isolated
pixels. Scoring a gap filler on salt-and-pepper gaps flatters it (every hidden cell has an
observed neighbour), so the masks here threshold a smooth Gaussian random field instead:
white noise blurred with a Gaussian kernel, cut at the quantile that gives the cover asked for.
"""

from __future__ import annotations

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
