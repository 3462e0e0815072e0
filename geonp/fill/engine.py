"""``geonp infill``: fill every gap of a cube, block by block, into a dataset or a CF Zarr store.

Two entry points share one pipeline (prepare the fields, choose the model, optionally fine-tune
it on the cube's own observations, fill each block):

* :func:`infill` returns an in-memory ``xarray.Dataset`` (``geonp.infill(ds, model=...)``);
* :func:`infill_to_zarr` writes a resumable Zarr store and never holds more than a block.
"""

from __future__ import annotations

import datetime as dt
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

import geonp.fill as fill_defaults
from geonp.data.cube import renamed_from
from geonp.device import resolve_device
from geonp.fill import FIT_STEPS
from geonp.fill.blocks import BlockResult, fill_block
from geonp.fill.field import Field, select_variables, summarise, valid_area
from geonp.fill.layout import restore_layout
from geonp.fill.output import WITHOUT_CONTEXT, InfillStore, block_list, output_template
from geonp.fill.predictor import ModelChoice, choose_model
from geonp.fill.stack import add_history, add_history_folds, reconstruct, stack_block
from geonp.tasks.far_context import FAR_SHARE, MIN_FAR, OPENING
from geonp.tasks.windows import WindowSpec, canonical, extra_indices
from geonp.version import __version__


@dataclass
class Plan:
    """Everything a block needs: the fields, the model, the window spec and run settings."""

    fields: list[Field]
    choice: ModelChoice
    spec: WindowSpec
    cubes: dict[str, xr.DataArray]  # each variable as [*extra, time, rows, cols] (see ``canonical``)
    shape: tuple[int, int, int]  # the largest field's [time, rows, cols], which ``spec`` is fitted to
    elevation: np.ndarray | None
    device: torch.device
    batch_size: int
    seed: int
    fit_steps: int
    calibrate_sigma: bool = False  # scale sigma on the input's own cells (geonp.fill.calibrate)
    command: str = "geonp.infill(...) (Python)"
    notes: list[str] = field(default_factory=list)
    history: str | None = None  # the history covariates each field got, when the model takes them
    sigma_scales: str | None = None  # the calibration's sigma scale per distance bin, when calibrated

    def fill(self, f: Field, key: tuple[slice, slice, slice]) -> BlockResult:
        if self.choice.model is None:  # a stack method: the field was reconstructed when planned
            return stack_block(f, key)
        # A field of another shape than the largest (no time axis beside a cube that has one)
        # gets the same windows clipped to it, as a cube of that shape alone would.
        return fill_block(f, key, self.choice.model, self.spec_for(f), self.elevation, self.device,
                          self.batch_size, self.seed)

    def spec_for(self, f: Field) -> WindowSpec:
        """The windows of field ``f``: ``spec``, clipped to a field smaller than the largest."""
        return self.spec if f.shape == self.shape else self.spec.fitted_to(f.shape)

    def field(self, name: str, index: dict[str, int]) -> Field:
        """The field of variable ``name`` at ``index`` along its extra dims."""
        return next(f for f in self.fields if f.name == name and f.index == index)

    @property
    def names(self) -> list[str]:
        """The filled variables, in order."""
        return list(self.cubes)


