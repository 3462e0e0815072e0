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
from typing import Any

import numpy as np
import torch

from geonp.data.readers import data_folder
from geonp.tasks.batch import Batch
from geonp.tasks.clouds import random_clouds
from geonp.tasks.history import flat_covariates
from geonp.tasks.training import training_window
from geonp.tasks.windows import WindowSpec, WindowTask, canonical, collate_windows

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


#: Entry keys of a training field (see :func:`_load`).
ENTRY_KEYS = frozenset({"path", "paths", "variable", "satellite", "isel", "region", "time", "exclude"})


def _load(entry: dict[str, Any], folder: Path, dem: Path | None = None
          ) -> tuple[np.ndarray, np.ndarray, float, np.ndarray | None]:
    """``(values [T, R, C], valid [T, R, C], spread, elevation [R, C] m or None)`` of one training-field entry.

    Keys: ``path`` (or ``paths``: files concatenated along time, e.g. daily files), ``variable``;
    optional ``satellite`` (true, or ``open_satellite`` keywords such as ``{valid_mask: mask}``:
    product QC applied and the valid area from the product), ``region`` (a named region or
    ``[south, north, west, east]`` in degrees, :func:`geonp.data.regions.get_region`: the part of
    the field to use, e.g. the training region of a region-transfer run), ``time`` (``[first,
    last]`` dates, both included: the steps to use, e.g. its training period), ``isel``
    (``{dim: [start, stop]}``: the same by index) and ``exclude`` (a list of such boxes, in the
    dims of the selected part, whose cells are never used: e.g. the cells an evaluation hides).
    ``dem``: a DEM regridded onto the field (:func:`geonp.data.elevation.attach_elevation`).
    """
    from geonp.data.cube import open_cube
    from geonp.data.elevation import attach_elevation
    from geonp.data.regions import crop_to_region, get_region, select_time
    from geonp.data.satellite import open_satellite

    unknown = sorted(set(entry) - ENTRY_KEYS)
    if unknown:
        raise ValueError(f"training field {entry.get('path', entry.get('paths'))}: unknown key(s) "
                         f"{', '.join(unknown)}; known: {', '.join(sorted(ENTRY_KEYS))}")

    paths = [Path(p) for p in (entry["paths"] if "paths" in entry else [entry["path"]])]
    paths = [p if p.is_absolute() else folder / p for p in paths]
    variable, satellite = entry["variable"], entry.get("satellite", False)
    parts = []
    for path in paths:
        if satellite:
            ds = open_satellite(path, variable, **(satellite if isinstance(satellite, dict) else {}))
        else:
            ds = open_cube(path, [variable])
        if "region" in entry:
            ds = crop_to_region(ds, get_region(entry["region"]))
        if "time" in entry:
            ds = select_time(ds, entry["time"], str(path))
        ds = ds.isel({d: slice(*v) for d, v in entry.get("isel", {}).items()})
        if dem is not None:
            ds = attach_elevation(ds, dem)
        da = canonical(ds, variable, str(path))
        da = da.isel({d: 0 for d in da.dims[:-3] if da.sizes[d] == 1})  # one level or member chosen
        if da.ndim > 3:
            raise ValueError(f"{path}: {variable!r} has extra dimensions {list(da.dims[:-3])}; choose one value "
                             f"of each for training with isel: {{{da.dims[0]}: [i, i + 1]}}")
        valid = np.ones(da.shape[1:], bool) if "valid" not in ds else np.asarray(ds["valid"].values, bool)
        height = None if dem is None else np.nan_to_num(np.asarray(ds["elevation"].transpose(*da.dims[1:]).values,
                                                                    np.float64))
        parts.append((np.asarray(da.values, np.float64), valid, da.dims, height))
    values = np.concatenate([v for v, _, _, _ in parts])
    dims = parts[0][2]
    for box in entry.get("exclude", []):
        values[tuple(slice(*box[d]) if d in box else slice(None) for d in dims)] = np.nan
    if satellite:
        valid = np.broadcast_to(parts[0][1], values.shape)
    else:  # land of an SST field stays out
        valid = np.broadcast_to(np.isfinite(values).any(0), values.shape)
    return values, valid, float(np.nanstd(values)) or 1.0, parts[0][3]


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
    """

    dim_y = 1

    def __init__(self, files: list[dict] | None = None, val_files: list[dict] | None = None,
                 synthetic: float = 0.5, window: dict | None = None, seed: int = 0,
                 real_clouds: float = 0.0, wide_clouds: float = 0.0, covariates: list[str] | None = None,
                 history_folds: int = 0, elevation: str | None = None) -> None:
        self.spec = WindowSpec.from_dict(window or {})
        self.covariates = list(covariates or [])
        if not isinstance(history_folds, int) or isinstance(history_folds, bool) or history_folds < 0:
            raise ValueError(f"data.history_folds must be a whole number >= 0, got {history_folds!r}")
        if history_folds and not self.covariates:
            raise ValueError("data.history_folds needs data.covariates (folds of what?)")
        self.history_folds = history_folds
        self.elevation = elevation is not None
        self.dim_x = 3 + self.elevation + len(self.covariates)
        folder = data_folder()
        dem = None
        if elevation is not None:
            dem = Path(elevation) if Path(elevation).is_absolute() else folder / elevation
            if not files:
                raise ValueError("data.elevation needs real training files (data.files): synthetic fields have none")
        self.fields = [self._with_history(*_load(e, folder, dem)) for e in files or []]
        self.val_fields = [self._with_history(*_load(e, folder, dem)) for e in val_files or []]
        self.synthetic = synthetic if self.fields else 1.0
        self.real_clouds, self.wide_clouds = real_clouds, wide_clouds
        self.checkpoint_meta = windows_checkpoint_meta(self.spec, self.covariates, self.elevation)

    def _with_history(self, values: np.ndarray, valid: np.ndarray, spread: float,
                      elevation: np.ndarray | None) -> tuple:
        """A field as ``(values, valid, spread, history [P, T, R, C] or None, folds, elevation [R, C] or
        None)``: ``folds`` the :class:`~geonp.tasks.history.HistoryFold` list, empty without folds or
        without a history."""
        if not self.covariates:
            return values, valid, spread, None, [], elevation
        from geonp.tasks.history import has_history, history_covariates, history_folds

        if self.history_folds and has_history(values, valid):  # flat covariates leak nothing: no folds
            folds = history_folds(values, valid, self.covariates, self.history_folds)
            return values, valid, spread, None, folds, elevation
        history, _ = history_covariates(values, valid, self.covariates)
        return values, valid, spread, history, [], elevation

    def _window(self, rng: np.random.Generator, fields: list, synthetic: float) -> WindowTask:
        while True:
            if rng.random() < synthetic or not fields:
                values = synthetic_field(self.spec.view, rng)
                valid, spread, history = np.ones(values.shape, bool), float(np.nanstd(values)) or 1.0, None
                elevation = np.zeros(values.shape[1:]) if self.elevation else None
                if self.covariates:
                    # Flat: a view of a few steps holds little history, and the EOFs of so short a stack
                    # would be fitted to the very cells the window then hides.
                    history = flat_covariates(len(self.covariates), values.shape, float(np.nanmean(values)))
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
