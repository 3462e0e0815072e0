"""Training windows for the infill models: synthetic random fields and real gridded files.

``geonp train`` with ``data: {name: windows, ...}`` draws tasks shaped exactly like the windows
``geonp infill`` predicts (see :mod:`geonp.tasks.windows`): a ``[time, rows, cols]`` view with
cloud-shaped holes, inputs in grid units. Two kinds of field feed it:

* synthetic: stationary Gaussian random fields drawn with random Fourier features, squared
  exponential or Matern spectra, lengthscales from 1.5 to 40 cells, anisotropic and rotated,
  with a time lengthscale, observation noise and existing cloud gaps on every time step;
* real: variables of gridded files (reanalyses, ERA5) read once into memory, windows cut at
  random places and times.

Validation uses fields the training never draws from: its own synthetic seed and the
``val_files`` (another region), so the validation NLL measures transfer, not memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from geonp.data.readers import data_folder
from geonp.tasks.batch import Batch
from geonp.tasks.clouds import random_clouds
from geonp.tasks.covariate_maps import flat_covariates, flat_values, unscaled_count
from geonp.tasks.real_fields import prepare_fields
from geonp.tasks.training import training_window
from geonp.tasks.windows import WindowSpec, WindowTask, collate_windows

#: Random Fourier features per synthetic field.
NUM_FEATURES = 256


def synthetic_field(shape: tuple[int, int, int], rng: np.random.Generator) -> np.ndarray:
    """A random stationary field ``[T, R, C]`` with holes (NaN), unit variance before noise."""
    t, r, c = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in shape), indexing="ij")
    ell = np.exp(rng.uniform(np.log(1.5), np.log(40.0)))
    ratio, angle = rng.uniform(0.5, 2.0), rng.uniform(0, np.pi)
    ell_t = np.exp(rng.uniform(np.log(0.3), np.log(10.0)))
    z = rng.standard_normal((NUM_FEATURES, 3))
    nu = rng.choice([0.5, 1.5, 2.5, np.inf])
    if np.isfinite(nu):  # Matern-nu spectrum: a Student-t with 2 nu degrees of freedom
        z = z * np.sqrt(2 * nu / rng.chisquare(2 * nu, size=(NUM_FEATURES, 1)))
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    space = (z[:, 1:] / np.array([ell, ell * ratio])) @ rot.T  # [F, 2] per cell
    phase = rng.uniform(0, 2 * np.pi, NUM_FEATURES)
    arg = (z[:, :1] / ell_t)[:, 0, None, None, None] * t + space[:, 0, None, None, None] * r
    arg = arg + space[:, 1, None, None, None] * c + phase[:, None, None, None]
    field = np.sqrt(2.0 / NUM_FEATURES) * np.cos(arg).sum(0)
    slope = rng.standard_normal(3) * rng.uniform(0, 1)
    field += slope[0] * t / 10 + slope[1] * r / 50 + slope[2] * c / 50  # a gentle trend
    field += np.exp(rng.uniform(np.log(0.005), np.log(0.2))) * rng.standard_normal(shape)  # observation noise
    field = field * np.exp(rng.uniform(-3, 3)) + rng.normal(0, 10)  # arbitrary units
    for k in range(shape[0]):  # clouds already present on every time step
        cover = rng.uniform(0.0, 0.6)
        if cover > 0.01:
            field[k][random_clouds(shape[1:], cover, rng, rng.uniform(2.0, 10.0))] = np.nan
    return field


def windows_checkpoint_meta(spec: WindowSpec, covariates: list[str], elevation: bool) -> dict:
    """The header entries a model trained on these windows carries, so infill reads its inputs as
    training made them: the windows' geometry and scaling, the history covariates, elevation."""
    infill = {"cells_per_unit": spec.cells_per_unit, "steps_per_unit": spec.steps_per_unit, "window": spec.as_dict()}
    if covariates:
        infill["covariates"] = list(covariates)
    if elevation:
        infill["elevation"] = True
    return {"inputs": {"kind": "windows"}, "infill": infill}


#: Placements tried on a field with history folds before another field is drawn.
FOLD_TRIES = 20