def _window_spec(window: WindowSpec | tuple | str | None, shape: tuple[int, int, int],
                 scaling: dict[str, Any], gridded: bool = False) -> WindowSpec:
    """``--window T,R,C``: the core size; default windows shrink to small cubes, explicit ones must fit.

    The halo and the thinning rule (``time_cells``) are the checkpoint's training windows'
    (``scaling["window"]``), so a model trained with a history of several steps reads one.

    ``gridded``: the model has a grid path (ConvCNP), whose density channel learned the context
    density of its training windows, so it keeps their context cap (``scaling["window"]``).
    Measured with the bundled convcnp (trained at 512): given every observed cell of 64 x 64
    windows instead, Alboran SST RMSE was 0.311 and 90% coverage 0.67.
    """
    trained = scaling.get("window", {})
    cap = {"max_context": int(trained["max_context"])} if gridded and "max_context" in trained else {}
    # The context a model was trained to read: its time/space halo and how its context was thinned
    # (a model trained on a scene's history needs that history at infill too).
    seen = {k: tuple(trained[k]) if k == "halo" else float(trained[k]) for k in ("halo", "time_cells") if k in trained}
    base = WindowSpec(**{k: v for k, v in scaling.items() if k in ("cells_per_unit", "steps_per_unit")}, **cap,
                      **seen)
    if window is None:
        return base.fitted_to(shape)
    if isinstance(window, WindowSpec):
        spec = window
    else:
        parts = [int(p) for p in window.split(",")] if isinstance(window, str) else list(window)
        if len(parts) == 2:
            parts = [1, *parts]
        if len(parts) != 3:
            raise ValueError(f"--window: expected T,R,C (or R,C), got {window!r}")
        overlap = tuple(min(o, max(c - 1, 0)) for o, c in zip(base.overlap, parts))
        spec = WindowSpec(tuple(parts), overlap, base.halo, base.max_context, base.cells_per_unit,
                          base.steps_per_unit, base.time_cells)
    if any(c > n for c, n in zip(spec.core, shape)):
        raise ValueError(f"--window {','.join(map(str, spec.core))}: larger than the cube "
                         f"({','.join(map(str, shape))} as time,rows,cols)")
    return spec


def plan(ds: xr.Dataset, variables: str | list[str] | None = None, model: str = "te-pt-tnp", *,
         checkpoint: str | Path | None = None, valid_mask: str | Path | xr.DataArray | None = None,
         elevation: str | Path | None = None, window: WindowSpec | tuple | str | None = None,
         device: str = "auto", batch_size: int = 16, seed: int = 0, fit_steps: int = FIT_STEPS,
         calibrate_sigma: bool | None = None, source: str = "the input", command: str | None = None) -> Plan:
    """Check the request against the cube and load the model; raises ValueError with one line."""
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    if fit_steps < 0:
        raise ValueError(f"--fit-steps must be >= 0, got {fit_steps}")
    dev = resolve_device(device)
    if elevation is not None:
        from geonp.data import attach_elevation

        ds = attach_elevation(ds, elevation)
    names = select_variables(ds, variables, source, valid_mask if isinstance(valid_mask, str) else None)
    fields, cubes = [], {}
    for name in names:
        cubes[name] = canonical(ds, name, source)
        for index in extra_indices(cubes[name]):
            da = cubes[name].isel(index)
            fields.append(Field(name, da, valid_area(ds, valid_mask, da, source), index))
    largest = tuple(max(n) for n in zip(*(f.shape for f in fields)))
    summarise(fields, source)
    use_elevation = elevation is not None
    choice = choose_model(model, checkpoint, use_elevation, dev)
    elev = None
    if choice.elevation:
        if "elevation" not in ds.coords:
            raise ValueError(f"--model {model}: the model takes elevation but {source} has none; pass --elevation")
        elev = np.nan_to_num(ds["elevation"].transpose(*fields[0].data.dims[1:]).values.astype(np.float64))
    spec = _window_spec(window, largest, choice.scaling, getattr(choice.model, "supports_gridded", False))
    result = Plan(fields, choice, spec, cubes, largest, elev, dev, batch_size, seed, fit_steps,
                  fill_defaults.CALIBRATE_SIGMA if calibrate_sigma is None else bool(calibrate_sigma))
    if choice.covariates:
        result.history = "; ".join(add_history(f, choice.covariates, seed) for f in fields if f.observed)
    if choice.model is None:
        result.history = "; ".join(reconstruct(f, model, seed) for f in fields)
    if command:
        result.command = command
    for name in names:
        mine = [f for f in fields if f.name == name]
        if any(f.infinite for f in mine):
            result.notes.append(f"{name}: {sum(f.infinite for f in mine)} cells hold +-inf; they are filled as gaps")
        empty = [f.label for f in mine if f.observed == 0]
        if empty:
            result.notes.append(f"{name}: {', '.join(empty)} hold no observed value; left as they are (flag 2)")
        if all(f.gaps == 0 for f in mine):
            result.notes.append(f"{name}: no gaps inside the valid area; the output holds the input with flags")
    return result


