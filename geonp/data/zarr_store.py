"""A growing, resumable Zarr store on a local path: create, append along ``time``, truncate, record state.

Used by the fetchers (``geonp fetch era5``): each downloaded piece is appended only once it is
complete, and what has been committed is recorded in the group's attributes *after* the data,
so a process killed between the two leaves a store whose tail the next run can cut off again
(:func:`truncate_time`). Metadata is consolidated after every change, so ``xarray.open_zarr``
sees one consistent view.

Chunking (:func:`chunk_sizes`): one day of time steps per chunk along ``time`` (24 steps for
hourly data), so every day, month and resumed piece starts on a chunk boundary and an append
never rewrites a chunk an earlier append wrote; square spatial tiles, a power of two between
128 and 2048 points a side (the full axis when smaller), sized so one chunk holds at most about
2**21 values (8 MiB of float32) before compression.
"""

from __future__ import annotations

import math
import shutil
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

_CHUNK_VALUES = 2**21
# Encode time as whole hours since ERA5's first date: exact for hourly data, the same for every
# append (xarray would otherwise choose units from the first piece it writes).
TIME_ENCODING = {"units": "hours since 1940-01-01 00:00:00", "calendar": "proleptic_gregorian", "dtype": "int64"}


@dataclass
class StoreState:
    """What a store on disk holds, read without the consolidated metadata (which may lag)."""

    attrs: dict[str, Any]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dims: dict[str, tuple[str, ...]] = field(default_factory=dict)
    lat: np.ndarray | None = None
    lon: np.ndarray | None = None

    @property
    def ntime(self) -> int:
        """Length of the ``time`` axis (0 when the store has none yet)."""
        return self.shapes.get("time", (0,))[0]

    @property
    def time_variables(self) -> list[str]:
        """Data variables on ``(time, ...)``, the time coordinate itself excluded."""
        return sorted(v for v, d in self.dims.items() if d[:1] == ("time",) and v != "time")


def is_zarr(path: Path) -> bool:
    """True when ``path`` is a directory holding Zarr v2 or v3 group metadata."""
    return path.is_dir() and ((path / "zarr.json").is_file() or (path / ".zgroup").is_file())


def array_dims(arr: zarr.Array) -> tuple[str, ...]:
    """A Zarr array's dimension names (v3 metadata, or xarray's v2 attribute)."""
    names = getattr(arr.metadata, "dimension_names", None)  # Zarr v3
    if names is None:
        names = arr.attrs.get("_ARRAY_DIMENSIONS", ())  # Zarr v2 as xarray writes it
    return tuple(str(n) for n in names)


def read_state(path: Path) -> StoreState | None:
    """The state of the store at ``path``; None when nothing is there.

    Raises:
        ValueError: ``path`` exists but is not a Zarr store.
    """
    if not path.exists():
        return None
    if not is_zarr(path):
        raise ValueError(f"{path} exists and is not a Zarr store; choose another output path")
    group = zarr.open_group(str(path), mode="r", use_consolidated=False)
    state = StoreState(attrs=dict(group.attrs))
    with quiet_zarr():  # an unfinished fill's saved choices sit beside its arrays
        arrays = list(group.arrays())
    for name, arr in arrays:
        state.shapes[name], state.dims[name] = tuple(arr.shape), array_dims(arr)
    state.lat = np.asarray(group["lat"][:]) if "lat" in state.shapes else None
    state.lon = np.asarray(group["lon"][:]) if "lon" in state.shapes else None
    return state


def read_times(path: Path, start: int, stop: int) -> np.ndarray:
    """Decoded ``time`` values ``[start, stop)`` of the store, as ``datetime64[ns]``."""
    arr = zarr.open_group(str(path), mode="r", use_consolidated=False)["time"]
    raw = np.asarray(arr[start:stop])
    units, cal = arr.attrs.get("units", TIME_ENCODING["units"]), arr.attrs.get("calendar", "proleptic_gregorian")
    return np.asarray(xr.coding.times.decode_cf_datetime(raw, units, cal)).astype("datetime64[ns]")


