"""Gap-filling skill on artificially hidden cells: hide observed cells, infill, score, tabulate.

The hidden cells copy *real* gap patterns: time step ``t`` is masked with the cloud pattern of
another step of the same cube, so the test gaps have the sizes, shapes and coastal bias of the
product's own clouds (:mod:`geonp.tasks.hidden` does the hiding). Only a cube with a single scene
(or no usable donor step) falls back to synthetic clouds (``geonp.tasks.clouds.random_clouds``).
Every model sees the same masked cube, so the scores compare like with like; only the hidden
cells are scored, with ``geonp.metrics.gaussian_skill`` (RMSE, MAE, NLL, CRPS, 50/90/95% coverage,
90% interval score), plus two diagnostics: RMSE by distance to the nearest cell the models could
see, and the PIT histogram. ``geonp.skill_table`` writes the tables.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from geonp.data.cube import horizontal_dims, open_cube
from geonp.data.satellite import open_satellite
from geonp.data.valid import MaskSpec, valid_area
from geonp.fill.options import FillOptions, FitOptions
from geonp.metrics import (
    DISTANCE_BINS,
    Bins,
    binned_coverage,
    binned_rmse,
    distance_bin,
    gaussian_skill,
    pit_histogram,
)
from geonp.output_paths import check_report_path
from geonp.skill_table import write_table
from geonp.tasks.clouds import DONOR_CLOUDS, DONOR_GIVEN, DONOR_NONE  # noqa: F401 - the donor codes are part of this API
from geonp.tasks.hidden import MIN_OBSERVED, distance_to_context, hide_cells, hide_under_mask
from geonp.version import __version__


def evaluate(
    ds: xr.Dataset,
    variable: str,
    models: Sequence[str],
    *,
    valid_mask: MaskSpec | None = None,
    checkpoints: Mapping[str, str] | None = None,
    fit_steps: int | Mapping[str, int] | None = None,
    seed: int = 0,
    infill_fn: Callable[..., xr.Dataset] | None = None,
    options: Mapping[str, Any] | None = None,
    max_hidden: float = 0.5,
    cover: float = 0.3,
    hide_steps: Sequence[int] | None = None,
    elevation: str | Path | None = None,
    hide_under: xr.DataArray | np.ndarray | None = None,
    distance_bins: Bins = DISTANCE_BINS,
    keep_cells: bool = False,
    progress: bool = False,
    samples: int = 0,
) -> dict[str, Any]:
    """Score ``models`` at the same artificially hidden cells of ``ds[variable]``.

    Args:
        ds: the cube (``open_cube``/``open_satellite`` convention); ``ds[variable]`` has dims
            ``([time,] lat, lon)`` or ``([time,] y, x)``.
        variable: the field to evaluate.
        models: model names for ``geonp.fill.engine.infill`` (``"te-pt-tnp"``, ``"linear"``, ...).
        valid_mask: the valid area (a variable of ``ds``, a file, a ``(file, variable)`` pair, a
            DataArray, ``"observed"`` or ``"all"``); None: ``ds["valid"]`` if present, else every
            cell (see ``geonp.data.valid``; pass ``"observed"`` to leave out cells never observed).
        checkpoints: ``{model: checkpoint path}`` for the models that need one.
        fit_steps: fine-tuning steps, for every model or ``{model: steps}`` (None, or a model
            missing: geonp's default, ``FitOptions().steps``, the same as ``geonp infill``'s, so a
            model is scored as infill fills with it); models without weights ignore it.
        seed: seeds the hidden cells and each infill call.
        infill_fn: replaces ``geonp.fill.engine.infill`` (same signature); for tests and wrappers.
        options: extra keyword arguments for every infill call (``device``, ...).
        max_hidden, cover: as in ``hide_cells``.
        hide_steps: hide cells in these steps only (``hide_cells``'s ``steps``): the others stay
            whole, as the history a day under a cloud is filled from.
        elevation: a DEM file for the models that take elevation (a checkpoint trained with
            ``data: {elevation: ...}``, :func:`geonp.fill.predictor.takes_elevation`) and for
            ``kriging`` (an external drift); the others fill without it.
        hide_under: a gap mask of your own instead of borrowed gaps: bool, True where a cloud
            is, on ``ds[variable]``'s dims (or broadcastable to them by position, e.g. one
            ``[rows, cols]`` mask for every step); the observed cells under it are hidden, and
            ``max_hidden``, ``cover`` and ``hide_steps`` do not apply. E.g. another product's
            or another day's real clouds.
        distance_bins: the distance bins of the diagnostics (``geonp.metrics.DISTANCE_BINS``;
            ``WIDE_DISTANCE_BINS`` splits the far bin at 25 cells, for wide clouds).
        keep_cells: also return the hidden cells themselves, for analyses of their own (noise
            by resampling blocks of cells, maps of the errors): the result gains ``"cells"``
            and each row ``"mean"`` and ``"std"`` (below). Not JSON: drop them before writing.
        progress: a line on stderr as each model starts and ends (a fill can take minutes).
        samples: also draw this many coherent samples of each fill (``infill``'s ``samples``) and
            score them as a whole (:func:`geonp.sample_scores.cube_sample_scores`: energy and
            variogram scores, 90% coverage of patch and 8x8 block means, beside independent
            per-cell draws); each row gains ``"samples"``, those figures.

    Returns:
        ``{"source", "variable", "units", "seed", "steps", "observed_cells", "hidden_cells",
        "hidden_fraction" (of the observed cells), "donors" (per step, see ``hide_cells``),
        "hidden_by_distance" (``{bin label: hidden cells}``, in ``distance_bins``),
        "rows"}``; each row is ``{"model", **gaussian_skill scores, "rmse_by_distance"
        (``{bin label: {"n", "rmse", "mae"}}``), "coverage_90_by_distance" (``{bin label: 90%
        interval coverage}``), "pit" (10 counts, ``pit_histogram``), "wall_s"
        (seconds for the infill call), "fit_steps" (the steps asked: the key pipelines merge runs
        by), "fit_steps_taken" (the fill's ``geonp_fit_steps``, 0 for a model with nothing to
        fine-tune; the steps asked where the fill does not say), "checkpoint"}``. Scores are in the variable's
        units, NLL in nats per cell; ``n`` counts the hidden cells the model gave a finite mean and
        std > 0. A hidden cell's distance is Euclidean, in grid cells, to the nearest cell of the
        same step that is finite and valid in the masked cube (what every model sees as context).
        With ``keep_cells``: ``"cells"`` is ``{"dims", "shape" (of ``ds[variable]``), "index"
        (flat C-order indices of the hidden cells, ``[n_hidden]``), "truth", "distance"}`` and
        each row's ``"mean"``/``"std"`` are the model's ``[n_hidden]`` values at those cells.

    Raises:
        ValueError: one line naming the data, variable or model: an unknown variable, no observed
            cell, nothing to hide, a model ``infill`` rejects or one with no usable prediction.
    """
    name = str(ds.attrs.get("geonp_source", "the dataset"))
    if variable not in ds.data_vars:
        raise ValueError(f"{name}: unknown variable {variable!r}; it has {', '.join(map(str, ds.data_vars))}")
    if not models:
        raise ValueError("no model to evaluate")
    if samples == 1:  # an interval of block means, and the energy score's spread term, need two
        raise ValueError("--samples 1: scoring samples needs at least 2 of them (or 0 for none)")
    if infill_fn is None:
        infill_fn = _engine(models)

    edges = [edge for _, edge in distance_bins]
    if not edges or edges[-1] != np.inf or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"distance bins must have increasing upper edges ending at inf, got {list(distance_bins)}")
    da = ds[variable].compute()  # the truth, loaded once
    valid = static_valid_area(ds, da, valid_mask, name)
    observed = int((np.isfinite(da) & valid).sum())
    if observed == 0:
        raise ValueError(f"{name}: {variable!r} has no observed cell inside the valid area")
    if hide_under is None:
        masked, hidden = hide_cells(da, valid, np.random.default_rng(seed), max_hidden=max_hidden, cover=cover,
                                    steps=hide_steps)
    else:
        masked, hidden = hide_under_mask(da, valid, hide_under, name)
    hide = hidden.values
    n_hidden = int(hide.sum())
    if n_hidden == 0:
        raise ValueError(f"{name}: no cell of {variable!r} could be hidden (every step has fewer than "
                         f"{MIN_OBSERVED} observed cells)")
    truth = da.values[hide]
    distance = distance_to_context(masked, valid)[hide]  # [n_hidden] grid cells; the same for every model
    masked_ds = ds.assign({variable: masked})

    with_elevation = _elevation_takers(models, checkpoints or {}, elevation)
    default = FitOptions().steps
    rows = []
    for model in models:
        steps = fit_steps.get(model, default) if isinstance(fit_steps, Mapping) else \
            (default if fit_steps is None else fit_steps)
        checkpoint = (checkpoints or {}).get(model)
        extra = {"elevation": elevation} if model in with_elevation else {}
        if samples:
            extra["samples"] = samples
        if progress:
            print(f"evaluate {variable}: {model} filling {n_hidden} hidden cells ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            out = infill_fn(masked_ds, variable, model, checkpoint=checkpoint, valid_mask=valid,
                            fit_steps=steps, seed=seed, **extra, **(options or {}))
            # What the fill chose on the input itself (its nugget, whether it used the history).
            chosen = {key: out.attrs[f"geonp_{key}"] for key in ("nugget", "history_used")
                      if f"geonp_{key}" in out.attrs}
            fitted = out.attrs.get("geonp_fit_steps")  # the steps the model took (0: nothing to fine-tune)
            layers = [variable, f"{variable}_std"] + ([f"{variable}_sample"] if samples else [])
            out = out[layers].compute()  # a lazy result's work is part of the time
            wall = time.perf_counter() - start
            mean, std = (_like(out[v], da).values[hide] for v in (variable, f"{variable}_std"))
            if samples:
                chosen["samples"] = _sample_scores(out, variable, da, hide, seed)
        except (ValueError, KeyError) as err:
            raise ValueError(f"{name}: {variable!r} with model {model!r}: {_one_line(err)}") from err
        try:
            scores = gaussian_skill(truth, mean, std)
        except ValueError:
            raise ValueError(f"{name}: model {model!r} gave no finite mean and positive std at any hidden cell "
                             f"of {variable!r}") from None
        if progress:
            print(f"evaluate {variable}: {model} RMSE {scores['rmse']:.4g}, CRPS {scores['crps']:.4g} ({wall:.0f} s)",
                  file=sys.stderr, flush=True)
        # The diagnostics score the points gaussian_skill scored: a cell without a usable std counts nowhere.
        usable = np.isfinite(truth) & np.isfinite(mean) & np.isfinite(std) & (std > 0)
        rows.append({"model": model, **scores, **chosen,
                     "rmse_by_distance": binned_rmse(np.where(usable, mean - truth, np.nan), distance, distance_bins),
                     "coverage_90_by_distance": binned_coverage(np.where(usable, mean - truth, np.nan), std,
                                                                distance, bins=distance_bins),
                     "pit": pit_histogram(truth, mean, std), "wall_s": wall, "fit_steps": steps,
                     "fit_steps_taken": int(fitted) if fitted is not None else steps,
                     "checkpoint": checkpoint, **({"mean": mean, "std": std} if keep_cells else {})})
    per_bin = np.bincount(distance_bin(distance, distance_bins), minlength=len(distance_bins))
    cells = {"cells": {"dims": da.dims, "shape": da.shape, "index": np.flatnonzero(hide), "truth": truth,
                       "distance": distance}} if keep_cells else {}
    return {**cells, "source": name, "variable": variable, "units": str(da.attrs.get("units", "")), "seed": seed,
            "steps": len(hidden.attrs["geonp_donor"]), "observed_cells": observed, "hidden_cells": n_hidden,
            "hidden_fraction": n_hidden / observed, "donors": hidden.attrs["geonp_donor"].tolist(),
            "hidden_by_distance": {label: int(n) for (label, _), n in zip(distance_bins, per_bin, strict=True)},
            "rows": rows}


def _sample_scores(out: xr.Dataset, variable: str, da: xr.DataArray, hide: np.ndarray, seed: int) -> dict:
    """The fill's samples scored as a whole at the hidden cells (``da``'s dims, time added if absent)."""
    from geonp.sample_scores import cube_sample_scores

    grids = [_like(out[v], da).values for v in (variable, f"{variable}_std")]
    drawn = out[f"{variable}_sample"]
    drawn = np.stack([_like(drawn.isel(sample=i), da).values for i in range(drawn.sizes["sample"])])
    if da.ndim not in (2, 3):
        raise ValueError(f"--samples: scored on (time,) rows, cols fields; {da.name!r} has dims {da.dims}")
    if da.ndim == 2:  # one scene: a time axis of one step
        grids, drawn, truth, hide = [g[None] for g in grids], drawn[:, None], da.values[None], hide[None]
    else:
        truth = da.values
    return cube_sample_scores(truth.astype(np.float64), drawn.astype(np.float64), *grids, hide, seed)


def run_evaluate(
    input: str,
    variables: Sequence[str],
    models: Sequence[str],
    out: str | Path,
    *,
    valid_mask: MaskSpec | None = None,
    checkpoints: Mapping[str, str] | None = None,
    fit_steps: int | Mapping[str, int] | None = None,
    seed: int = 0,
    satellite: bool = False,
    options: Mapping[str, Any] | None = None,
    infill_fn: Callable[..., xr.Dataset] | None = None,
    elevation: str | Path | None = None,
    progress: bool = False,
    samples: int = 0,
) -> list[dict[str, Any]]:
    """``geonp evaluate``: score ``models`` on ``variables`` of a file; write the tables.

    Args:
        input: the cube or satellite product (a path or URL).
        variables: the fields to evaluate, each on its own.
        models: model names, as for :func:`evaluate`.
        out: the markdown table to write; the JSON goes beside it (``.json``).
        valid_mask: the valid area, as for :func:`evaluate`.
        checkpoints: ``{model: checkpoint path}`` for models that should not use bundled weights.
        fit_steps: fine-tuning steps, for every model or ``{model: steps}`` (default geonp infill's).
        seed: seeds the hidden cells and each infill call.
        satellite: open each variable with ``open_satellite`` (product QC, ``valid`` mask from
            ``valid_mask`` or the product) instead of ``open_cube``.
        options: extra keyword arguments for every infill call (``device``, ...).
        infill_fn: replaces ``geonp.fill.engine.infill`` (same signature); for tests and wrappers.
        elevation: a DEM file for the models that take elevation, as for :func:`evaluate`.
        progress: progress lines on stderr, as for :func:`evaluate`.
        samples: coherent samples per fill, scored as a whole, as for :func:`evaluate`.

    Returns:
        The results of :func:`evaluate`, one dict per variable.

    Raises:
        ValueError: one line naming the file and the variable or model: a missing variable, a
            variable with no observed cell, an unknown model; or, before any model runs, the ``-o``
            at fault (:func:`geonp.output_paths.check_report_path`), a fill option, the device, an
            unreadable checkpoint or one for a model not evaluated.
    """
    if not variables:
        raise ValueError(f"{input}: name at least one variable to evaluate")
    if not models:
        raise ValueError(f"{input}: name at least one model to evaluate")
    md_path, json_path = check_report_path(out, input)  # before the models run, not after
    _check_up_front(models, checkpoints or {}, fit_steps, seed, samples, options or {})
    # A mask named as a variable of the file must be opened with the fields: open_cube keeps only those.
    in_file = isinstance(valid_mask, str) and not Path(valid_mask).exists() and "://" not in valid_mask
    cube = None if satellite else open_cube(input, [*variables, valid_mask] if in_file else list(variables))
    results = []
    for variable in variables:
        try:
            ds = open_satellite(input, variable, valid_mask=valid_mask) if satellite else cube
            results.append(evaluate(ds, variable, models, valid_mask=None if satellite else valid_mask,
                                    checkpoints=checkpoints, fit_steps=fit_steps, seed=seed, infill_fn=infill_fn,
                                    options=options, elevation=elevation, progress=progress,
                                    samples=samples))
        except ValueError as err:
            message = _one_line(err)
            raise ValueError(message if message.startswith(str(input)) else f"{input}: {message}") from err
    md_path.parent.mkdir(parents=True, exist_ok=True)
    header = "\n".join([
        "# Gap-filling skill on artificially hidden cells", "",
        f"- input: {input}", f"- variables: {', '.join(variables)}", f"- models: {', '.join(models)}",
        f"- seed: {seed}, fit steps: {FitOptions().steps if fit_steps is None else fit_steps}, "
        f"options: {', '.join(f'{k} {v}' for k, v in (options or {}).items() if v is not None) or 'none'}"
        + (f", elevation: {elevation}" if elevation is not None else ""),
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- versions: geonp {__version__}, numpy {np.__version__}, xarray {xr.__version__}, "
        f"Python {platform.python_version()}",
    ])
    write_table(results, md_path, json_path, header=header)
    return results


# -- helpers ---------------------------------------------------------------------------------

def _check_up_front(models: Sequence[str], checkpoints: Mapping[str, str], fit_steps: int | Mapping[str, int] | None,
                    seed: int, samples: int, options: Mapping[str, Any]) -> None:
    """Refuse now what would otherwise stop the run at a later model, after the earlier ones have
    run for minutes: each model's fill options, the device, each checkpoint's header, and a
    checkpoint for a model not evaluated (which would be ignored)."""
    unused = sorted(set(checkpoints) - set(models))
    if unused:
        raise ValueError(f"--checkpoint {unused[0]}={checkpoints[unused[0]]}: {unused[0]!r} is not among the "
                         f"models evaluated ({', '.join(models)})")
    fields = {f.name for f in dataclasses.fields(FillOptions)}
    given = {k: v for k, v in options.items() if k in fields}
    for model in models:
        steps = fit_steps.get(model) if isinstance(fit_steps, Mapping) else fit_steps
        FillOptions.from_keywords(fit_steps=steps, seed=seed, samples=samples, **given)
    if given.get("device") not in (None, "auto"):
        from geonp.device import resolve_device

        resolve_device(str(given["device"]))
    from geonp.fill.predictor import model_names, takes_elevation

    for model, path in checkpoints.items():
        if model in model_names():  # an unknown name is refused with the others when the models load
            try:
                takes_elevation(model, path)  # reads the header: an unreadable file fails here
            except ValueError as err:
                raise ValueError(f"--checkpoint {model}={path}: {_one_line(err)}") from err


def _elevation_takers(models: Sequence[str], checkpoints: Mapping[str, str], elevation: str | Path | None) -> set[str]:
    """The models that are given ``elevation``: those whose weights take it, and kriging, which uses
    it as an external drift (none without a DEM)."""
    if elevation is None:
        return set()
    from geonp.fill.predictor import ELEVATION_STACK_METHODS, takes_elevation

    takers = set()
    for model in models:
        try:
            if model in ELEVATION_STACK_METHODS or takes_elevation(model, checkpoints.get(model)):
                takers.add(model)
        except ValueError as err:
            raise ValueError(f"model {model!r}: {_one_line(err)}") from err
    if not takers:
        raise ValueError(f"--elevation {elevation}: none of the models ({', '.join(models)}) takes elevation; "
                         "drop --elevation")
    return takers


def _engine(models: Sequence[str]) -> Callable[..., xr.Dataset]:
    """The infill engine, imported only now (torch, models), after checking the model names up front:
    a typo in the last model must not surface after the first has run for an hour."""
    from geonp.fill.predictor import model_names

    unknown = [m for m in models if m not in model_names()]
    if unknown:
        raise ValueError(f"unknown model {', '.join(map(repr, unknown))}; available: {', '.join(model_names())}")
    from geonp.fill.engine import infill

    return infill


def _like(pred: xr.DataArray, da: xr.DataArray) -> xr.DataArray:
    """``pred`` on ``da``'s dims: the engine gives a single scene a length-1 time axis."""
    pred = pred.isel({d: 0 for d in pred.dims if d not in da.dims and pred.sizes[d] == 1})
    if set(pred.dims) != set(da.dims) or pred.transpose(*da.dims).shape != da.shape:
        raise ValueError(f"the prediction of {da.name!r} has dims {dict(pred.sizes)}, not {dict(da.sizes)}")
    return pred.transpose(*da.dims)


def static_valid_area(ds: xr.Dataset, da: xr.DataArray, spec: MaskSpec | None, name: str) -> xr.DataArray:
    """The valid area (geonp's one rule, :func:`geonp.data.valid.valid_area`) as an in-memory bool
    DataArray on ``da``'s horizontal dims: a cell counts when it is valid in any time step."""
    mask, _ = valid_area(ds, da, spec, name)
    others = [d for d in mask.dims if d not in horizontal_dims(ds)]
    return (mask.any(others) if others else mask).compute()


def _one_line(err: BaseException) -> str:
    text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    return " ".join(str(text).split())
