"""Windows over a gridded cube, and how one window becomes a context/target task.

A cube variable is handled as a ``[time, rows, cols]`` array (a single scene has one time
step). It is covered by a regular grid of *windows*. Along each axis window ``k`` predicts the
cells ``[k*core - overlap//2, (k+1)*core + overlap - overlap//2)``: neighbouring windows share
``overlap`` cells, and in that band their predictions are blended with linear tapers that sum
to one, so there is no seam where one window hands over to the next. Each window sees as
context every observed cell within ``halo`` cells beyond its prediction region, so a target
near a window edge still has data all around it.

The grid is global (it depends on the cube's shape only), so a cell's prediction is the same
whichever block of the output it is computed in: blocks can run in any order, in parallel, or
be resumed after a kill, and the result does not change.

Model inputs are offsets from the window's centre cell in *grid units*: time in steps /
``steps_per_unit``, rows and columns in cells / ``cells_per_unit`` (plus elevation in km when
the model takes it). The centre is rounded down to a whole cell, so every cell's input is a
whole multiple of ``1 / cells_per_unit``: a lattice, which the ConvCNP's grid path needs.
Working in grid units rather than degrees or metres is what lets one set
of weights fill a 1 km satellite scene and a 1 degree reanalysis alike. Values are
standardised per window by the context's mean and spread, shrunk towards the whole variable's
spread when the window has few observations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
import xarray as xr

from geonp.data.cube import horizontal_dims
from geonp.tasks.batch import Batch

#: Cells per block at most: larger input chunks are split (aligned) so memory follows the block.
MAX_BLOCK_CELLS = 1 << 21
#: The one-step axis a field without time gets when other fields of its cube have a time axis
#: (a single scene without time gets ``time`` itself).
STATIC_STEP = "geonp_static_step"
#: Rows and columns of a block of an in-memory input (:func:`default_chunks`).
DEFAULT_TILE = (256, 256)
#: Cells a block of an in-memory input holds: steps of a grid smaller than a tile share a block.
DEFAULT_BLOCK_CELLS = DEFAULT_TILE[0] * DEFAULT_TILE[1]
#: Fewer hidden or context cells than this and a drawn training window is discarded.
MIN_POINTS = 8
#: Pseudo-observations of the variable's global spread added to a window's spread estimate:
#: a window with three nearby observations must not claim a tiny standard deviation.
SHRINK_POINTS = 10.0


@dataclass(frozen=True)
class WindowSpec:
    """Window geometry and model-input scaling, each as ``(time, rows, cols)`` in cells.

    Args:
        core: cells each window owns along each axis (the window grid's stride).
        overlap: cells shared with the next window, blended with a linear taper.
        halo: context-only margin beyond the prediction region.
        max_context: at most this many context points per window; beyond it the farthest
            cells from the prediction region are thinned (deterministically).
        cells_per_unit: grid cells per model input unit along rows/cols.
        steps_per_unit: time steps per model input unit.
        time_cells: when thinning context, a time step away from the window's centre counts as
            this many cells of distance (0: only the distance in space counts). With a long
            history (a time halo of several steps) this keeps the target day's own cells first.
        unscaled_covariates: the last this many covariates are shares (the ``nugget``,
            :data:`geonp.tasks.covariate_maps.UNSCALED_COVARIATES`) and reach the model as they are; the
            others are standardised like the values. Set from the covariates' names
            (:func:`geonp.tasks.covariate_maps.unscaled_count`), not by hand.
    """

    core: tuple[int, int, int] = (1, 16, 16)
    overlap: tuple[int, int, int] = (0, 6, 6)
    halo: tuple[int, int, int] = (1, 10, 10)
    max_context: int = 1024
    cells_per_unit: float = 8.0
    steps_per_unit: float = 1.0
    time_cells: float = 0.0
    unscaled_covariates: int = 0

    def __post_init__(self) -> None:
        for name in ("core", "overlap", "halo"):
            value = getattr(self, name)
            if len(value) != 3 or any(int(v) != v or v < 0 for v in value):
                raise ValueError(f"window {name} must be three non-negative integers (time, rows, cols), got {value}")
        if min(self.core) < 1:
            raise ValueError(f"window core must be at least one cell along each axis, got {self.core}")
        if any(o > c for o, c in zip(self.overlap, self.core)):
            raise ValueError(f"window overlap {self.overlap} cannot exceed the core {self.core}")
        if self.max_context < 1 or self.cells_per_unit <= 0 or self.steps_per_unit <= 0:
            raise ValueError("max_context, cells_per_unit and steps_per_unit must be positive")
        if int(self.unscaled_covariates) != self.unscaled_covariates or self.unscaled_covariates < 0:
            raise ValueError(f"window unscaled_covariates must be a whole number >= 0, got {self.unscaled_covariates}")

    @property
    def view(self) -> tuple[int, int, int]:
        """Cells one window sees along (time, rows, cols): its prediction region plus the halo on both sides."""
        return tuple(c + o + 2 * h for c, o, h in zip(self.core, self.overlap, self.halo))  # type: ignore[return-value]

    def as_dict(self) -> dict:
        """The spec as plain lists and numbers, as checkpoint headers record it.

        Returns:
            ``{field: value}`` with tuples as lists, so :meth:`from_dict` rebuilds it.
        """
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, fields: dict) -> WindowSpec:
        """A spec from a header's or a config's window.

        Args:
            fields: ``{field: value}`` as :meth:`as_dict` writes it or a config spells it; lists
                become tuples, fields left out keep their defaults.

        Returns:
            The window spec those fields describe.
        """
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})

    def fitted_to(self, shape: tuple[int, int, int]) -> WindowSpec:
        """The same spec with core, overlap and halo clipped to a cube of ``shape`` (default windows).

        Args:
            shape: the cube's ``(time, rows, cols)`` in cells.

        Returns:
            A spec whose windows fit inside the cube along every axis.
        """
        core = tuple(min(c, n) for c, n in zip(self.core, shape))
        overlap = tuple(min(o, c - 1 if c > 1 else 0) for o, c in zip(self.overlap, core))
        halo = tuple(min(h, n) for h, n in zip(self.halo, shape))
        return replace(self, core=core, overlap=overlap, halo=halo)


@dataclass(frozen=True)
class Axis:
    """The windows along one axis of length ``n``: prediction ranges and blending weights."""

    n: int
    core: int
    overlap: int
    halo: int

    @property
    def count(self) -> int:
        return -(-self.n // self.core)

    def predicted(self, k: int) -> tuple[int, int]:
        """Cells ``[start, stop)`` window ``k`` predicts (clipped to the axis)."""
        lo = k * self.core - self.overlap // 2
        return max(lo, 0), min(lo + self.core + self.overlap, self.n)

    def seen(self, k: int) -> tuple[int, int]:
        """Cells ``[start, stop)`` window ``k`` takes context from."""
        start, stop = self.predicted(k)
        return max(start - self.halo, 0), min(stop + self.halo, self.n)

    def touching(self, start: int, stop: int) -> range:
        """Windows whose prediction range meets cells ``[start, stop)``."""
        first = max((start - (self.overlap - self.overlap // 2)) // self.core, 0)
        last = min((stop - 1 + self.overlap // 2) // self.core, self.count - 1)
        return range(first, last + 1)

    def weights(self, k: int) -> np.ndarray:
        """Blending weight of window ``k`` on each cell it predicts; over windows they sum to one."""
        start, stop = self.predicted(k)
        return self._raw(k, start, stop) / self._total(start, stop)

    def _raw(self, k: int, start: int, stop: int) -> np.ndarray:
        # A ramp up across the band shared with window k-1 and down across the band shared with
        # k+1; cells in the core weigh 1. Cell centres sit at i + 0.5.
        i = np.arange(start, stop) + 0.5
        if self.overlap == 0:
            return np.ones(stop - start)
        lo = k * self.core - self.overlap // 2
        up = np.clip((i - lo) / self.overlap, 0.0, 1.0)
        down = np.clip((lo + self.core + self.overlap - i) / self.overlap, 0.0, 1.0)
        return np.minimum(up, down)

    def _total(self, start: int, stop: int) -> np.ndarray:
        total = np.zeros(stop - start)
        for j in self.touching(start, stop):
            s, e = self.predicted(j)
            s, e = max(s, start), min(e, stop)
            total[s - start:e - start] += self._raw(j, s, e)
        return total


def axes(shape: tuple[int, int, int], spec: WindowSpec) -> tuple[Axis, Axis, Axis]:
    """The three window axes of a ``[time, rows, cols]`` cube."""
    return tuple(Axis(n, c, o, h) for n, c, o, h in zip(shape, spec.core, spec.overlap, spec.halo))


@dataclass
class WindowTask:
    """One window as a task: numpy arrays, standardised values, and how to undo the scaling.

    Shapes: ``xc [Nc, Dx]``, ``yc [Nc]``, ``xt [Nt, Dx]``; ``targets`` holds the targets' flat
    indices into the caller's array; ``yt [Nt]`` the standardised truths when known (training).
    """

    xc: np.ndarray
    yc: np.ndarray
    xt: np.ndarray
    targets: np.ndarray
    offset: float
    scale: float
    yt: np.ndarray | None = None


def window_task(values: np.ndarray, context: np.ndarray, target: np.ndarray, centre: tuple[float, float, float],
                spec: WindowSpec, spread: float, elevation: np.ndarray | None = None,
                rng: np.random.Generator | None = None, truth: np.ndarray | None = None,
                focus: tuple[slice, slice] | None = None,
                far: tuple[np.ndarray, np.ndarray] | None = None,
                history: np.ndarray | None = None, far_history: np.ndarray | None = None) -> WindowTask:
    """Encode one window of a ``[T, R, C]`` slab.

    Args:
        values: ``[T, R, C]`` the slab's values (NaN where missing), user units.
        context: ``[T, R, C]`` bool, cells to use as context (observed, inside the window's view).
        target: ``[T, R, C]`` bool, cells to predict.
        centre: the window centre in slab cell coordinates ``(t, r, c)``.
        spec: the window spec (input scaling, context cap).
        spread: the variable's standard deviation over the whole cube (shrinkage target), user units.
        elevation: ``[R, C]`` metres, or None when the model takes no elevation input.
        rng: draws the tie-breaking jitter when thinning context beyond ``spec.max_context``.
        truth: ``[T, R, C]`` true values at the targets (training and evaluation), or None.
        focus: ``(rows, cols)`` slices of the window's prediction region; context beyond
            ``spec.max_context`` is thinned by distance to it. It must not depend on which of the
            region's cells are targets, or the same window would see different context in
            different output blocks.
        far: ``(xf [Nf, Dx], yf [Nf])`` context points beyond the view, appended after the
            near cells: model inputs (as :func:`inputs` makes them) and values in user units
            (see :mod:`geonp.tasks.far_context`). They take ``Nf`` of ``spec.max_context``.
        history: ``[P, T, R, C]`` what the field's history predicts at each cell, one map per
            covariate (user units, :func:`geonp.tasks.history.history_covariates`), or None when the
            model takes none. They become the last ``P`` inputs, standardised like the values, so a
            model sees how each cell departs from them, but for the last ``spec.unscaled_covariates``
            (shares, as they are); ``far_history [P, Nf]``: at the far points.
    """
    ci = np.flatnonzero(context)
    ti = np.flatnonzero(target)
    nf = 0 if far is None else far[1].size
    if ci.size > spec.max_context - nf:
        ci = _thin(ci, values.shape, focus or _box(target), spec.max_context - nf, rng,
                   int(np.floor(centre[0])), spec.time_cells)
    yc = values.reshape(-1)[ci].astype(np.float64)
    if nf:
        yc = np.concatenate([yc, np.asarray(far[1], np.float64)])
    offset = float(yc.mean()) if yc.size else 0.0
    ss = float(((yc - offset) ** 2).sum())
    scale = float(np.sqrt((ss + SHRINK_POINTS * spread**2) / max(yc.size - 1 + SHRINK_POINTS, 1.0)))
    scale = scale if scale > 0 else 1.0
    xc = inputs(ci, values.shape, centre, spec, elevation)
    if nf:
        xc = np.concatenate([xc, np.asarray(far[0], np.float32)])
    xt = inputs(ti, values.shape, centre, spec, elevation)
    if history is not None:
        flat = history.reshape(len(history), -1)  # [P, T * R * C]
        far_h = np.asarray(far_history, np.float64) if nf else np.zeros((len(history), 0))
        hc = np.concatenate([flat[:, ci], far_h], axis=1)  # [P, Nc]
        scaled = len(history) - spec.unscaled_covariates  # the shares after them stay as they are
        shift, div = np.zeros((len(history), 1)), np.ones((len(history), 1))
        shift[:scaled], div[:scaled] = offset, scale
        xc = np.concatenate([xc, ((hc - shift) / div).T.astype(np.float32)], axis=1)
        xt = np.concatenate([xt, ((flat[:, ti] - shift) / div).T.astype(np.float32)], axis=1)
    yt = None if truth is None else ((truth.reshape(-1)[ti] - offset) / scale).astype(np.float32)
    return WindowTask(xc, ((yc - offset) / scale).astype(np.float32), xt, ti, offset, scale, yt)


def inputs(flat: np.ndarray, shape: tuple[int, int, int], centre: tuple[float, float, float], spec: WindowSpec,
           elevation: np.ndarray | None = None) -> np.ndarray:
    """Model inputs ``[N, Dx]`` of cells ``flat`` (flat indices into ``shape``): offsets in grid units."""
    t, r, c = np.unravel_index(flat, shape)
    centre = np.floor(np.asarray(centre, dtype=np.float64))  # a whole cell: inputs on a lattice
    cols = [(t - centre[0]) / spec.steps_per_unit, (r - centre[1]) / spec.cells_per_unit,
            (c - centre[2]) / spec.cells_per_unit]
    if elevation is not None:
        cols.append(elevation[r, c] / 1000.0)  # km: same order of magnitude as the other inputs
    return np.stack(cols, axis=-1).astype(np.float32)


def _box(mask: np.ndarray) -> tuple[slice, slice]:
    """Bounding ``(rows, cols)`` slices of the True cells of a ``[T, R, C]`` mask."""
    _, r, c = np.nonzero(mask)
    return slice(int(r.min()), int(r.max()) + 1), slice(int(c.min()), int(c.max()) + 1)


def _thin(ci: np.ndarray, shape: tuple[int, int, int], focus: tuple[slice, slice], keep: int,
          rng: np.random.Generator | None, t_centre: int = 0, time_cells: float = 0.0) -> np.ndarray:
    """Keep the ``keep`` context cells nearest (Chebyshev, in cells) to the ``focus`` box, a time
    step away from ``t_centre`` counting as ``time_cells`` cells (0: time is ignored)."""
    t, r, c = np.unravel_index(ci, shape)
    rows, cols = focus
    dist = np.maximum(np.maximum(rows.start - r, r - (rows.stop - 1)), np.maximum(cols.start - c, c - (cols.stop - 1)))
    if time_cells:
        dist = np.maximum(dist, np.abs(t - t_centre) * time_cells)
    jitter = (rng or np.random.default_rng(0)).random(ci.size)  # breaks ties without a spatial bias
    return np.sort(ci[np.argsort(np.maximum(dist, 0) + jitter, kind="stable")[:keep]])


def collate_windows(tasks: list[WindowTask], device: torch.device | str = "cpu") -> Batch:
    """Pad windows into one :class:`Batch` (``yt`` zero when the truths are unknown).

    Args:
        tasks: ``B`` encoded windows (:func:`window_task`), of any context and target sizes.
        device: where the batch's tensors go.

    Returns:
        The padded batch: ``xc [B, Nc, Dx]``, ``yc [B, Nc, 1]``, ``xt [B, Nt, Dx]``, ``yt [B, Nt, 1]``,
        masks ``[B, N]`` (True = a real point, False = padding), ``Nc``/``Nt`` the largest window's.
    """
    b = len(tasks)
    nc = max(t.yc.size for t in tasks)
    nt = max(t.targets.size for t in tasks)
    dx = tasks[0].xc.shape[-1]
    xc, yc = np.zeros((b, nc, dx), np.float32), np.zeros((b, nc, 1), np.float32)
    xt, yt = np.zeros((b, nt, dx), np.float32), np.zeros((b, nt, 1), np.float32)
    mask_c, mask_t = np.zeros((b, nc), bool), np.zeros((b, nt), bool)
    for i, t in enumerate(tasks):
        n, m = t.yc.size, t.targets.size
        xc[i, :n], yc[i, :n, 0], xt[i, :m] = t.xc, t.yc, t.xt
        if t.yt is not None:
            yt[i, :m, 0] = t.yt
        mask_c[i, :n], mask_t[i, :m] = True, True
    return Batch(*(torch.from_numpy(a) for a in (xc, yc, xt, yt, mask_c, mask_t))).to(device)


def canonical(ds: xr.Dataset, name: str, source: str) -> xr.DataArray:
    """Variable ``name`` as ``[*extra, time, rows, cols]`` (time added when absent), chunked.

    ``extra`` are its other dimensions (pressure ``level``, ensemble ``member``, ...) in the input's
    order, chunked one index at a time: each index is a field of its own, filled independently
    (:func:`extra_indices`). ``source`` is unused (kept for callers' error messages).
    """
    da = ds[name]
    rows, cols = horizontal_dims(ds)
    extra = [d for d in da.dims if d not in ("time", rows, cols)]
    step = "time"
    if "time" not in da.dims:
        if "time" in ds.dims:  # a static field beside time-varying ones: its own one-step axis
            step = STATIC_STEP
            da = da.expand_dims({STATIC_STEP: 1})
        else:
            da = da.expand_dims(time=1) if "time" not in da.coords else da.expand_dims("time")
    da = da.transpose(*extra, step, rows, cols)
    if da.chunks is None:
        da = da.chunk(dict(zip(da.dims, (*[1] * len(extra), *default_chunks(da.shape[len(extra):])))))
    return _cap_chunks(da.chunk(dict.fromkeys(extra, 1)))


def default_chunks(shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """Block size ``(steps, rows, cols)`` of an in-memory ``[time, rows, cols]`` input: tiles of
    :data:`DEFAULT_TILE` cells, and as many steps as keep a block within :data:`DEFAULT_BLOCK_CELLS`.

    A block's windows are batched together, so one-step blocks of a small grid sent the model a
    few windows at a time: 192 hours of a 33 x 49 ERA5 grid filled in 102-103 s in blocks of one
    step and 88-89 s in blocks of 40 (this rule) or 192 steps (te-pt-tnp's defaults, 2 cores; the
    same values to float32 rounding: 96% of the cells equal to the bit, none more than 1.0e-3 K
    apart, 0.2% of its sigma), and each step was a Zarr chunk of a few kilobytes in the output.
    Blocks are also what a dask cluster shares out: chunk a small cube first to give more workers
    a block each.
    """
    steps, rows, cols = shape
    tile = (min(DEFAULT_TILE[0], rows), min(DEFAULT_TILE[1], cols))
    return (max(1, min(steps, DEFAULT_BLOCK_CELLS // max(tile[0] * tile[1], 1))), *tile)


def extra_indices(da: xr.DataArray) -> list[dict[str, int]]:
    """``{dim: index}`` of every field of a :func:`canonical` array along its extra dims, in C order
    (``[{}]`` when it has none)."""
    extra = da.dims[:-3]
    return [dict(zip(extra, idx)) for idx in np.ndindex(*(da.sizes[d] for d in extra))]


def _cap_chunks(da: xr.DataArray) -> xr.DataArray:
    """One chunk size per dimension (what Zarr stores: a flipped latitude or a reordered longitude
    leaves the input's chunks uneven), halved along rows, then cols, then time until a block of the
    last three dims holds at most :data:`MAX_BLOCK_CELLS` cells."""
    size = [max(c) for c in da.chunks]
    while size[-2] * size[-1] > MAX_BLOCK_CELLS:
        axis = -2 if size[-2] >= size[-1] else -1
        size[axis] = (size[axis] + 1) // 2
    while size[-3] * size[-2] * size[-1] > MAX_BLOCK_CELLS and size[-3] > 1:
        size[-3] = (size[-3] + 1) // 2
    return da.chunk(dict(zip(da.dims, size)))