def provenance(p: Plan, source: str) -> dict[str, Any]:
    """Global attributes saying how the output was made.

    ``Conventions`` and ``title`` are defaults for an input that has none: the output keeps every
    global attribute of its input (:func:`geonp.fill.layout.restore_layout`), and ``history``
    gains this run's line. The rest is geonp's own, under ``geonp_`` names no input uses.
    """
    now = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ}"
    attrs = {
        "Conventions": "CF-1.11",
        "title": f"Gap-filled {', '.join(p.names)} ({p.choice.name})",
        "history": f"{now} {p.command}",
        "geonp_input": str(source),
        "geonp_version": __version__,
        "geonp_model": p.choice.name,
        "geonp_checkpoint": str(p.choice.checkpoint) if p.choice.checkpoint else "none (model without weights)",
        "geonp_checkpoint_sha256": p.choice.sha256 or "none",
        "geonp_fit_steps": p.fit_steps,
        "geonp_window": str(p.spec.as_dict()),
        "geonp_date_created": now,
    }
    if p.history is not None:
        attrs["geonp_history"] = p.history
    if p.sigma_scales is not None:
        attrs["geonp_sigma_scales"] = p.sigma_scales
    if p.notes:
        attrs["geonp_notes"] = "; ".join(p.notes)
    return attrs


def _finetune(p: Plan, store_dir: Path | None, say: Callable[[str], None] | None) -> None:
    """``--fit-steps``: fine-tune on the cube's own observations (reusing weights saved by a killed run)."""
    if p.fit_steps == 0 or p.choice.model is None or not p.choice.model.trainable or all(f.gaps == 0 for f in p.fields):
        return
    from geonp.fill.finetune import finetune
    from geonp.models import load, save

    saved = None if store_dir is None else store_dir / "geonp_fitted_model.safetensors"
    if saved is not None and saved.exists():
        # The same attention blocking as the fine-tuned model had: another blocking sums in
        # another order, and a resumed run must write what an uninterrupted one would.
        p.choice.model = load(saved, device=p.device).for_prediction()
        return
    folds = fill_defaults.FIT_HISTORY_FOLDS  # read now, so setting geonp.fill.FIT_HISTORY_FOLDS takes effect
    if p.choice.covariates and folds:
        for f in p.fields:
            add_history_folds(f, p.choice.covariates, folds, p.seed)
    p.choice.model = finetune(p.choice.model, p.fields, p.spec, p.fit_steps, p.device, p.seed, p.elevation, say)
    for f in p.fields:
        f.folds = []  # only fine-tuning needs them: blocks (and dask workers) do not carry them
    if saved is not None:
        save(p.choice.model, saved, extra={"infill": {"fit_steps": p.fit_steps}})


def _calibrate(p: Plan, say: Callable[[str], None] | None) -> None:
    """Sigma scaled per distance bin on the input's own hidden cells (:mod:`geonp.fill.calibrate`),
    when the plan asks for it and the model is a trained neural process."""
    if not p.calibrate_sigma or p.choice.model is None or not p.choice.model.trainable \
            or all(f.gaps == 0 for f in p.fields):
        return
    from geonp.fill.calibrate import calibrate, describe

    p.choice.model, scales = calibrate(p.choice.model, p.fields, p.spec, p.device, p.seed, p.elevation,
                                       p.choice.covariates)
    p.sigma_scales = describe(scales)
    if say:
        say(f"sigma calibrated on the input's own cells, scale by distance to an observation: {p.sigma_scales}")


