"""``geonp infill``: fill every gap of a cube, block by block, into a dataset or a CF Zarr store.

Two entry points share one pipeline (prepare the fields, choose the model, optionally fine-tune
it on the cube's own observations, fill each block):

* :func:`infill` returns an in-memory ``xarray.Dataset`` (``geonp.infill(ds, model=...)``);
* :func:`infill_to_zarr` writes a resumable Zarr store and never holds more than a block.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from geonp.data.cube import renamed_from
from geonp.fill.layout import restore_layout
from geonp.fill.output import WITHOUT_CONTEXT, InfillStore, block_list, output_template
from geonp.fill.plan import Plan, plan, provenance, request
from geonp.fill.prepare import prepare
from geonp.fill.runners import block_values, distributed, on_local_cluster, sequential
from geonp.fill.samples import with_samples


def _without_context_text(totals: dict[str, int]) -> str:
    return ", ".join(f"{v} {n}" for v, n in totals.items())

def infill(ds: xr.Dataset, variables: str | list[str] | None = None, model: str = "te-pt-tnp", *,
           progress: bool = False, like: xr.Dataset | None = None, **keywords: Any) -> xr.Dataset:
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
        keywords: :func:`plan`'s: what comes with the input, ``checkpoint`` (weights instead of
            the bundled ones), ``valid_mask`` (see :func:`geonp.data.valid.valid_area`) and
            ``elevation`` (a DEM, for models trained with it); then how to fill, either
            ``options`` (a :class:`~geonp.fill.options.FillOptions`) or its keywords: ``fit_steps``
            (fine-tuning steps on ``ds``'s own observed cells first; default 30, as on the command
            line), ``window`` (cells each window predicts, ``(T, R, C)``), ``device``,
            ``batch_size`` (windows per model call), ``seed``, ``nugget``, ``calibrate_sigma``,
            ``threads``, ``samples`` (coherent samples to add, :mod:`geonp.fill.samples`).

    Returns:
        A Dataset with, per variable ``v``: ``v`` (observed or predicted, ``v``'s units),
        ``v_std`` (1-sigma predictive standard deviation, same units; 0 at observed cells, NaN
        outside the valid area) and ``v_flag`` (0 observed, 1 infilled, 2 outside the valid
        area), with CF attributes and provenance; with ``samples=N``, ``v_sample`` too
        (``[sample, *v.dims]``: observed cells as observed, filled cells coherent draws). The global attribute
        ``geonp_gaps_without_context_<v>`` counts the gap cells of ``v`` that had no observation
        in reach on their window's time steps and got ``v``'s global mean and spread (a warning
        says so when there are any).

    Raises:
        ValueError: one line naming the problem: an unknown variable or model, a checkpoint for
            another model, a window larger than the cube, bad option values.
    """
    say = _stderr if progress else None
    p = plan(ds, variables, model, **keywords)
    for note in p.notes:
        warnings.warn(note, stacklevel=2)
    prepare(p, None, say)
    source = keywords.get("source", "in-memory dataset")
    return fill_in_memory(p, ds if like is None else like, renamed_from(ds), source)


def fill_in_memory(p: Plan, layout: xr.Dataset, renamed: dict, source: str) -> xr.Dataset:
    """Every block of a prepared plan ``p``, in memory, as :func:`infill` returns it (``layout``: the
    dataset whose dimensions and attributes the result takes; ``renamed``: its
    :func:`~geonp.data.cube.renamed_from`)."""
    template = output_template(xr.Dataset(p.cubes), p.names)
    arrays = {v: np.empty(template[v].shape, template[v].dtype) for v in template.data_vars}
    totals = dict.fromkeys(p.names, 0)
    for variables, region in block_list(template):
        values, without = block_values(p, variables, region)
        for name, array in values.items():
            arrays[name][tuple(region[d] for d in template[name].dims)] = array
        for name, n in without.items():
            totals[name] += n
    result = xr.Dataset({v: (template[v].dims, arrays[v], template[v].attrs) for v in template.data_vars},
                        coords=template.coords)
    result.attrs = provenance(p, source)
    result.attrs.update({f"{WITHOUT_CONTEXT}_{v}": n for v, n in totals.items()})
    if p.options.samples:
        result = with_samples(result, p.names, p.options.samples, p.options.seed).compute()
    result = restore_layout(result, layout, renamed)
    if any(totals.values()):
        warnings.warn(f"gap cells without any observation in reach, filled with the global mean: "
                      f"{_without_context_text(totals)}", stacklevel=3)
    return result