class WindowSource:
    """Windows from synthetic fields (fraction ``synthetic``) and real ``files``.

    Args:
        files: ``[{path, variable}, ...]`` training fields; relative paths are under the data folder.
        val_files: fields for validation only (another region or product).
        synthetic: probability that a training window comes from a synthetic field.
        window: :class:`WindowSpec` keywords (core, overlap, halo, max_context, cells_per_unit).
        seed: the synthetic validation seed offset (training randomness comes from ``sample``'s rng).
        real_clouds: probability that a window's hidden cells are another time step's real gaps
            (see :func:`~geonp.tasks.training.training_window`) rather than synthetic clouds.
        wide_clouds: probability that a window's clouds span its whole view, halo included.
        covariates: history covariates the model takes after its location inputs (``dineof``,
            ``nearest_steps``, ``analogs``; :func:`geonp.tasks.history.history_covariates`), computed once per real
            field over its whole stack (its EOFs then include the cells a window hides, a
            small leak the leave-one-out loadings do not remove), flat on synthetic fields; the
            checkpoint records them, so infill computes the same.
        history_folds: with covariates, compute each real field's covariates this many times
            instead, each time without some of its cells (:func:`geonp.tasks.history.history_folds`),
            and let a window of a field with a history hide exactly those cells: its targets'
            covariates then know as little of them as infill's know of a real gap. 0: no folds.
        elevation: a DEM file (relative paths under the data folder) regridded onto every real
            field: the model then takes elevation (km) as a fourth input, as in the TE-TNP paper's
            ERA5 set-up, and infill asks for ``--elevation``. Synthetic fields lie at sea level
            (elevation 0: their values owe nothing to height). None: three inputs.
        workers: processes that read the real fields and compute their history covariates side by
            side (each field's folds draw from their own seed, so the fields come out the same
            whatever the count). None: one per four cores when there are covariates (DINEOF
            is what takes minutes; :func:`geonp.tasks.real_fields.prepare_fields`), else 1.
    """

    dim_y = 1

    def __init__(self, files: list[dict] | None = None, val_files: list[dict] | None = None,
                 synthetic: float = 0.5, window: dict | None = None, seed: int = 0,
                 real_clouds: float = 0.0, wide_clouds: float = 0.0, covariates: list[str] | None = None,
                 history_folds: int = 0, elevation: str | None = None, workers: int | None = None) -> None:
        self.covariates = list(covariates or [])
        self.spec = WindowSpec.from_dict({**(window or {}), "unscaled_covariates": unscaled_count(self.covariates)})
        if not isinstance(history_folds, int) or isinstance(history_folds, bool) or history_folds < 0:
            raise ValueError(f"data.history_folds must be a whole number >= 0, got {history_folds!r}")
        if history_folds and not self.covariates:
            raise ValueError("data.history_folds needs data.covariates (folds of what?)")
        self.elevation = elevation is not None
        self.dim_x = 3 + self.elevation + len(self.covariates)
        folder = data_folder()
        dem = None
        if elevation is not None:
            dem = Path(elevation) if Path(elevation).is_absolute() else folder / elevation
            if not files:
                raise ValueError("data.elevation needs real training files (data.files): synthetic fields have none")
        entries = [*(files or []), *(val_files or [])]
        prepared = prepare_fields(entries, folder, dem, self.covariates, history_folds, workers)
        self.fields, self.val_fields = prepared[:len(files or [])], prepared[len(files or []):]
        self.synthetic = synthetic if self.fields else 1.0
        self.real_clouds, self.wide_clouds = real_clouds, wide_clouds
        self.checkpoint_meta = windows_checkpoint_meta(self.spec, self.covariates, self.elevation)

    def _window(self, rng: np.random.Generator, fields: list, synthetic: float) -> WindowTask:
        while True:
            if rng.random() < synthetic or not fields:
                values = synthetic_field(self.spec.view, rng)
                valid, spread, history = np.ones(values.shape, bool), float(np.nanstd(values)) or 1.0, None
                elevation = np.zeros(values.shape[1:]) if self.elevation else None
                if self.covariates:
                    # Flat: a view of a few steps holds little history, and the EOFs of so short a stack
                    # would be fitted to the very cells the window then hides.
                    history = flat_covariates(len(self.covariates), values.shape,
                                              flat_values(self.covariates, float(np.nanmean(values))))
            else:
                values, valid, spread, history, folds, elevation = fields[int(rng.integers(len(fields)))]
                if folds:
                    # A fold hides cells in a third of the steps and only part of each: placements
                    # are retried on the same field, so fields keep their share of the windows.
                    for _ in range(FOLD_TRIES):
                        task = training_window(values, valid, self.spec, rng, spread, elevation, folds=folds)
                        if task is not None:
                            return task
                    continue
            task = training_window(values, valid, self.spec, rng, spread, elevation, real_clouds=self.real_clouds,
                                   wide_clouds=self.wide_clouds, history=history)
            if task is not None:
                return task

    def sample(self, batch_size: int, rng: torch.Generator) -> Batch:
        """A training batch of windows from the training fields and synthetic ones.

        Args:
            batch_size: windows in the batch.
            rng: the trainer's generator, the batch's only source of randomness (exact resume).

        Returns:
            The windows collated (:func:`~geonp.tasks.windows.collate_windows`), ``Dx = dim_x``.
        """
        np_rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=rng)))
        return collate_windows([self._window(np_rng, self.fields, self.synthetic) for _ in range(batch_size)])

    def validation(self, num_tasks: int, batch_size: int, seed: int) -> list[Batch]:
        """A fixed validation set: half ``val_files`` windows and half synthetic (all synthetic without them).

        Args:
            num_tasks: windows in all (at least one batch).
            batch_size: windows per batch.
            seed: the validation seed, never the training stream's.

        Returns:
            ``num_tasks // batch_size`` batches, the same for the same seed.
        """
        rng = np.random.default_rng([seed, 1])
        share = 0.5 if self.val_fields else 1.0
        return [collate_windows([self._window(rng, self.val_fields, share) for _ in range(batch_size)])
                for _ in range(max(1, num_tasks // batch_size))]