def _request(p: Plan, source: str) -> dict[str, Any]:
    return {"source": str(source), "variables": p.names, "model": p.choice.name,
            "checkpoint_sha256": p.choice.sha256, "fit_steps": p.fit_steps, "window": p.spec.as_dict(),
            "seed": p.seed, "elevation": p.elevation is not None, "calibrate_sigma": p.calibrate_sigma,
            "valid_cells": [int(f.valid.sum()) for f in p.fields],
            # How windows reach beyond their halo: a store filled under another rule is not resumed.
            "far_context": {"min_far": MIN_FAR, "opening": OPENING, "share": FAR_SHARE}}


def _without_context_text(totals: dict[str, int]) -> str:
    return ", ".join(f"{v} {n}" for v, n in totals.items())


def infill(ds: xr.Dataset, variables: str | list[str] | None = None, model: str = "te-pt-tnp", *,
           progress: bool = False, like: xr.Dataset | None = None, **options: Any) -> xr.Dataset:
    """Fill the gaps of ``ds`` in memory (``geonp.infill``).

    Every NaN cell of each variable inside its valid area is predicted; observed cells are
    copied unchanged.

    Args:
        ds: the cube, in ``open_cube``'s convention (``[time,] lat, lon`` or ``[time,] y, x``;
            further dimensions such as ``level`` are filled one index at a time).
        variables: the variable or variables to fill; default every gridded field.
        model: a registry name (``geonp models``): ``"te-pt-tnp"`` (bundled weights), another
            trained model, or a baseline (``"linear"``, ``"kriging"``, ``"gp"``, ...).
        progress: print progress lines on stderr.
        like: the layout to return: its dimensions, coordinates and global attributes (default
            ``ds``; give the dataset as it was before :func:`geonp.data.cube.to_convention` to get
            its own names back, see :mod:`geonp.fill.layout`).
        options: :func:`plan`'s keywords: ``checkpoint`` (weights instead of the bundled ones),
            ``valid_mask`` (see :func:`geonp.data.valid.valid_area`), ``elevation`` (a DEM, for
            models trained with it), ``window`` (cells each window predicts, ``(T, R, C)``),
            ``device``, ``batch_size`` (windows per model call), ``seed`` and ``fit_steps``
            (fine-tuning steps on ``ds``'s own observed cells first; default
            :data:`geonp.fill.FIT_STEPS`).

    Returns:
        A Dataset with, per variable ``v``: ``v`` (observed or predicted, ``v``'s units),
        ``v_std`` (1-sigma predictive standard deviation, same units; 0 at observed cells, NaN
        outside the valid area) and ``v_flag`` (0 observed, 1 infilled, 2 outside the valid
        area), with CF attributes and provenance. The global attribute
        ``geonp_gaps_without_context_<v>`` counts the gap cells of ``v`` that had no observation
        in reach on their window's time steps and got ``v``'s global mean and spread (a warning
        says so when there are any).

    Raises:
        ValueError: one line naming the problem: an unknown variable or model, a checkpoint for
            another model, a window larger than the cube, bad option values.
    """
    say = _stderr if progress else None
    p = plan(ds, variables, model, **options)
    for note in p.notes:
        warnings.warn(note, stacklevel=2)
    _finetune(p, None, say)
    _calibrate(p, say)
    template = output_template(xr.Dataset(p.cubes), p.names)
    arrays = {v: np.empty(template[v].shape, template[v].dtype) for v in template.data_vars}
    totals = dict.fromkeys(p.names, 0)
    for variables, region in block_list(template):
        values, without = _block_values(p, variables, region)
        for name, array in values.items():
            arrays[name][tuple(region[d] for d in template[name].dims)] = array
        for name, n in without.items():
            totals[name] += n
    result = xr.Dataset({v: (template[v].dims, arrays[v], template[v].attrs) for v in template.data_vars},
                        coords=template.coords)
    result.attrs = provenance(p, options.get("source", "in-memory dataset"))
    result.attrs.update({f"{WITHOUT_CONTEXT}_{v}": n for v, n in totals.items()})
    result = restore_layout(result, ds if like is None else like, renamed_from(ds))
    if any(totals.values()):
        warnings.warn(f"gap cells without any observation in reach, filled with the global mean: "
                      f"{_without_context_text(totals)}", stacklevel=2)
    return result


