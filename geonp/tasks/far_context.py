"""Far context: observed cells beyond a window's halo, coarsened with distance, so that context
surrounds the targets of gaps wider than the halo.

A window sees every observed cell within ``halo`` cells of its prediction region (its *view*,
see :mod:`geonp.tasks.windows`). Inside a cloud wider than twice the halo that leaves a window
with context on one side only, or none at all (its gaps then got the variable's global mean).
The far ring reaches further, only where the view does not surround the targets:

* **Which windows.** The four *sides* of the prediction box are the half-planes beyond its
  edges (rows above, rows below, columns left, columns right), over the window's time range. A
  side is *covered* when, within reach, it holds at least :data:`MIN_FAR` observed cells or no
  gap cell (nothing there is hidden: land, the cube's edge). A window whose view covers all four
  sides, and holds some context, gets no far points and sees exactly what it saw before.
* **How far.** Each uncovered side's reach doubles, 2, 4, 8, ... times the halo, until the side
  is covered or the reach spans the cube. A window with still no context at all then reaches
  every way until some observation is in reach, so a window whose time range holds an
  observation anywhere on the cube never falls back to the global mean.
* **What.** The cells outside the view are tiled by the blocks of a quadtree aligned to the cube
  (``2**j`` cells wide, starting at cell 0, so the tiling depends on the cube and the window
  only, never on which output block asked). A block at Chebyshev distance ``d`` cells from the
  prediction box is used whole when it lies outside the view and is at most ``d / OPENING``
  cells wide, else its four children are tried (Barnes-Hut's opening rule); every cell outside
  the view lies in exactly one used block. Per time step, a used block with observed cells gives
  one far point: the mean of those cells, placed at the observed cell nearest their mean
  location (a whole cell, so model inputs stay on the lattice ConvCNP's grid path needs). Above
  the finest level it is the nearest to the mean of the four children's cells (cheap, and still
  an observed cell of the block, though not always the nearest one). Finest blocks straddling
  the view's edge are summarised from the raw slab over their cells outside the view.
* **Cost.** A :class:`Pyramid` of per-time-step block counts, means and cells at ``2**finest``,
  ``2**(finest + 1)``, ... cells is built once per field (about 2 bytes per cube cell at the
  default halo); a window's far points come from it in a few vectorised steps per level.
* **Budget.** Far points take at most ``max_context // FAR_SHARE`` of a window's context (the
  caller thins the near cells, nearest to the prediction region kept, to make room). Beyond that
  the quadtree is coarsened (``OPENING`` halved) until they fit, and at last cut by distance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import dask
import numpy as np
import xarray as xr

#: A quadtree block is used whole when it is at most ``d / OPENING`` cells wide, ``d`` its
#: Chebyshev distance in cells from the prediction box: far points per cell fall as ``(OPENING/d)**2``.
OPENING = 2.0
#: Observed cells (summed over the window's time range) a side needs in reach before its reach stops.
MIN_FAR = 64
#: Far points take at most ``max_context // FAR_SHARE`` of a window's context.
FAR_SHARE = 4
#: Times the quadtree is coarsened (``OPENING`` halved) before far points beyond the cap are cut by distance.
COARSEN_TRIES = 3
#: Cube cells read at once while building a pyramid (time steps, or bands of rows of one step).
READ_CELLS = 1 << 21


def finest_level(halo: tuple[int, int]) -> int:
    """The finest pyramid level for a ``(rows, cols)`` halo: blocks of ``2**j`` cells, ``j >= 1``.

    The largest ``j`` with ``OPENING * 2**j <= halo + 1``, so that a finest block wholly outside
    the view passes the opening rule and only blocks straddling the view's edge need raw cells.
    """
    return max(1, math.floor(math.log2(max((min(halo) + 1) / OPENING, 1.0))))


def slab_margin(halo: tuple[int, int]) -> tuple[int, int]:
    """Cells beyond the view, ``(rows, cols)``, that the raw slab must hold for the straddling blocks."""
    s = 1 << finest_level(halo)
    return tuple(max(h, math.ceil(OPENING * s) - 1) + s - 1 - h for h in halo)  # type: ignore[return-value]


@dataclass
class Pyramid:
    """Per-time-step summaries of a ``[T, R, C]`` field's cells over aligned square blocks.

    Level ``j`` (``finest <= j <= top``, list index ``j - finest``) has blocks of ``2**j`` cells
    a side, block ``(i, k)`` covering rows ``[i 2**j, (i + 1) 2**j)`` and columns alike, clipped
    to the cube. Per level, arrays ``[T, ceil(R / 2**j), ceil(C / 2**j)]``: ``count`` observed
    cells (int32), ``mean`` their mean value (float64, user units, 0 where none), ``row`` and
    ``col`` a representative observed cell (int32, cube coordinates), ``gaps`` missing cells
    inside the valid area (int32). ``top`` is the first level with one block over the cube.
    """

    shape: tuple[int, int, int]
    finest: int
    count: list[np.ndarray]
    mean: list[np.ndarray]
    row: list[np.ndarray]
    col: list[np.ndarray]
    gaps: list[np.ndarray]

    @property
    def top(self) -> int:
        return self.finest + len(self.count) - 1


def build_pyramid(data: xr.DataArray, valid: np.ndarray, finest: int, read_cells: int = READ_CELLS) -> Pyramid:
    """Summarise ``data`` (lazy ``[T, R, C]``, NaN missing) with ``valid`` (``[R, C]`` or ``[T, R, C]``
    bool) into a :class:`Pyramid`, reading about ``read_cells`` cells at a time (whole time steps,
    or bands of rows of one step), so memory follows the pyramid, not the cube; the pyramid is the
    same for any ``read_cells``."""
    t_n, r_n, c_n = data.shape
    top = max(finest, math.ceil(math.log2(max(r_n, c_n, 2))))
    sizes = [(t_n, -(-r_n >> j), -(-c_n >> j)) for j in range(finest, top + 1)]
    pyr = Pyramid((t_n, r_n, c_n), finest, [np.zeros(s, np.int32) for s in sizes],
                  [np.zeros(s) for s in sizes], [np.zeros(s, np.int32) for s in sizes],
                  [np.zeros(s, np.int32) for s in sizes], [np.zeros(s, np.int32) for s in sizes])
    s = 1 << finest
    step = max(1, read_cells // (r_n * c_n))  # time steps per read
    band = max(s, read_cells // c_n // s * s)  # rows per read: whole finest blocks
    for t0 in range(0, t_n, step):
        t1 = min(t0 + step, t_n)
        parts = []
        for r0 in range(0, r_n, band):
            r1 = min(r0 + band, r_n)
            with dask.config.set(scheduler="synchronous"):  # the caller decides the parallelism
                values = np.asarray(data[t0:t1, r0:r1].values, dtype=np.float64)
            ok = valid[t0:t1, r0:r1] if valid.ndim == 3 else valid[None, r0:r1]
            finite = np.isfinite(values)
            parts.append(_finest_blocks(np.where(finite, values, 0.0), finite & ok, ~finite & ok, s, r0))
        level = tuple(np.concatenate(p, axis=1) for p in zip(*parts))
        for i in range(len(sizes)):
            if i:
                level = _coarsen(*level)
            count, mean, row, col, gaps, _, _ = level
            for out, part in zip((pyr.count, pyr.mean, pyr.row, pyr.col, pyr.gaps), (count, mean, row, col, gaps)):
                out[i][t0:t1] = part
    return pyr


def _finest_blocks(values: np.ndarray, observed: np.ndarray, missing: np.ndarray, s: int,
                   row0: int = 0) -> tuple[np.ndarray, ...]:
    """``(count, mean, row, col, gaps, mean_row, mean_col)`` of ``[T, R, C]`` cells over ``s``-cell
    blocks; the first row is the cube's row ``row0`` (a multiple of ``s``)."""
    t_n, r_n, c_n = values.shape
    nr, nc = -(-r_n // s), -(-c_n // s)
    pad = ((0, 0), (0, nr * s - r_n), (0, nc * s - c_n))

    def blocks(a: np.ndarray) -> np.ndarray:  # [T, R, C] -> [T, nr, nc, s, s]
        return np.pad(a, pad).reshape(t_n, nr, s, nc, s).transpose(0, 1, 3, 2, 4)

    obs = blocks(observed)
    count = obs.sum((3, 4))
    safe = np.maximum(count, 1)
    mean = blocks(values * observed).sum((3, 4)) / safe
    a = np.arange(s, dtype=np.float64)
    mean_r = (obs * a[:, None]).sum((3, 4)) / safe  # within the block
    mean_c = (obs * a[None, :]).sum((3, 4)) / safe
    dist2 = (a[:, None] - mean_r[..., None, None]) ** 2 + (a[None, :] - mean_c[..., None, None]) ** 2
    nearest = np.where(obs, dist2, np.inf).reshape(t_n, nr, nc, s * s).argmin(-1)  # ties: first in row order
    base_r, base_c = row0 + np.arange(nr)[:, None] * s, np.arange(nc)[None, :] * s
    return (count.astype(np.int32), mean, (base_r + nearest // s).astype(np.int32),
            (base_c + nearest % s).astype(np.int32), blocks(missing).sum((3, 4)).astype(np.int32),
            base_r + mean_r, base_c + mean_c)


def _coarsen(count, mean, row, col, gaps, mean_r, mean_c) -> tuple[np.ndarray, ...]:
    """The next level up: 2 x 2 children summed; the representative is the nearest child's cell."""
    t_n, nr, nc = count.shape
    pad = ((0, 0), (0, nr % 2), (0, nc % 2))

    def quads(a: np.ndarray) -> np.ndarray:  # [T, nr, nc] -> [T, nr/2, nc/2, 4]
        a = np.pad(a, pad)
        return a.reshape(t_n, a.shape[1] // 2, 2, a.shape[2] // 2, 2).transpose(0, 1, 3, 2, 4).reshape(
            t_n, a.shape[1] // 2, a.shape[2] // 2, 4)

    n = quads(count).astype(np.float64)
    total = n.sum(-1)
    safe = np.maximum(total, 1)
    up_mean = (quads(mean) * n).sum(-1) / safe
    up_r, up_c = (quads(mean_r) * n).sum(-1) / safe, (quads(mean_c) * n).sum(-1) / safe
    rows, cols = quads(row), quads(col)
    dist2 = np.where(n > 0, (rows - up_r[..., None]) ** 2 + (cols - up_c[..., None]) ** 2, np.inf)
    pick = dist2.argmin(-1)[..., None]
    return (total.astype(np.int32), up_mean, np.take_along_axis(rows, pick, -1)[..., 0],
            np.take_along_axis(cols, pick, -1)[..., 0], quads(gaps).sum(-1).astype(np.int32), up_r, up_c)


@dataclass
class Slab:
    """Raw cells read around an output block: ``values`` (NaN missing), ``observed`` and ``missing``
    (inside the valid area), each ``[T, R, C]``, whose cell ``[0, 0, 0]`` is the cube's ``origin``;
    ``shape`` is the whole cube's."""

    values: np.ndarray
    observed: np.ndarray
    missing: np.ndarray
    origin: tuple[int, int, int]
    shape: tuple[int, int, int]

    def cut(self, *ranges: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(values, observed, missing)`` over cube ranges ``(t0, t1), (r0, r1), (c0, c1)``."""
        key = tuple(slice(a - o, b - o) for (a, b), o in zip(ranges, self.origin))
        if any(k.start < 0 or k.stop > n for k, n in zip(key, self.values.shape)):
            raise ValueError(f"far context: cells {ranges} are not all in the slab read at {self.origin}")
        return self.values[key], self.observed[key], self.missing[key]


@dataclass
class _Items:
    """Candidate far points of one window: ``N`` blocks, each over the ``Tn`` steps of its time range.

    ``dist [N]`` cells from the prediction box, ``sides [N, 4]`` (above, below, left, right),
    ``count``/``gaps``/``row``/``col`` ``[Tn, N]`` as in :class:`Pyramid`, ``mean [S, Tn, N]`` that of
    each source (the field, then :func:`far_points`' ``others``) over the same observed cells.
    """

    dist: np.ndarray
    sides: np.ndarray
    count: np.ndarray
    gaps: np.ndarray
    mean: np.ndarray
    row: np.ndarray
    col: np.ndarray


def far_points(pyramid: Callable[[], Pyramid], slab: Slab, predicted: list[tuple[int, int]],
               seen_time: tuple[int, int], halo: tuple[int, int], max_points: int,
               others: Sequence[tuple[Callable[[], Pyramid], Slab]] = ()) -> tuple[np.ndarray, np.ndarray]:
    """One window's far points: cells ``[Nf, 3]`` (int64 ``t, row, col``, cube coordinates) and
    values ``[1 + len(others), Nf]``: the field's, then each other source's mean over the same cells.

    Args:
        pyramid: returns the field's :class:`Pyramid` (called only when the view falls short).
        slab: raw cells holding the window's view plus :func:`slab_margin`.
        predicted: the window's prediction ranges ``[(t0, t1), (r0, r1), (c0, c1)]`` (cube cells).
        seen_time: the window's time range ``(t0, t1)``; far points come from these steps only.
        halo: the view's margin ``(rows, cols)`` beyond the prediction box.
        max_points: the most far points to return (``>= 0``).
        others: more sources summarised over the field's observed cells (a history covariate),
            each a getter of its :class:`Pyramid` (built on the field's observed cells; only its
            means are read, and like ``pyramid`` it is called only when the view falls short) and
            its slab (read at the field's observed cells only): the selection runs once, on the
            field, and each far point carries every source's mean.

    Empty when the view covers every side (see the module docstring). Ordered by time, then
    nearness, so the same window gives the same points in the same order.
    """
    _, (r0, r1), (c0, c1) = predicted
    hr, hc = halo
    _, rows_n, cols_n = slab.shape
    view_r, view_c = (max(r0 - hr, 0), min(r1 + hr, rows_n)), (max(c0 - hc, 0), min(c1 + hc, cols_n))
    _, observed, missing = slab.cut(seen_time, view_r, view_c)
    near_obs = _side_sums(observed.sum(0), view_r[0], view_c[0], (r0, r1), (c0, c1))
    near_gap = _side_sums(missing.sum(0), view_r[0], view_c[0], (r0, r1), (c0, c1))
    near_total = int(observed.sum())
    empty = np.zeros((0, 3), np.int64), np.zeros((1 + len(others), 0))
    if max_points < 1 or (near_total and _covered(near_obs, near_gap).all()):
        return empty
    pyr = pyramid()
    sources = [(get(), other) for get, other in others]
    base = max(hr, hc, 1)
    radii = [-1]  # -1: the view alone
    while radii[-1] < max(rows_n, cols_n):
        radii.append(base << len(radii))
    opening = OPENING
    for _ in range(COARSEN_TRIES + 1):
        items = _items(pyr, slab, predicted, seen_time, halo, opening, sources)
        cells, values, dist = _select(items, np.asarray(radii), near_obs, near_gap, near_total, seen_time[0])
        if len(cells) <= max_points:
            return cells, values
        opening /= 2  # blocks twice as wide at each distance: about a quarter as many points
    keep = np.sort(np.argsort(dist, kind="stable")[:max_points])
    return cells[keep], values[:, keep]


def _side_sums(counts: np.ndarray, r_origin: int, c_origin: int, rows: tuple[int, int],
               cols: tuple[int, int]) -> np.ndarray:
    """Sums of ``counts [R, C]`` (cube cell ``(r_origin, c_origin)`` first) above, below, left and right of the box."""
    top, bottom = max(rows[0] - r_origin, 0), max(rows[1] - r_origin, 0)
    left, right = max(cols[0] - c_origin, 0), max(cols[1] - c_origin, 0)
    return np.array([counts[:top].sum(), counts[bottom:].sum(), counts[:, :left].sum(), counts[:, right:].sum()])


def _covered(obs: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    return (obs >= MIN_FAR) | (gaps == 0)


def _distance(lo: np.ndarray, hi: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Cells between the nearest cells of ranges ``[lo, hi]`` (inclusive) and ``[start, stop)`` (0 if they meet)."""
    return np.maximum(np.maximum(start - hi, lo - (stop - 1)), 0)


def _items(pyr: Pyramid, slab: Slab, predicted: list[tuple[int, int]], seen_time: tuple[int, int],
           halo: tuple[int, int], opening: float, others: Sequence[tuple[Pyramid, Slab]] = ()) -> _Items:
    """Walk the quadtree from the top: blocks outside the view that pass the opening rule are used,
    the others are split; finest blocks that fail it but reach beyond the view come from the slab.
    ``others``: more sources' pyramids and slabs, whose means are gathered for the same blocks."""
    (t0, t1), (r0, r1), (c0, c1) = seen_time, *predicted[1:]
    hr, hc = halo
    _, rows_n, cols_n = pyr.shape
    parts = []
    j = pyr.top
    n_r, n_c = pyr.count[-1].shape[1:]
    bi, bk = (a.ravel() for a in np.meshgrid(np.arange(n_r), np.arange(n_c), indexing="ij"))
    while True:
        s = 1 << j
        lo_r, lo_c = bi * s, bk * s
        hi_r, hi_c = np.minimum(lo_r + s, rows_n) - 1, np.minimum(lo_c + s, cols_n) - 1
        dr, dc = _distance(lo_r, hi_r, r0, r1), _distance(lo_c, hi_c, c0, c1)
        used = ((dr > hr) | (dc > hc)) & (np.maximum(dr, dc) >= opening * s)
        level = j - pyr.finest
        at = (slice(t0, t1), bi[used], bk[used])
        sides = np.stack([hi_r < r0, lo_r >= r1, hi_c < c0, lo_c >= c1], 1)[used]
        means = np.stack([p.mean[level][at] for p in (pyr, *(o for o, _ in others))])  # [S, Tn, N]
        parts.append(_Items(np.maximum(dr, dc)[used], sides, pyr.count[level][at], pyr.gaps[level][at],
                            means, pyr.row[level][at], pyr.col[level][at]))
        rest = ~used
        if j == pyr.finest:
            # Farthest cells of each block: a block reaching beyond the view has cells no level covers.
            far_r = np.maximum(np.maximum(r0 - lo_r, hi_r - (r1 - 1)), 0)
            far_c = np.maximum(np.maximum(c0 - lo_c, hi_c - (c1 - 1)), 0)
            band = rest & ((far_r > hr) | (far_c > hc))
            if band.any():
                parts.append(_band(slab, bi[band], bk[band], s, predicted, seen_time, halo,
                                   [o for _, o in others]))
            break
        bi = (2 * bi[rest, None] + np.array([0, 0, 1, 1])).ravel()
        bk = (2 * bk[rest, None] + np.array([0, 1, 0, 1])).ravel()
        n_r, n_c = pyr.count[level - 1].shape[1:]
        inside = (bi < n_r) & (bk < n_c)
        bi, bk = bi[inside], bk[inside]
        j -= 1
    axis = {"dist": 0, "sides": 0, "mean": 2}  # the blocks' axis: N
    return _Items(*(np.concatenate([getattr(p, f) for p in parts], axis=axis.get(f, 1))
                    for f in ("dist", "sides", "count", "gaps", "mean", "row", "col")))


def _band(slab: Slab, bi: np.ndarray, bk: np.ndarray, s: int, predicted: list[tuple[int, int]],
          seen_time: tuple[int, int], halo: tuple[int, int], others: Sequence[Slab] = ()) -> _Items:
    """Finest blocks ``(bi, bk)`` straddling the view, summarised over their cells outside it (raw
    slab; ``others``: more sources' slabs, averaged over the same cells)."""
    _, (r0, r1), (c0, c1) = predicted
    _, rows_n, cols_n = slab.shape
    rows = (int(bi.min()) * s, min((int(bi.max()) + 1) * s, rows_n))
    cols = (int(bk.min()) * s, min((int(bk.max()) + 1) * s, cols_n))
    values, observed, missing = slab.cut(seen_time, rows, cols)
    rr, cc = np.arange(*rows), np.arange(*cols)
    label = np.full((bi.max() - bi.min() + 1, bk.max() - bk.min() + 1), -1)
    label[bi - bi.min(), bk - bk.min()] = np.arange(bi.size)
    cell_label = label[(rr // s - bi.min())[:, None], (cc // s - bk.min())[None, :]]  # [R, C] block or -1
    outside = (_distance(rr, rr, r0, r1) > halo[0])[:, None] | (_distance(cc, cc, c0, c1) > halo[1])[None, :]
    use = (cell_label >= 0) & outside
    nb, t_n = bi.size, observed.shape[0]
    t, i, k = np.nonzero(observed & use)
    group = t * nb + cell_label[i, k]
    count = np.bincount(group, minlength=t_n * nb)
    safe = np.maximum(count, 1)
    sources = [values, *(o.cut(seen_time, rows, cols)[0] for o in others)]
    mean = np.stack([np.bincount(group, v[t, i, k], t_n * nb) / safe for v in sources])  # [S, Tn * nb]
    mean_r = np.bincount(group, rr[i], t_n * nb) / safe
    mean_c = np.bincount(group, cc[k], t_n * nb) / safe
    dist2 = (rr[i] - mean_r[group]) ** 2 + (cc[k] - mean_c[group]) ** 2
    order = np.lexsort((dist2, group))  # per group, nearest to its mean first (ties: row order)
    first = order[np.r_[True, group[order][1:] != group[order][:-1]]] if order.size else order
    row, col = np.zeros(t_n * nb, np.int64), np.zeros(t_n * nb, np.int64)
    row[group[first]], col[group[first]] = rr[i[first]], cc[k[first]]
    tg, ig, kg = np.nonzero(missing & use)
    gaps = np.bincount(tg * nb + cell_label[ig, kg], minlength=t_n * nb)
    lo_r, lo_c = bi * s, bk * s
    hi_r, hi_c = np.minimum(lo_r + s, rows_n) - 1, np.minimum(lo_c + s, cols_n) - 1
    sides = np.stack([hi_r < r0, lo_r >= r1, hi_c < c0, lo_c >= c1], 1)
    sides[~sides.any(1)] = True  # a block overlapping the box (halo below the block width) counts for all
    dist = np.maximum(_distance(lo_r, hi_r, r0, r1), _distance(lo_c, hi_c, c0, c1))
    shaped = (t_n, nb)
    return _Items(dist, sides, count.reshape(shaped), gaps.reshape(shaped), mean.reshape(len(sources), *shaped),
                  row.reshape(shaped), col.reshape(shaped))


def _select(items: _Items, radii: np.ndarray, near_obs: np.ndarray, near_gap: np.ndarray, near_total: int,
            t_start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grow each side's reach through ``radii`` until covered; the points in reach (cells ``[Nf, 3]``,
    every source's values ``[S, Nf]``), with their distances ``[Nf]``."""
    obs, gaps = items.count.sum(0), items.gaps.sum(0)  # [N] over the time range
    within = items.dist[None, :] <= radii[:, None]  # [K, N]
    side_in = (within[:, :, None] & items.sides[None]).astype(np.int64)  # [K, N, 4]
    covered = _covered(near_obs + np.einsum("kns,n->ks", side_in, obs),
                       near_gap + np.einsum("kns,n->ks", side_in, gaps))  # [K, 4]
    last = len(radii) - 1
    reach = radii[np.where(covered.any(0), covered.argmax(0), last)]  # [4]
    chosen = (items.sides & (items.dist[:, None] <= reach[None, :])).any(1)
    if near_total + obs[chosen].sum() == 0:  # no context yet: reach every way until something is found
        found = (within * obs).sum(1) > 0
        chosen |= items.dist <= radii[found.argmax() if found.any() else last]
    t, n = np.nonzero(chosen[None, :] & (items.count > 0))
    order = np.lexsort((items.row[t, n], items.col[t, n], items.dist[n], t))
    t, n = t[order], n[order]
    cells = np.stack([t + t_start, items.row[t, n], items.col[t, n]], 1).astype(np.int64)
    return cells, items.mean[:, t, n].astype(np.float64), items.dist[n]
