"""Sigma calibrated on the input's own observations, by distance to the nearest one.

A model's 1-sigma is learnt on its training windows; on a new input it can be too narrow or too
wide, and by different amounts next to an observation and deep inside a gap (the history
benchmark measured 90% coverage of 0.72-0.84 one cell from an observation). The input itself says
by how much: hide some of its observed cells under gap patterns it really has (the windows
fine-tuning draws, :class:`geonp.fill.finetune.FieldWindows`), predict them, and see how far the
truths fall in sigmas. Per bin of distance to the nearest context cell of the same step
(:data:`geonp.metrics.DISTANCE_BINS`), sigma is scaled so that 90% of those hidden cells fall in
the central 90% interval: ``scale_b = q90(|z| in bin b) / 1.645``, leaning on the scale of all
bins together where a bin holds few cells. The mean is unchanged.

For a model with history covariates the windows hide the cells of history folds
(:func:`geonp.tasks.history.history_folds`): covariates computed with the hidden cells would make the
truths look closer than a real gap's are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch.distributions import Normal

from geonp.fill.options import CHECK_WINDOWS
from geonp.metrics import DISTANCE_BINS
from geonp.models.base import NeuralProcess

#: Windows predicted at a time (calibration's and the nugget check's): each holds 100-400 hidden cells.
BATCH = 8
#: Hidden cells of a distance bin at which its own scale and the all-bins scale weigh the same.
SHRINK_CELLS = 200
#: Scales are kept within these limits: a few odd windows must not blow sigma up or away.
SCALE_LIMITS = (0.5, 4.0)
#: History folds a model with covariates is calibrated on (see the module's docstring).
CALIBRATION_FOLDS = 3
#: The standard normal's 95% quantile: the half-width of the central 90% interval, in sigmas.
Z90 = 1.6448536269514722


def target_distance(xc: torch.Tensor, xt: torch.Tensor, mask_c: torch.Tensor, cells_per_unit: float) -> torch.Tensor:
    """Distance ``[B, Nt]`` in grid cells from each target to the nearest context point of its own
    time step (inf where that step has none).

    ``xc [B, Nc, Dx]``, ``xt [B, Nt, Dx]``: window inputs (:func:`geonp.tasks.windows.inputs`; time
    first, then rows and cols in units of ``cells_per_unit`` cells); ``mask_c [B, Nc]``.
    """
    same_step = (xt[:, :, None, 0] - xc[:, None, :, 0]).abs() < 1e-6  # [B, Nt, Nc]
    d2 = ((xt[:, :, None, 1:3] - xc[:, None, :, 1:3]) ** 2).sum(-1) * cells_per_unit**2
    d2 = torch.where(same_step & mask_c[:, None, :], d2, torch.full_like(d2, math.inf))
    return d2.min(-1).values.sqrt() if d2.shape[-1] else torch.full(xt.shape[:2], math.inf)


def distance_bins(distance: torch.Tensor) -> torch.Tensor:
    """Index into :data:`DISTANCE_BINS` of each distance (cells; upper edges inclusive)."""
    edges = torch.tensor([edge for _, edge in DISTANCE_BINS[:-1]], dtype=distance.dtype, device=distance.device)
    return torch.bucketize(distance, edges)


def coverage_scale(abs_z: np.ndarray) -> float:
    """The sigma scale that puts 90% of errors ``|z| [n]`` inside the central 90% interval."""
    return float(np.quantile(abs_z, 0.9) / Z90)


def fit_scales(z: np.ndarray, bins: np.ndarray,
               per_bin: Callable[[np.ndarray], float] = coverage_scale) -> np.ndarray:
    """Sigma scale per distance bin ``[len(DISTANCE_BINS)]`` from standardised errors ``z [n]`` and
    their bin indices ``[n]``: ``per_bin(|z| of the bin)`` (by default :func:`coverage_scale`),
    shrunk towards all bins' together by :data:`SHRINK_CELLS` pseudo-cells, within
    :data:`SCALE_LIMITS`. No cells: all ones."""
    z = np.abs(np.asarray(z, np.float64))
    if z.size == 0:
        return np.ones(len(DISTANCE_BINS))
    overall = per_bin(z)
    scales = np.full(len(DISTANCE_BINS), overall)
    for b in range(len(DISTANCE_BINS)):
        here = z[bins == b]
        if here.size:
            scales[b] = (here.size * per_bin(here) + SHRINK_CELLS * overall) / (here.size + SHRINK_CELLS)
    return np.clip(scales, *SCALE_LIMITS)


@contextmanager
def own_cell_windows(fields: list, spec, fold_seed: int, window_seed: int, dim_x: int,
                     elevation: np.ndarray | None = None, covariates: list[str] | None = None,
                     folds: int = CALIBRATION_FOLDS, device: torch.device | str | None = None) -> Iterator:
    """Self-supervised windows of ``fields`` (:class:`geonp.fill.finetune.FieldWindows`, seeded
    ``window_seed``) that hide observed cells under the input's own gap patterns, for checking a
    model on the input itself (this module's calibration, :mod:`geonp.fill.nugget`'s choice). With
    history ``covariates`` each field gets ``folds`` history folds (seeded ``fold_seed``) for the
    duration, so a hidden cell's covariates are computed without it (DINEOF on ``device`` where it is a
    GPU, :func:`geonp.fill.stack.dineof_device`)."""
    from geonp.fill.finetune import FieldWindows
    from geonp.fill.stack import add_history_folds

    if covariates:
        for f in fields:
            add_history_folds(f, covariates, folds, fold_seed, device=device)
    try:
        yield FieldWindows(fields, spec, window_seed, dim_x, elevation)
    finally:
        for f in fields:
            f.folds = []


@torch.no_grad()
def measure(model: NeuralProcess, source, device: torch.device | str, cells_per_unit: float,
            windows: int = CHECK_WINDOWS) -> tuple[np.ndarray, np.ndarray]:
    """Standardised errors ``z`` and distance bins of the hidden cells of ``windows`` windows
    drawn by ``source`` (``sample(batch_size) -> Batch`` with truths ``yt``)."""
    zs, bins = [], []
    for _ in range(max(1, windows // BATCH)):
        b = source.sample(BATCH).to(device)
        dist = model(b.xc, b.yc, b.xt, b.mask_c, b.mask_t)
        z = ((b.yt - dist.loc) / dist.scale)[..., 0]  # [B, Nt]
        d = target_distance(b.xc, b.xt, b.mask_c, cells_per_unit)
        zs.append(z[b.mask_t].float().cpu().numpy())
        bins.append(distance_bins(d)[b.mask_t].cpu().numpy())
    return np.concatenate(zs), np.concatenate(bins)


def calibrate(model: NeuralProcess, fields: list, spec, device: torch.device | str, seed: int = 0,
              elevation: np.ndarray | None = None, covariates: list[str] | None = None,
              windows: int | None = None) -> tuple[SigmaCalibrated, np.ndarray]:
    """``model`` with sigma calibrated on self-supervised windows of ``fields`` (the input's
    :class:`~geonp.fill.field.Field` list, ``spec`` their :class:`~geonp.tasks.windows.WindowSpec`),
    and the scales per distance bin, from ``windows`` windows (``FillOptions.check_windows``; None:
    :data:`~geonp.fill.options.CHECK_WINDOWS`).
    Windows come from their own random stream (not fine-tuning's); a model with history
    ``covariates`` gets each field's history folds for the duration."""
    with own_cell_windows(fields, spec, seed, seed + 104729, model.dim_x, elevation, covariates,
                          device=device) as source:
        try:
            z, bins = measure(model, source, device, spec.cells_per_unit, windows or CHECK_WINDOWS)
        except ValueError:  # FieldWindows found too few observed cells to hide any
            raise ValueError("--calibrate-sigma: the input has too few observed cells to draw calibration "
                             "windows; fill without it") from None
    scales = fit_scales(z, bins)
    return SigmaCalibrated(model, scales, spec.cells_per_unit).to(device), scales


class SigmaCalibrated(NeuralProcess):
    """``model`` with its sigma multiplied by ``scales[bin]``, the bin of each target's distance to
    the nearest context cell of its step (see :func:`target_distance`); the mean is ``model``'s."""

    trainable = False

    def __init__(self, model: NeuralProcess, scales: np.ndarray, cells_per_unit: float) -> None:
        super().__init__(model.dim_x, model.dim_y)
        self.model = model
        self.cells_per_unit = float(cells_per_unit)
        self.register_buffer("scales", torch.as_tensor(np.asarray(scales), dtype=torch.float32), persistent=False)
        self.translation_equivariant = model.translation_equivariant

    def predict(self, xc: torch.Tensor, yc: torch.Tensor, xt: torch.Tensor, mask_c: torch.Tensor,
                mask_t: torch.Tensor) -> Normal:
        """``xc [B, Nc, Dx]``, ``yc [B, Nc, Dy]``, ``xt [B, Nt, Dx]``, masks ``[B, N]`` -> Normal ``[B, Nt, Dy]``."""
        dist = self.model(xc, yc, xt, mask_c, mask_t)
        factor = self.scales[distance_bins(target_distance(xc, xt, mask_c, self.cells_per_unit))]  # [B, Nt]
        return Normal(dist.loc, dist.scale * factor[..., None].to(dist.scale.dtype))


def describe(scales: np.ndarray) -> str:
    """The scales for provenance: ``"1: 1.21, 2-3: 1.10, ..."``."""
    return ", ".join(f"{label}: {s:.3g}" for (label, _), s in zip(DISTANCE_BINS, scales, strict=True))