def infill_to_zarr(ds: xr.Dataset, out: str | Path, variables: str | list[str] | None = None,
                   model: str = "te-pt-tnp", *, source: str = "the input", overwrite: bool = False,
                   zarr_format: int = 3, scheduler: str | None = None, workers: int | None = None,
                   progress: bool = True, like: xr.Dataset | None = None, **options: Any) -> Path:
    """Fill ``ds`` into the Zarr store ``out`` (see :mod:`geonp.fill.output`), resumably.

    Blocks (the input's chunks) are written one by one, each marked done after its data; the
    same call after an interruption continues from the written blocks and gives the same store.

    Args:
        ds: the cube, as for :func:`infill`.
        out: the output Zarr store.
        variables: the variable or variables to fill; default every gridded field.
        model: a registry name, as for :func:`infill`.
        source: how to name the input in messages and provenance.
        overwrite: replace an existing, different or finished store at ``out``.
        zarr_format: 3 (default) or 2.
        scheduler: None fills blocks one after another in this process (torch uses the cores);
            a dask.distributed scheduler address spreads blocks over its workers.
        workers: start a local dask cluster of this many worker processes and spread blocks
            over it (not with ``scheduler``).
        progress: progress lines on stderr.
        like: the layout of the finished store (default ``ds``; see :func:`infill`).
        options: :func:`plan`'s keywords, as for :func:`infill`.

    Returns:
        ``Path(out)``: the finished CF store (``v``, ``v_std``, ``v_flag`` per variable, the
        input's layout, ``Conventions = "CF-1.11"`` and provenance).

    Raises:
        ValueError: one line naming the problem, before anything is written.
    """
    if scheduler is not None and workers is not None:
        raise ValueError("--scheduler and --workers: give one (an existing cluster, or a local one to start)")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    out = Path(out)
    say = _stderr if progress else None
    p = plan(ds, variables, model, source=source, **options)
    for note in p.notes:  # shown even with --quiet: the user should know why nothing was filled
        _stderr(f"geonp: note: {note}")
    template = output_template(xr.Dataset(p.cubes), p.names)
    store = InfillStore(out, template, _request(p, source), provenance(p, source), overwrite, zarr_format)
    if store.resumed and say:
        say(f"resuming {out}: {int(store.done().sum())} of {store.done().size} blocks already written")
    _finetune(p, out, say)
    _calibrate(p, say)
    todo = [(i, region) for (i, region), done in zip(store.blocks(), store.done()) if not done]
    if workers is not None:
        _on_local_cluster(p, store, todo, workers, say)
    else:
        (_distributed if scheduler else _sequential)(p, store, todo, scheduler, say)
    layout = ds if like is None else like
    # Summed over every block in the store, those of an earlier run included; the store is then
    # rewritten in the input's layout, without the resume bookkeeping.
    totals = store.finish(attrs={"geonp_sigma_scales": p.sigma_scales} if p.sigma_scales else None,
                          restore=lambda work: restore_layout(work, layout, renamed_from(ds)))
    message = f"gap cells filled with the global mean (no observation in reach): {_without_context_text(totals)}"
    if say:
        say(f"wrote {out}; {message}")
    elif any(totals.values()):  # shown even with --quiet, like the notes
        _stderr(f"geonp: note: {message}")
    return out


