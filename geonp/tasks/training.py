"""Self-supervised training tasks: a window of a ``[T, R, C]`` array with some observed cells hidden.

Training, fine-tuning on the scene and sigma calibration all make their tasks here, in the one
encoding infill predicts with (:mod:`geonp.tasks.windows`): the hidden cells are the targets and
their truths are known, so the model learns to fill gaps shaped like the ones it will meet
(synthetic clouds, another step's real gaps, gaps wider than the window, or history folds).
"""

from __future__ import annotations

import numpy as np

from geonp.tasks.clouds import random_clouds
from geonp.tasks.windows import MIN_POINTS, WindowSpec, WindowTask, window_task


def training_window(values: np.ndarray, valid: np.ndarray, spec: WindowSpec, rng: np.random.Generator,
                    spread: float, elevation: np.ndarray | None = None, cover: tuple[float, float] = (0.1, 0.7),
                    real_clouds: float = 0.0, wide_clouds: float = 0.0,
                    gap_donor: np.ndarray | None = None, history: np.ndarray | None = None,
                    folds: list | None = None) -> WindowTask | None:
    """One self-supervised task from a ``[T, R, C]`` array (NaN = missing), or None if too sparse.

    The window is placed at random; at its central time step a part of the observed cells of the
    prediction region is hidden and becomes the targets (``yt`` holds their standardised truths);
    the other observed cells in view, the other time steps' included, are the context.

    Args:
        values: ``[T, R, C]`` the field in user units, NaN where missing.
        valid: ``[T, R, C]`` bool, True where data may exist (land of an SST field is False).
        spec: the window geometry and input scaling.
        rng: every random choice (placement, clouds, donor step, thinning).
        spread: the variable's standard deviation over the field (the standardisation's shrinkage
            target), user units.
        elevation: ``[R, C]`` metres, for a model that takes elevation; None otherwise.
        cover: the share of the region a synthetic cloud covers, drawn from ``U(cover)``.
        real_clouds: probability that the hidden cells are another step's real gaps laid over this
            one (when such a step hides 5% to 95% of the region's observed cells), so the model
            learns to fill a day under another day's clouds from its history.
        wide_clouds: probability that the clouds (synthetic or real) cover the whole view, halo
            included, and the halo cells under them leave the context: infill meets gaps wider
            than a window, whose targets see observations on one side only.
        gap_donor: ``bool [R, C]`` (True = a real gap), a gap pattern the caller copied from
            elsewhere in the scene: when it hides 5% to 95% of the region's observed cells it is the
            cloud over the whole view (else a synthetic cloud over the whole view), so the hidden
            cells have the shapes and sizes of the scene's real gaps.
        history: ``[P, T, R, C]`` history covariates (see :func:`~geonp.tasks.windows.window_task`),
            or None.
        folds: :class:`~geonp.tasks.history.HistoryFold` list, each hiding cells in its own steps;
            replaces the clouds and ``history``: the fold that hides cells at the central step
            gives the targets (the region's hidden cells) and the covariates, and none of its
            hidden cells, at any step, is context.

    Returns:
        The encoded window (:class:`~geonp.tasks.windows.WindowTask`, ``yt`` set), or None when
        it would have fewer than ``MIN_POINTS`` context or target cells (the caller draws again).
    """
    shape = values.shape
    size = [min(c + o, n) for c, o, n in zip(spec.core, spec.overlap, shape)]
    start = [int(rng.integers(0, n - s + 1)) for n, s in zip(shape, size)]
    t_mid = start[0] + size[0] // 2
    lo = [max(s - h, 0) for s, h in zip(start, spec.halo)]
    hi = [min(s + z + h, n) for s, z, h, n in zip(start, size, spec.halo, shape)]
    view = tuple(slice(a, b) for a, b in zip(lo, hi))
    v = values[view]
    observed = np.isfinite(v) & valid[view]
    region = (t_mid - lo[0], slice(start[1] - lo[1], start[1] - lo[1] + size[1]),
              slice(start[2] - lo[2], start[2] - lo[2] + size[2]))
    here = observed[region]
    if folds:
        fold = next((f for f in folds if f.hidden[t_mid].any()), None)
        if fold is None:  # nothing hidden at this step
            return None
        history, held = fold.covariates, fold.hidden[view]
        target = np.zeros(v.shape, bool)
        target[region] = held[region] & here
        context = observed & ~held
    else:
        # Drawn only when asked: without wide clouds the random stream stays as it was.
        wide = gap_donor is not None or (wide_clouds > 0 and rng.random() < wide_clouds)
        # The cloud mask covers the region, or with ``wide`` the whole view; ``inner`` cuts the region out of it.
        area = (slice(lo[1], hi[1]), slice(lo[2], hi[2])) if wide else \
            (slice(start[1], start[1] + size[1]), slice(start[2], start[2] + size[2]))
        inner = region[1:] if wide else (slice(None), slice(None))
        clouds = gaps = None
        if gap_donor is not None:
            gaps = gap_donor[area]
        elif real_clouds > 0 and shape[0] > 1 and rng.random() < real_clouds:
            donor = int(rng.integers(shape[0] - 1))
            donor += donor >= t_mid  # any step but this one
            gaps = ~np.isfinite(values[(donor, *area)]) & valid[(donor, *area)]
        if gaps is not None:  # real gaps are the cloud only if they hide some, but not all, of the region
            share = (gaps[inner] & here).sum() / max(here.sum(), 1)
            clouds = gaps if 0.05 <= share <= 0.95 else None
        if clouds is None:
            shape_c = (area[0].stop - area[0].start, area[1].stop - area[1].start)
            clouds = random_clouds(shape_c, float(rng.uniform(*cover)), rng, float(rng.uniform(2.0, 8.0)))
        target = np.zeros(v.shape, bool)
        target[region] = clouds[inner] & here
        context = observed & ~target
        if wide:
            context[region[0]] &= ~clouds  # the halo under the cloud is hidden too, but not scored
    if target.sum() < MIN_POINTS or context.sum() < MIN_POINTS:
        return None
    centre = (t_mid - lo[0], start[1] - lo[1] + (size[1] - 1) / 2, start[2] - lo[2] + (size[2] - 1) / 2)
    elev = None if elevation is None else elevation[view[1], view[2]]
    return window_task(v, context, target, centre, spec, spread, elev, rng, truth=v, focus=region[1:],
                       history=None if history is None else history[(slice(None), *view)])