def infill_to_zarr(ds: xr.Dataset, out: str | Path, variables: str | list[str] | None = None,
                   model: str = "te-pt-tnp", *, source: str = "the input", overwrite: bool = False,
                   zarr_format: int = 3, scheduler: str | None = None, workers: int | None = None,
                   progress: bool = True, like: xr.Dataset | None = None, **keywords: Any) -> Path:
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
        keywords: :func:`plan`'s, as for :func:`infill`.

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
    p = plan(ds, variables, model, source=source, **keywords)
    for note in p.notes:  # shown even with --quiet: the user should know why nothing was filled
        _stderr(f"geonp: note: {note}")
    template = output_template(xr.Dataset(p.cubes), p.names)
    store = InfillStore(out, template, request(p, source), provenance(p, source), overwrite, zarr_format)
    if store.resumed and say:
        say(f"resuming {out}: {int(store.done().sum())} of {store.done().size} blocks already written")
    prepare(p, out, say)
    todo = [(i, region) for (i, region), done in zip(store.blocks(), store.done()) if not done]
    if workers is not None:
        on_local_cluster(p, store, todo, workers, say)
    else:
        (distributed if scheduler else sequential)(p, store, todo, scheduler, say)
    layout = ds if like is None else like
    # Summed over every block in the store, those of an earlier run included; the store is then
    # rewritten in the input's layout, without the resume bookkeeping.
    chosen = {"geonp_sigma_scales": p.sigma_scales, "geonp_nugget": p.nugget_chosen}
    def restore(work: xr.Dataset) -> xr.Dataset:  # samples drawn scene by scene as the store is written
        if p.options.samples:
            work = with_samples(work, p.names, p.options.samples, p.options.seed)
        return restore_layout(work, layout, renamed_from(ds))

    totals = store.finish(attrs={k: v for k, v in chosen.items() if v is not None} or None, restore=restore)
    message = f"gap cells filled with the global mean (no observation in reach): {_without_context_text(totals)}"
    if say:
        say(f"wrote {out}; {message}")
    elif any(totals.values()):  # shown even with --quiet, like the notes
        _stderr(f"geonp: note: {message}")
    return out

def _stderr(message: str) -> None:
    print(message, file=sys.stderr)

def infill_file(input: str, out: str | Path, variables: list[str] | None = None, model: str = "te-pt-tnp", *,
                satellite: bool = False, **keywords: Any) -> Path:
    """``geonp infill INPUT -o OUT``: open a file and fill it into a Zarr store.

    Args:
        input: the cube (NetCDF, GRIB, Zarr, GeoTIFF; a path or URL).
        out: the output Zarr store (not the input, nor inside it).
        variables: the variables to fill; default every gridded field.
        model: a registry name, as for :func:`infill`.
        satellite: open ``input`` with ``open_satellite`` (QC flags to gaps, the product's valid
            area; exactly one variable) instead of ``open_cube``.
        keywords: :func:`infill_to_zarr`'s and :func:`plan`'s.

    Returns:
        ``Path(out)``, the finished store, laid out like ``input``.

    Raises:
        ValueError: one line, before anything is read or written when the output is the input
            itself, inside it or around it, or not a Zarr store's name
            (:func:`geonp.output_paths.check_store_path`).
    """
    from geonp.data import open_cube, open_satellite
    from geonp.data.readers import open_input
    from geonp.output_paths import check_store_path

    check_store_path(out, input)
    if satellite:
        if not variables or len(variables) != 1:
            raise ValueError("--satellite: name exactly one --var (the product variable to screen and fill)")
        valid_mask = keywords.pop("valid_mask", None)
        ds = open_satellite(input, variables[0], valid_mask=valid_mask)
    else:
        ds = open_cube(input)
    return infill_to_zarr(ds, out, variables, model, source=str(input), like=open_input(input), **keywords)
