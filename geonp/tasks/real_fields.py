"""Real training fields, read and made ready for windows: values, valid area, spread, history.

A training config names real fields as entries (``{path, variable, ...}``, :func:`load_field`).
Each is read whole into memory once per run and, when the model takes history covariates, gets
them computed over its stack (or over folds of it, :func:`geonp.tasks.history.history_folds`).
That second part is DINEOF on every field, minutes each on large satellite stacks, so
:func:`prepare_fields` runs the fields side by side in worker processes where there are cores
for it: a run on a 16-core GPU machine starts in the time of its largest field rather than of all.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from geonp.tasks.history import has_history, history_covariates
from geonp.tasks.history import history_folds as history_folds_of
from geonp.tasks.windows import canonical
from geonp.threads import share_cores

#: A prepared field: ``(values [T, R, C], valid [T, R, C], spread, history [P, T, R, C] or None,
#: folds, elevation [R, C] or None)``, as :meth:`geonp.tasks.window_source.WindowSource` draws from.
Prepared = tuple

#: Cores per worker process by default. A run waits for its largest fields (an hourly month of
#: ERA5 took six minutes on one core here before DINEOF's Lanczos, 96 s since; a monthly
#: reanalysis seconds), so the cores go to threads for their linear algebra rather than to more
#: workers that would sit idle once the small fields are done. On a 16-core GPU machine (four
#: workers of four cores) the fields of ``history-folds-small`` were ready about 250 s after the
#: run started before Lanczos (``pipelines/weights/README.md``); on one thread here they take 424 s
#: since.
CORES_PER_WORKER = 4


#: Entry keys of a training field (see :func:`load_field`).
ENTRY_KEYS = frozenset({"path", "paths", "variable", "satellite", "isel", "region", "time", "exclude"})


def load_field(entry: dict[str, Any], folder: Path, dem: Path | None = None
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


def prepare_field(entry: dict[str, Any], folder: Path, dem: Path | None, covariates: list[str],
                  history_folds: int) -> Prepared:
    """One entry read (:func:`load_field`) and given its history: ``(values, valid, spread,
    history [P, T, R, C] or None, folds, elevation or None)``, ``folds`` the
    :class:`~geonp.tasks.history.HistoryFold` list (empty without folds or without a history)."""
    values, valid, spread, elevation = load_field(entry, folder, dem)
    if not covariates:
        return values, valid, spread, None, [], elevation
    if history_folds and has_history(values, valid):  # flat covariates leak nothing: no folds
        return values, valid, spread, None, history_folds_of(values, valid, covariates, history_folds), elevation
    history, _ = history_covariates(values, valid, covariates)
    return values, valid, spread, history, [], elevation


def prepare_fields(entries: list[dict[str, Any]], folder: Path, dem: Path | None, covariates: list[str],
                   history_folds: int, workers: int | None = None) -> list[Prepared]:
    """:func:`prepare_field` of every entry, in order, in up to ``workers`` processes.

    Args:
        entries: training-field entries (:func:`load_field`).
        folder: the data folder relative paths are under.
        dem: a DEM regridded onto every field, or None.
        covariates: the history covariates to compute (empty: none).
        history_folds: folds per field with a history (0: covariates over the whole stack).
        workers: processes (at most one per entry); None: one per :data:`CORES_PER_WORKER` cores
            this process may use when there are covariates to compute, else 1. Each process gets
            an equal share of the cores for its linear algebra. 1: everything here, no process
            started.

    Returns:
        The prepared fields, in the order of ``entries`` (each from its own seed: the same
        whatever ``workers``).

    Raises:
        ValueError: one line naming the entry (a worker's error is raised here as it was).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if workers is None:
        workers = max(1, cores // CORES_PER_WORKER) if covariates else 1
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"data.workers must be a whole number >= 1, got {workers!r}")
    workers = min(workers, len(entries))
    jobs = [(e, folder, dem, list(covariates), history_folds) for e in entries]
    if workers <= 1:  # also no entries at all
        return [prepare_field(*job) for job in jobs]
    # Spawned, not forked: a fork of a process that already runs torch's threads can deadlock.
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=share_cores,
                             initargs=(max(1, cores // workers),)) as pool:
        return [_unpacked(field) for field in pool.map(_prepare_packed, *zip(*jobs))]


def _prepare_packed(*job: Any) -> Prepared:
    """:func:`prepare_field` in a worker, its broadcast views sent back as their one stored row.

    A pickled view is sent whole: the valid mask repeated over every step, or the flat covariates
    of a field too large for a history (:func:`~geonp.tasks.covariate_maps.flat_covariates`, one number
    viewed as ``[P, T, R, C]``), would arrive as full arrays, gigabytes for the largest fields."""
    return _mapped(prepare_field(*job), _packed)


def _unpacked(field: Prepared) -> Prepared:
    return _mapped(field, _unpacked_array)


def _mapped(field: Prepared, f: Any) -> Prepared:
    """``field`` with ``f`` applied to each of its arrays and to each fold's."""
    values, valid, spread, history, folds, elevation = field
    folds = [dataclasses.replace(fold, hidden=f(fold.hidden), covariates=f(fold.covariates)) for fold in folds]
    return f(values), f(valid), spread, f(history), folds, f(elevation)


def _packed(a: np.ndarray | None) -> Any:
    if a is None or 0 not in a.strides or a.size == 0:
        return a
    stored = a[tuple(slice(None) if stride else slice(0, 1) for stride in a.strides)]
    return "broadcast", np.ascontiguousarray(stored), a.shape


def _unpacked_array(a: Any) -> np.ndarray | None:
    if isinstance(a, tuple) and a[0] == "broadcast":
        return np.broadcast_to(a[1], a[2])
    return a

