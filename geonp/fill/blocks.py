"""Fill one output block: the windows that touch it, batched through the model, blended.

A block is a ``[time, rows, cols]`` box of the output (one input chunk). Its windows (see
:mod:`geonp.tasks.windows`) read a slab reaching ``overlap + halo`` cells beyond the block, so
every target sees context on all sides, and each window predicts only the block's own cells.
Where the halo does not surround a window's targets (gaps wider than the halo), the window also
gets far points, coarsened block means from the field's pyramid (:mod:`geonp.tasks.far_context`);
they depend on the cube and the window only, so blocks stay independent.
Where windows overlap their Gaussian predictions are combined as a mixture with the tapered
weights: mean ``sum w mu``, variance ``sum w (sigma^2 + mu^2) - mean^2``, which keeps the
uncertainty honest when two windows disagree.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import dask
import numpy as np
import torch

from geonp.fill.field import Field
from geonp.fill.output import FLAG_INFILLED, FLAG_OBSERVED, FLAG_OUTSIDE
from geonp.fill.predictor import predict_windows
from geonp.models.base import NeuralProcess
from geonp.tasks.covariate_maps import is_flat
from geonp.tasks.far_context import FAR_SHARE, Slab, far_points, finest_level, slab_margin
from geonp.tasks.windows import WindowSpec, WindowTask, axes, inputs, window_task

#: Windows encoded at a time, in units of the batch size: bounds the memory of pending tasks.
PENDING_BATCHES = 4


@dataclass
class BlockResult:
    """The filled values of one block, each ``[T, R, C]``, and how many gaps had no context."""

    value: np.ndarray
    std: np.ndarray
    flag: np.ndarray
    without_context: int = 0


def fill_block(field: Field, key: tuple[slice, slice, slice], model: NeuralProcess, spec: WindowSpec,
               elevation: np.ndarray | None = None, device: torch.device | str = "cpu", batch_size: int = 16,
               seed: int = 0) -> BlockResult:
    """Fill the cells ``key`` (slices along time, rows, cols) of ``field``.

    ``elevation`` is the whole grid's ``[rows, cols]`` elevation in metres when the model takes
    it. Deterministic: the same block gives the same values whatever ran before it. Windows whose
    halo does not surround their targets add far points (:func:`far_points`); a gap cell gets the
    global mean (counted in ``without_context``) only when its window has no observation in reach.
    """
    # A block without gaps needs no context: read just the block, not the slab of every window
    # around it (about a dozen chunk reads instead of one on a mostly observed cube).
    values, valid, observed, missing = read_block(field, key)
    if not missing.any():
        none = np.zeros(values.shape)
        return compose(values, valid, observed, missing, none, none, none, field)
    grid = axes(field.shape, spec)
    touching = [a.touching(s.start, s.stop) for a, s in zip(grid, key)]
    # Beyond the views, the few cells the far ring summarises raw (blocks straddling a view's edge).
    margin = (0, *slab_margin(spec.halo[1:]))
    lo = [max(min(a.seen(k)[0] for k in ks) - m, 0) for a, ks, m in zip(grid, touching, margin)]
    hi = [min(max(a.seen(k)[1] for k in ks) + m, a.n) for a, ks, m in zip(grid, touching, margin)]
    slab_key = tuple(slice(a, b) for a, b in zip(lo, hi))
    values, valid, observed, missing = read_block(field, slab_key)
    elev = None if elevation is None else elevation[slab_key[1], slab_key[2]]
    history = None if field.history is None else field.history[(slice(None), *slab_key)]
    slab = Slab(values, observed, missing, tuple(lo), field.shape)
    finest = finest_level(spec.halo[1:])
    # Far points carry each history covariate's mean over the field's observed cells that make each
    # point: a flat one is its value, the others are summarised with the field (one selection, every
    # source's means; a slab is read at the field's observed cells only, so it needs no mask).
    flat = [] if history is None else [is_flat(cov) for cov in history]
    others = [] if history is None else [(lambda p=p: field.history_pyramid(p, finest),
                                          Slab(cov, observed, missing, tuple(lo), field.shape))
                                         for p, cov in enumerate(history) if not flat[p]]

    own = tuple(slice(s.start - o, s.stop - o) for s, o in zip(key, lo))  # the block, in slab coordinates
    gaps = np.zeros(values.shape, bool)
    gaps[own] = missing[own]  # only the block's own gaps are targets
    weight = np.zeros(values.shape)  # sum of blending weights
    first = np.zeros(values.shape)  # sum w mu
    second = np.zeros(values.shape)  # sum w (sigma^2 + mu^2)

    pending: list[tuple[WindowTask, np.ndarray]] = []

    def flush() -> None:
        preds = predict_windows(model, [t for t, _ in pending], device, batch_size)
        for (task, w), (mu, sigma) in zip(pending, preds):
            idx = task.targets
            weight.flat[idx] += w
            first.flat[idx] += w * mu
            second.flat[idx] += w * (sigma**2 + mu**2)
        pending.clear()

    for ks in itertools.product(*touching):
        pred = [a.predicted(k) for a, k in zip(grid, ks)]
        seen = [a.seen(k) for a, k in zip(grid, ks)]
        view = tuple(slice(s0 - o, s1 - o) for (s0, s1), o in zip(seen, lo))
        region = tuple(slice(p0 - s0, p1 - s0) for (p0, p1), (s0, _) in zip(pred, seen))
        target = np.zeros(values[view].shape, bool)
        target[region] = gaps[view][region]
        if not target.any():
            continue
        context = observed[view]
        far_cells, far_values = far_points(lambda: field.pyramid(finest), slab, pred, seen[0], spec.halo[1:],
                                           max(spec.max_context // FAR_SHARE, 1), others)
        if not context.any() and not len(far_cells):
            continue  # no observation in reach on the window's time steps: the fallback in _compose
        centre = tuple((p0 + p1 - 1) / 2 - s0 for (p0, p1), (s0, _) in zip(pred, seen))
        far = far_history = None
        if len(far_cells):  # inputs over the whole cube: the same lattice and scaling as the near cells
            at = np.ravel_multi_index(tuple(far_cells.T), field.shape)
            whole_centre = tuple((p0 + p1 - 1) / 2 for p0, p1 in pred)  # ``centre`` in cube cells
            far = (inputs(at, field.shape, whole_centre, spec, elevation), far_values[0])
            if history is not None:
                far_history = _far_history(history, flat, far_values[1:])
        rng = np.random.default_rng([seed, *ks])
        task = window_task(values[view], context, target, centre, spec, field.spread,
                           None if elev is None else elev[view[1], view[2]], rng, focus=region[1:], far=far,
                           history=None if history is None else history[(slice(None), *view)],
                           far_history=far_history)
        cells = np.unravel_index(task.targets, target.shape)
        w = np.ones(task.targets.size)
        for axis, k, (p0, _), (s0, _), c in zip(grid, ks, pred, seen, cells):
            w = w * axis.weights(k)[c + s0 - p0]
        task.targets = np.ravel_multi_index(tuple(c + v.start for c, v in zip(cells, view)), values.shape)
        pending.append((task, w))
        if len(pending) >= PENDING_BATCHES * batch_size:
            flush()
    if pending:
        flush()

    return compose(values[own], valid[own], observed[own], missing[own], weight[own], first[own], second[own],
                    field)


def _far_history(history: np.ndarray, flat: list[bool], means: np.ndarray) -> np.ndarray:
    """The history covariates ``[P, Nf]`` at a window's far points: each the covariate's mean over
    the cells whose values make the far point (``means [P', Nf]``, those of the covariates that are
    not ``flat``, in order, from :func:`far_points`' ``others``), so the drift pairs a block mean
    with a block mean. A flat covariate is its one value."""
    out = np.empty((len(history), means.shape[1]))
    summarised = iter(means)
    for p, cov in enumerate(history):
        out[p] = cov.flat[0] if flat[p] else next(summarised)
    return out


def read_block(field: Field, key: tuple[slice, slice, slice]) -> tuple[np.ndarray, ...]:
    """``(values, valid, observed, missing)`` over ``key``, each ``[T, R, C]``."""
    with dask.config.set(scheduler="synchronous"):  # the caller decides the parallelism
        values = np.asarray(field.data[key].values, dtype=np.float64)
    valid = field.valid_slab(key)
    finite = np.isfinite(values)
    return values, valid, finite & valid, ~finite & valid


def compose(values, valid, observed, missing, weight, first, second, field: Field) -> BlockResult:
    """Observed cells as they are, gaps from the blended predictions (arrays cut to the block), flags."""
    covered = weight > 0
    mean = np.where(covered, first / np.where(covered, weight, 1.0), field.mean)
    var = np.where(covered, second / np.where(covered, weight, 1.0) - mean**2, field.spread**2)
    std = np.sqrt(np.clip(var, 0.0, None))
    value = np.where(observed, values, np.where(missing, mean, np.nan))
    out_std = np.where(observed, 0.0, np.where(missing, std, np.nan))
    # Finite cells outside the valid area keep their value but are flagged outside.
    value = np.where(~valid & np.isfinite(values), values, value)
    flag = np.full(values.shape, FLAG_OUTSIDE, np.int8)
    flag[observed] = FLAG_OBSERVED
    flag[missing] = FLAG_INFILLED
    # The value stays float64 here: the output stores it as the input's float64 or as float32.
    return BlockResult(value, out_std.astype(np.float32), flag,
                       int((missing & ~covered).sum()))