def _block_values(p: Plan, variables: list[str] | tuple[str, ...],
                  region: dict[str, slice]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """One block's output layers of ``variables`` (each ``[*extra, time, rows, cols]`` over
    ``region``), and its gap cells filled without context per variable.

    A block spans one index of each extra dim (they are chunked one by one, see ``canonical``):
    the field at that index is filled over the block's time, rows and cols.
    """
    values, without = {}, {}
    for name in variables:
        dims = p.cubes[name].dims
        index = {d: region[d].start for d in dims[:-3]}
        r = p.fill(p.field(name, index), tuple(region[d] for d in dims[-3:]))
        lead = (1,) * len(index)
        values.update({name: r.value.reshape(lead + r.value.shape), f"{name}_std": r.std.reshape(lead + r.std.shape),
                       f"{name}_flag": r.flag.reshape(lead + r.flag.shape)})
        without[name] = r.without_context
    return values, without


def _sequential(p: Plan, store: InfillStore, todo: list, scheduler: str | None, say) -> None:
    from tqdm import tqdm

    for index, region in tqdm(todo, desc="infill blocks", unit="block", disable=say is None, file=sys.stderr):
        store.write_block(index, region, *_block_values(p, store.filled_in(index), region))


def _on_local_cluster(p: Plan, store: InfillStore, todo: list, workers: int, say) -> None:
    """Start a LocalCluster of ``workers`` processes, torch's threads shared out among them."""
    import os

    try:
        from dask.distributed import LocalCluster
    except ImportError:
        raise ValueError("--workers needs dask.distributed: pip install distributed") from None
    threads = max(1, (os.cpu_count() or 1) // workers)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      env={"OMP_NUM_THREADS": str(threads)}) as cluster:
        if say:
            say(f"local dask cluster: {workers} worker processes, {threads} torch thread(s) each")
        _distributed(p, store, todo, cluster.scheduler_address, say)


def _distributed(p: Plan, store: InfillStore, todo: list, scheduler: str | None, say) -> None:
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise ValueError("--scheduler needs dask.distributed: pip install distributed") from None
    with Client(scheduler) as client:
        plan_future = client.scatter(p, broadcast=True)
        futures = [client.submit(_fill_and_write, plan_future, store, i, r, pure=False) for i, r in todo]
        for n, fut in enumerate(as_completed(futures), 1):
            fut.result()
            if say and n % max(1, len(futures) // 10) == 0:
                say(f"{n}/{len(futures)} blocks")


def _fill_and_write(p: Plan, store: InfillStore, index: int, region: dict[str, slice]) -> None:
    store.write_block(index, region, *_block_values(p, store.filled_in(index), region))


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)




def infill_file(input: str, out: str | Path, variables: list[str] | None = None, model: str = "te-pt-tnp", *,
                satellite: bool = False, **options: Any) -> Path:
    """``geonp infill INPUT -o OUT``: open a file and fill it into a Zarr store.

    Args:
        input: the cube (NetCDF, GRIB, Zarr, GeoTIFF; a path or URL).
        out: the output Zarr store (not the input, nor inside it).
        variables: the variables to fill; default every gridded field.
        model: a registry name, as for :func:`infill`.
        satellite: open ``input`` with ``open_satellite`` (QC flags to gaps, the product's valid
            area; exactly one variable) instead of ``open_cube``.
        options: :func:`infill_to_zarr`'s and :func:`plan`'s keywords.

    Returns:
        ``Path(out)``, the finished store, laid out like ``input``.

    Raises:
        ValueError: one line, before anything is read or written when the output is the input
            itself or inside it.
    """
    from geonp.data import open_cube, open_satellite
    from geonp.data.readers import open_input

    if Path(out).resolve() == Path(input).resolve():
        raise ValueError(f"-o {out}: the output would overwrite the input; choose another path")
    if Path(input).resolve() in Path(out).resolve().parents:
        raise ValueError(f"-o {out}: the output would be written inside the input {input}; choose a path outside it")
    if satellite:
        if not variables or len(variables) != 1:
            raise ValueError("--satellite: name exactly one --var (the product variable to screen and fill)")
        valid_mask = options.pop("valid_mask", None)
        ds = open_satellite(input, variables[0], valid_mask=valid_mask)
    else:
        ds = open_cube(input)
    return infill_to_zarr(ds, out, variables, model, source=str(input), like=open_input(input), **options)
