"""The large scale of a field: a coarse pass that carries each cloud's rims across it.

A model that fills a cell from the observations around it sees a wide cloud's far side only
through its nearest few, and deep inside, ordinary kriging levels off to their mean where the
field keeps sloping (issue: history and the large scale). Interpolation across the whole image
does not have that fault: a plane through the rims follows the slope. :func:`coarse_trend` is that
plane at a coarse scale: each step's observed cells averaged in blocks of ``factor x factor``
cells (so a cloud 100 cells wide is a dozen blocks, and the blocks' noise is averaged away),
the block means interpolated linearly across the whole step (Delaunay triangles, the nearest
block beyond their hull), and read back at every cell. As a model covariate
(:func:`geonp.tasks.history.history_covariates`, name ``coarse``) it enters a kriging head's
external drift: next to observations the kriging of the residuals keeps the fine detail, deep
inside a cloud the fill follows the coarse surface.

Cost: one triangulation of the block means per step, ``O(cells / factor^2)``, and one linear
read per cell, a band of rows at a time (memory: the stack in float64, plus a band).

The surface at a cell comes from the block means around it, its own block's included: unlike the
history covariates it is not computed without the cell, so fine-tuning on a scene's own cells
hidden under clouds meets it slightly better informed than a real gap does.
"""

from __future__ import annotations

import numpy as np
from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator
from scipy.spatial import QhullError

#: Block size (cells): one unit of the infill windows' input scaling (8 cells per unit).
COARSE_FACTOR = 8
#: Cells read from the surface at a time, in whole rows (bounds the memory of the read).
BAND_CELLS = 1_000_000
#: A block holds a mean when at least this share of its valid cells is observed (else its few
#: cells would stand for the whole block: the rims of a cloud are thin).
MIN_BLOCK_SHARE = 0.25


def coarse_trend(values: np.ndarray, valid: np.ndarray | None = None, factor: int = COARSE_FACTOR,
                 band_cells: int = BAND_CELLS) -> np.ndarray:
    """Each step's coarse surface, read at every cell.

    Args:
        values: ``[T, R, C]`` the field, NaN at gaps, any units.
        valid: bool ``[R, C]`` or ``[T, R, C]``, True where a value can exist; None: everywhere.
        factor: block size in cells (at least 1).
        band_cells: about how many cells of the surface are read at once (whole rows): bounds the
            read's memory, never changes the result.

    Returns:
        float64 ``[T, R, C]``: the linear interpolation of the step's block means (the nearest block
        mean beyond their hull; the step's own mean when the blocks span no triangle: fewer than
        three, or all in a line); NaN on a step with no observed cell.

    Raises:
        ValueError: a stack that is not 3-D, a mask that does not fit it, or ``factor`` below 1.
    """
    values = np.asarray(values, np.float64)
    if values.ndim != 3:
        raise ValueError(f"coarse_trend needs a [time, rows, cols] stack, got shape {values.shape}")
    if factor < 1:
        raise ValueError(f"coarse_trend block size must be at least 1 cell, got {factor}")
    ok = np.ones(values.shape[1:], bool) if valid is None else np.asarray(valid, bool)
    if ok.shape not in (values.shape, values.shape[1:]):
        raise ValueError(f"valid mask of shape {ok.shape} does not match the stack {values.shape}")
    ok = np.broadcast_to(ok, values.shape)
    rows, cols = values.shape[1:]
    out = np.full(values.shape, np.nan)
    for t in range(len(values)):
        seen = np.isfinite(values[t]) & ok[t]
        if not seen.any():
            continue
        points, means = _block_means(values[t], seen, ok[t], factor)
        surface = _surface(points, means)
        if surface is None:  # too few blocks, or all in a line: the step's mean is its large scale
            out[t] = values[t][seen].mean()
            continue
        band = max(1, band_cells // cols)
        c = (np.arange(cols) + 0.5) / factor  # cell centres in block units, so the triangles are as wide as the blocks
        for start in range(0, rows, band):
            r = (np.arange(start, min(rows, start + band)) + 0.5) / factor
            where = np.stack(np.broadcast_arrays(r[:, None], c[None, :]), -1).reshape(-1, 2)
            out[t, start:start + len(r)] = surface(where).reshape(len(r), cols)
    return out


def _surface(points: np.ndarray, means: np.ndarray):
    """The linear interpolant of ``means`` at block centres ``points [M, 2]``, the nearest block's mean
    beyond their hull, as a function of ``[N, 2]`` places; None when the centres span no triangle."""
    if len(means) < 3:
        return None
    try:
        linear = LinearNDInterpolator(points, means)
    except QhullError:  # the centres lie on one line (a transect, a scene one block high)
        return None
    nearest = NearestNDInterpolator(points, means)

    def read(where: np.ndarray) -> np.ndarray:
        values = linear(where)
        outside = ~np.isfinite(values)
        if outside.any():
            values[outside] = nearest(where[outside])
        return values

    return read


def _block_means(step: np.ndarray, seen: np.ndarray, ok: np.ndarray, factor: int) -> tuple[np.ndarray, np.ndarray]:
    """Block centres ``[M, 2]`` (block units) and means ``[M]`` of the blocks with enough observed cells."""
    rows, cols = step.shape
    nr, nc = -(-rows // factor), -(-cols // factor)
    pad = ((0, nr * factor - rows), (0, nc * factor - cols))

    def blocks(a: np.ndarray) -> np.ndarray:  # [R, C] -> [nr, nc] sums over factor x factor blocks
        return np.pad(a, pad).reshape(nr, factor, nc, factor).sum((1, 3))

    total = blocks(np.where(seen, step, 0.0))
    count, possible = blocks(seen.astype(np.float64)), blocks(ok.astype(np.float64))
    keep = (count > 0) & (count >= MIN_BLOCK_SHARE * possible)
    if keep.sum() < 3:  # a sparse step (stations, a sliver of sea): every block with a value counts
        keep = count > 0
    # The centre of a block's observed cells, not of the block: a rim block's mean sits where its cells are.
    centre_r = blocks(seen * (np.arange(rows, dtype=np.float32) + 0.5)[:, None])[keep] / count[keep] / factor
    centre_c = blocks(seen * (np.arange(cols, dtype=np.float32) + 0.5)[None, :])[keep] / count[keep] / factor
    return np.stack([centre_r, centre_c], -1), total[keep] / count[keep]
