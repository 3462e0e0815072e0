"""The infill output: a CF-conventions Zarr cube written block by block, resumable, never
mistaken for complete before it is.

For each filled variable ``v`` the store holds ``v`` (observed where present, the predictive
mean elsewhere), ``v_std`` (1-sigma predictive standard deviation, same units, CF
``standard_name = "<v's standard_name> standard_error"``) and ``v_flag`` (CF status flag:
0 observed, 1 infilled, 2 outside the valid area), linked by ``ancillary_variables``.

Blocks follow the input's chunks. The store is created up front (metadata only, with
``geonp_status = "incomplete"``) together with a small ``geonp_blocks_done`` array holding one
byte per block in its own chunk, so writers of different blocks never touch the same object.
Beside it ``geonp_gaps_without_context`` holds, per block and filled variable, how many gap cells
had no observation in reach and got the variable's global mean, so that a resumed run reports the
whole store's total. A block's data and count are written first and its byte last: a process
killed in between redoes that block on the next run, which writes the same values again.
``finish`` totals the counts into global attributes ``geonp_gaps_without_context_<v>``, rewrites
the store in the input's layout (:mod:`geonp.fill.layout`) without the bookkeeping arrays, with
``geonp_status = "complete"``, into a sibling ``<out>.geonp-final`` and swaps it in by two renames
(``<out>`` -> ``<out>.geonp-work``, final -> ``<out>``); a run killed between them finds the work
store under its temporary name and puts it back.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import dask.array as dsa
import numpy as np
import xarray as xr
import zarr

from geonp.data import zarr_store
from geonp.fill.finished import FINAL, STATUS, WORK, finished_message, is_finished

FLAG_OBSERVED, FLAG_INFILLED, FLAG_OUTSIDE = 0, 1, 2
#: The dimension of ``VAR_sample`` (``--samples``, :mod:`geonp.fill.samples`), first of its dims.
SAMPLE_DIM = "sample"
FLAG_FILL = -1  # int8 fill value of a flag not yet written
PROGRESS = "geonp_blocks_done"
WITHOUT_CONTEXT = "geonp_gaps_without_context"
#: The layers written for each filled variable ``v``: ``v``, ``v_std``, ``v_flag``.
LAYER_SUFFIXES = ("", "_std", "_flag")
#: Version of the bookkeeping layout (one flat list of blocks over every variable's chunks).
STORE_LAYOUT = 2


#: Encoding an input coordinate keeps in the output: how it is stored (time units and calendar,
#: dtype). Everything else (fill and missing values, compression, chunk sizes) describes the input
#: file and may contradict what xarray writes.
COORD_ENCODING = ("units", "calendar", "dtype")


def coordinate_encoding(var: xr.Variable | xr.DataArray) -> dict[str, Any]:
    """The part of a coordinate's encoding the output keeps (see :data:`COORD_ENCODING`).

    A float coordinate stored as integers (packed, or with missing values such as a CMIP
    auxiliary axis of NaN stored as int16) keeps its packing too: ``scale_factor``,
    ``add_offset`` and ``_FillValue``, without which the integers would not hold its values.
    """
    keep = {k: v for k, v in var.encoding.items() if k in COORD_ENCODING}
    stored = keep.get("dtype")
    if stored is not None and np.issubdtype(np.dtype(stored), np.integer) and np.issubdtype(var.dtype, np.floating):
        keep.update({k: var.encoding[k] for k in ("scale_factor", "add_offset", "_FillValue") if k in var.encoding})
    return keep


def chunk_regions(chunks: tuple[tuple[int, ...], ...]) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """``(block index, slices)`` for every block of an array chunked as ``chunks`` (dask style), in order."""
    bounds = [np.concatenate([[0], np.cumsum(c)]) for c in chunks]
    for index in itertools.product(*(range(len(c)) for c in chunks)):
        yield index, tuple(slice(int(b[i]), int(b[i + 1])) for b, i in zip(bounds, index))


def block_list(template: xr.Dataset) -> list[tuple[tuple[str, ...], dict[str, slice]]]:
    """The blocks of an output: ``(filled variables, {dim: slice})``, one per chunk.

    Filled variables with the same dimensions and chunks (those of one input shape) share their
    blocks; a variable with other dimensions (an extra ``level``, no time axis) has blocks of its
    own. Groups come in the order of their first variable, blocks in C order within a group.
    """
    groups: dict[tuple, list[str]] = {}
    for v in template.data_vars:
        if f"{v}_flag" in template.data_vars:
            da = template[v]
            groups.setdefault((da.dims, da.chunks), []).append(str(v))
    blocks = []
    for (dims, chunks), names in groups.items():
        for _, key in chunk_regions(chunks):
            blocks.append((tuple(names), dict(zip(dims, key))))
    return blocks


def block_sizes(template: xr.Dataset) -> dict[str, list[list[list[int]]]]:
    """What fixes :func:`block_list`: each filled variable's chunks along each of its dimensions,
    run-length coded (``[[size, count], ...]``: ``[[1, 744]]`` for 744 one-step chunks)."""
    return {str(v): [[[int(size), len(list(run))] for size, run in itertools.groupby(c)] for c in template[v].chunks]
            for v in template.data_vars if f"{v}_flag" in template.data_vars}


def output_template(cube: xr.Dataset, variables: list[str]) -> xr.Dataset:
    """A lazy Dataset with the output's variables, attributes and chunks (no data computed).

    ``cube`` is the input in ``open_cube``'s convention; each variable in ``variables`` must be
    chunked (dask), and its chunks become the output's blocks.
    """
    # Coordinates are small (1-D axes, 2-D lat/lon, elevation): computed now, so that creating the
    # store writes them.
    out = xr.Dataset(coords={k: c.compute() for k, c in cube.coords.items()})
    for c in out.coords.values():
        c.encoding = coordinate_encoding(c)
    for v in variables:
        da = cube[v]
        chunks = da.chunks if da.chunks is not None else tuple((n,) for n in da.shape)
        attrs = {k: a for k, a in da.attrs.items() if k not in ("ancillary_variables", "_FillValue")}
        standard = attrs.get("standard_name")
        long_name = attrs.get("long_name", v)
        # Observed cells are copied as they are: a float64 field stays float64, others become float32.
        dtype = np.float64 if da.dtype == np.float64 else np.float32
        out[v] = (da.dims, dsa.full(da.shape, np.nan, chunks=chunks, dtype=dtype),
                  {**attrs, "ancillary_variables": f"{v}_std {v}_flag"})
        std_attrs = {"long_name": f"1-sigma predictive standard deviation of {long_name}"}
        if "units" in attrs:
            std_attrs["units"] = attrs["units"]
        if standard:
            std_attrs["standard_name"] = f"{standard} standard_error"
        out[f"{v}_std"] = (da.dims, dsa.full(da.shape, np.nan, chunks=chunks, dtype=np.float32), std_attrs)
        flag_attrs = {"long_name": f"status of {long_name}", "flag_values": np.array([0, 1, 2], np.int8),
                      "flag_meanings": "observed infilled outside_valid_area"}
        if standard:
            flag_attrs["standard_name"] = f"{standard} status_flag"
        out[f"{v}_flag"] = (da.dims, dsa.full(da.shape, FLAG_FILL, chunks=chunks, dtype=np.int8), flag_attrs)
    return out


class InfillStore:
    """A resumable output store at ``path`` for ``template`` (see ``output_template``).

    Args:
        path: the output Zarr path.
        template: the lazy output Dataset.
        request: what makes two runs the same job (input, variables, model, checkpoint hash,
            settings); a store left incomplete by the same request over the same blocks (added
            here, :func:`block_sizes`) is resumed.
        attrs: global attributes (CF ``Conventions``, provenance) written now.
        overwrite: replace an existing store; otherwise one that is complete, or incomplete
            from another request with a block written, is refused (one of another request with
            none written is replaced: nothing of it fits this request).
        zarr_format: 3 (default) or 2.

    Raises:
        FileExistsError: the store exists and cannot be resumed, and ``overwrite`` is false.
        ValueError: ``path`` exists and is not a Zarr store.
    """

    def __init__(self, path: str | Path, template: xr.Dataset, request: Mapping[str, Any],
                 attrs: Mapping[str, Any] | None = None, overwrite: bool = False, zarr_format: int = 3) -> None:
        self.path = Path(path)
        self.variables = list(template.data_vars)
        self.filled = [v for v in self.variables if f"{v}_flag" in self.variables]
        self._blocks = block_list(template)
        # The bookkeeping layout and the blocks themselves are part of what makes a store
        # resumable: its progress bytes count blocks, so one cut into other blocks (the same input
        # chunked otherwise) is not resumed.
        self.request = json.dumps({**dict(request), "store_layout": STORE_LAYOUT, "blocks": block_sizes(template)},
                                  sort_keys=True, default=str)
        self.resumed = False
        self.zarr_format = zarr_format
        work = self._sibling(WORK)
        if work.exists():  # a swap in finish was cut short
            if self.path.exists():  # after the second rename: the finished store is in place
                zarr_store.remove(work)
            else:  # between the renames: the work store is the one to resume
                os.replace(work, self.path)
        if self.path.exists():
            state = None if overwrite else zarr_store.read_state(self.path)  # read once, for both tests
            if state is None or self._unstarted_other_run(state):
                zarr_store.remove(self.path)
            else:
                self._check_resumable(state)
                self.resumed = True
                self.zarr_format = zarr.open_group(str(self.path), mode="r").metadata.zarr_format
                return
        ds = template.copy()
        ds.attrs = {**dict(attrs or {}), STATUS: "incomplete", "geonp_request": self.request}
        n = len(self._blocks)
        ds[PROGRESS] = (("block",), dsa.zeros(n, dtype=np.uint8, chunks=1))
        ds[WITHOUT_CONTEXT] = (("block", "filled_variable"),
                               dsa.zeros((n, len(self.filled)), dtype=np.int64, chunks=(1, max(len(self.filled), 1))),
                               {"long_name": "gap cells filled with the variable's global mean (no context in reach)",
                                "filled_variable": " ".join(self.filled)})
        # Floats get NaN as fill value. Flags and progress bytes get none: a _FillValue would make
        # xarray decode them to floats; unwritten chunks read as zarr's default 0 in an incomplete
        # store, which its geonp_status already marks as not to be trusted.
        encoding = {v: {"_FillValue": _float_fill(ds[v].dtype)}
                    for v in ds.data_vars}
        with zarr_store.quiet_zarr():
            # Metadata and coordinates only: unwritten chunks read as the fill values (NaN, -1, and
            # 0 = "not done" for the progress bytes).
            ds.to_zarr(str(self.path), mode="w-", compute=False, consolidated=True, zarr_format=zarr_format,
                       encoding=encoding)

    def _sibling(self, suffix: str) -> Path:
        return self.path.with_name(self.path.name + suffix)

    def _unstarted_other_run(self, state: zarr_store.StoreState) -> bool:
        """An unfinished store of another request with no block written: what a refused or stopped
        run left before filling (its preparation fits that request only), replaced by this run
        rather than refused, so a corrected command runs without ``--overwrite``."""
        if state.attrs.get(STATUS) != "incomplete" or state.attrs.get("geonp_request") == self.request \
                or PROGRESS not in state.shapes:
            return False
        return not self.done().any()

    def _check_resumable(self, state: zarr_store.StoreState) -> None:
        status = state.attrs.get(STATUS)
        if status == "complete":
            raise FileExistsError(finished_message(self.path))
        if status != "incomplete" or state.attrs.get("geonp_request") != self.request:
            raise FileExistsError(f"{self.path} already exists and is not an unfinished run of this same command "
                                  "(or of this input chunked otherwise); pass --overwrite to replace it")

    def blocks(self) -> Iterator[tuple[int, dict[str, slice]]]:
        """``(block index, {dim: slice})`` for every block, in order (see :func:`block_list`)."""
        for index, (_, region) in enumerate(self._blocks):
            yield index, dict(region)

    def filled_in(self, index: int) -> list[str]:
        """The filled variables block ``index`` holds (its layers are each one's ``v``, ``v_std``, ``v_flag``)."""
        return list(self._blocks[index][0])

    def done(self) -> np.ndarray:
        """One bool per block, True where the block is written."""
        group = zarr.open_group(str(self.path), mode="r", use_consolidated=False)
        return np.asarray(group[PROGRESS][...]).astype(bool)

    def write_block(self, index: int, region: Mapping[str, slice],
                    values: Mapping[str, np.ndarray], without_context: Mapping[str, int] | None = None) -> None:
        """Write the output layers of one block and its gap cells without context per filled
        variable (0 where not given), then mark the block done."""
        group = zarr.open_group(str(self.path), mode="r+", use_consolidated=False)
        layers = [f"{v}{suffix}" for v in self.filled_in(index) for suffix in LAYER_SUFFIXES]
        if set(values) != set(layers):
            raise ValueError(f"block values must hold {sorted(layers)}, got {sorted(values)}")
        for name, array in values.items():
            key = tuple(region[d] for d in zarr_store.array_dims(group[name]))
            group[name][key] = np.asarray(array, dtype=group[name].dtype)
        if self.filled:
            counts = dict(without_context or {})
            group[WITHOUT_CONTEXT][index] = np.array([counts.get(v, 0) for v in self.filled], np.int64)
        group[PROGRESS][index] = 1

    def without_context(self) -> dict[str, int]:
        """Gap cells filled without context so far, per filled variable, over the written blocks."""
        group = zarr.open_group(str(self.path), mode="r", use_consolidated=False)
        if not self.filled:
            return {}
        counts = np.asarray(group[WITHOUT_CONTEXT][...])
        done = np.asarray(group[PROGRESS][...]).astype(bool)
        return {v: int(n) for v, n in zip(self.filled, counts[done].sum(0))}

    def finish(self, attrs: Mapping[str, Any] | None = None,
               restore: Callable[[xr.Dataset], xr.Dataset] | None = None) -> dict[str, int]:
        """Write the finished store (refuses while a block is missing): the layers as ``restore``
        lays them out (default: as written), ``attrs`` and the counts, status ``complete``.

        Returns the gap cells filled without context per variable, also written as global
        attributes ``geonp_gaps_without_context_<v>``.
        """
        missing = int((~self.done()).sum())
        if missing:
            raise RuntimeError(f"{self.path}: {missing} blocks are not written; the store stays incomplete")
        totals = self.without_context()
        counts = {f"{WITHOUT_CONTEXT}_{v}": n for v, n in totals.items()}
        with zarr_store.quiet_zarr():
            work = xr.open_zarr(str(self.path), consolidated=False).drop_vars([PROGRESS, WITHOUT_CONTEXT])
        done = restore(work) if restore is not None else work
        done.attrs = {**done.attrs, **dict(attrs or {}), **counts, STATUS: "complete"}
        final = self._sibling(FINAL)
        if final.exists():  # left by a run killed while writing it
            zarr_store.remove(final)
        with zarr_store.quiet_zarr():
            _stored(done).to_zarr(str(final), mode="w-", consolidated=True, zarr_format=self.zarr_format)
        os.replace(self.path, self._sibling(WORK))
        os.replace(final, self.path)
        zarr_store.remove(self._sibling(WORK))
        return totals


def _stored(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` ready for ``to_zarr``: one chunk size per dimension (a reversed or reordered axis
    leaves uneven chunks) and only the encoding that says how values are stored."""
    ds = ds.copy()
    # Per variable, not ds.chunks: an input's coordinates may be chunked unlike its data (xarray's
    # to_zarr lets Zarr choose each array's chunks), which ds.chunks refuses as inconsistent.
    sizes: dict = {}
    for var in ds.variables.values():
        for dim, chunks in zip(var.dims, var.chunks or ()):
            sizes[dim] = max(sizes.get(dim, 0), max(chunks))
    for name, var in ds.variables.items():
        keep = coordinate_encoding(var)
        if name in ds.data_vars:
            keep.setdefault("_FillValue", _float_fill(var.dtype))
        var.encoding = keep
    ds = ds.chunk({d: sizes.get(d, -1) for d in ds.dims}) if sizes else ds
    for name, var in ds.data_vars.items():  # samples: one sample of one scene a chunk, one read each
        if SAMPLE_DIM in var.dims:
            ds[name] = var.chunk({d: 1 if i < var.ndim - 2 else -1 for i, d in enumerate(var.dims)})
    return ds


def _float_fill(dtype: np.dtype) -> Any:
    """NaN of a float dtype as the fill value; None (no fill value) for integers, flags included."""
    return np.dtype(dtype).type(np.nan) if np.issubdtype(dtype, np.floating) else None


def is_complete(path: str | Path) -> bool:
    """True when ``path`` is an infill output whose run finished (False for anything else)."""
    return is_finished(path)