def chunk_sizes(steps_per_day: int, nlat: int, nlon: int) -> dict[str, int]:
    """Chunk sizes for ``(time, lat, lon)`` variables (see the module docstring)."""
    side = 2 ** int(math.floor(math.log2(math.sqrt(_CHUNK_VALUES / max(1, steps_per_day)))))
    side = min(max(side, 128), 2048)
    return {"time": steps_per_day, "lat": min(nlat, side), "lon": min(nlon, side)}


@contextmanager
def quiet_zarr() -> Iterator[None]:
    # Zarr 3 warns on every consolidation of a v3 store that consolidated metadata is not yet
    # in the v3 spec; we choose it deliberately (xarray opens a store with one read).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        # geonp keeps a run's fine-tuned weights and nugget choice in its unfinished store (to
        # resume); Zarr 3 warns that the files are not part of the hierarchy whenever it is opened.
        warnings.filterwarnings("ignore", message=".*geonp_(fitted_model|nugget|history_used).*not recognized",
                                category=UserWarning)
        yield


def write(path: Path, ds: xr.Dataset, attrs: Mapping[str, Any], steps_per_day: int, zarr_format: int = 3) -> None:
    """Write ``ds`` (on ``time``/``lat``/``lon``) into the store: create it, append along ``time``, or add variables.

    ``attrs`` become the group's attributes (xarray replaces them on every write, so callers pass
    the full set). Variables are chunked with :func:`chunk_sizes`; an existing store's ``lat``/``lon``
    must equal those of ``ds`` (to 1e-6 degrees) and are not rewritten.

    Raises:
        ValueError: the grid of ``ds`` differs from the store's.
    """
    state = read_state(path)
    chunks = chunk_sizes(steps_per_day, ds.sizes["lat"], ds.sizes["lon"])
    ds = ds.chunk({d: n for d, n in chunks.items() if d in ds.dims})
    ds.attrs = dict(attrs)
    existing: set[str] = set()
    if state is not None and state.lat is not None:
        for axis, stored in (("lat", state.lat), ("lon", state.lon)):
            if ds[axis].shape != stored.shape or not np.allclose(ds[axis].values, stored, atol=1e-6):
                raise ValueError(f"{path}: the new data's {axis} grid differs from the store's")
        ds, existing = ds.drop_vars(["lat", "lon"]), set(state.shapes)
    enc: dict[str, dict] = {v: {"dtype": "float32", "chunks": tuple(chunks[d] for d in ds[v].dims)}
                            for v in ds.data_vars if v not in existing}
    if "time" in ds.variables and "time" not in existing:
        enc["time"] = dict(TIME_ENCODING)
    with quiet_zarr():
        if state is None:
            ds.to_zarr(str(path), mode="w-", encoding=enc, consolidated=True, zarr_format=zarr_format)
        elif "time" in ds.dims and "time" in existing:
            ds.to_zarr(str(path), append_dim="time", encoding=enc, consolidated=True)
        else:
            ds.to_zarr(str(path), mode="a", encoding=enc, consolidated=True)


def update_attrs(path: Path, attrs: Mapping[str, Any]) -> None:
    """Merge ``attrs`` into the group's attributes and reconsolidate."""
    group = zarr.open_group(str(path), mode="r+", use_consolidated=False)
    group.attrs.update(dict(attrs))
    with quiet_zarr():
        zarr.consolidate_metadata(str(path))


def truncate_time(path: Path, ntime: int) -> None:
    """Cut every array on ``(time, ...)`` to its first ``ntime`` steps (chunks beyond are deleted)."""
    group = zarr.open_group(str(path), mode="r+", use_consolidated=False)
    for _, arr in group.arrays():
        if array_dims(arr)[:1] == ("time",) and arr.shape[0] > ntime:
            arr.resize((ntime, *arr.shape[1:]))
    with quiet_zarr():
        zarr.consolidate_metadata(str(path))


def remove(path: Path) -> None:
    """Delete the Zarr store at ``path``; refuses anything that is not one (a typo must not cost a folder)."""
    if not is_zarr(path):
        raise ValueError(f"{path} exists and is not a Zarr store; refusing to replace it")
    shutil.rmtree(path)
