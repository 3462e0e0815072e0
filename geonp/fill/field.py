"""The input side of infill: which variables, where data may exist, elevation, and summary stats.

A ``Field`` is one variable seen as a lazy ``[time, rows, cols]`` array (a single scene gets a
length-1 time axis) with its valid-area mask and the whole-variable statistics that windows
fall back on. Everything here reads the cube lazily; the one full pass (``summarise``) computes
the statistics of every variable in a single dask traversal.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field

import dask
import numpy as np
import xarray as xr

from geonp.data.cube import field_variables, horizontal_dims
from geonp.data.cube_checks import unreadable
from geonp.data.valid import MaskSpec, valid_area
from geonp.tasks.far_context import Pyramid, build_pyramid

#: Magnitude from which a value is taken for an undeclared fill value (1e20, 9.96e36, 1e30 ...):
#: far beyond any geophysical quantity in any unit geonp fills.
ABSURD = 1e20


@dataclass
class Field:
    """One field to fill: a variable, or one index of its extra dimensions (a pressure level, an
    ensemble member), which is filled independently of the others.

    ``data`` is the lazy ``[time, rows, cols]`` DataArray, ``valid`` a bool numpy array
    ``[rows, cols]`` or ``[time, rows, cols]`` (True where data may exist), ``index`` the
    ``{dim: position}`` of the field along the variable's extra dims (empty when it has none),
    ``mean`` and ``spread`` the field's mean and standard deviation over observed valid cells,
    ``gaps`` the number of missing cells inside the valid area (``infinite`` of them hold +-inf).
    """

    name: str
    data: xr.DataArray
    valid: np.ndarray
    index: dict[str, int] = dataclass_field(default_factory=dict)
    mean: float = 0.0
    spread: float = 1.0
    observed: int = 0
    gaps: int = 0
    infinite: int = 0  # cells holding +-inf, filled as gaps
    #: What the field's history predicts at every cell, ``[P, time, rows, cols]`` float32 in the
    #: field's units, one map per covariate the model takes (:func:`geonp.tasks.history.history_covariates`).
    history: np.ndarray | None = dataclass_field(default=None, repr=False, compare=False)
    #: The same covariates computed without some observed cells, for fine-tuning: a list of
    #: :class:`geonp.tasks.history.HistoryFold` (empty without a history).
    folds: list = dataclass_field(default_factory=list, repr=False, compare=False)
    #: The history covariates were replaced by flat maps (:mod:`geonp.fill.history_check`): no folds then.
    history_dropped: bool = dataclass_field(default=False, repr=False, compare=False)
    #: A stack method's fill (:mod:`geonp.fill.stack`): mean and 1-sigma, each ``[time, rows, cols]``.
    stack: tuple[np.ndarray, np.ndarray] | None = dataclass_field(default=None, repr=False, compare=False)
    _pyramids: dict[int | tuple[int, int], Pyramid] = dataclass_field(default_factory=dict, repr=False,
                                                                      compare=False)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.data.shape)  # type: ignore[return-value]

    @property
    def label(self) -> str:
        """The field in messages: ``t`` or ``t[level=2]`` (positions along the extra dims)."""
        where = ",".join(f"{d}={i}" for d, i in self.index.items())
        return f"{self.name}[{where}]" if where else self.name

    def pyramid(self, finest: int) -> Pyramid:
        """Block summaries of the observed cells for far context (:mod:`geonp.tasks.far_context`),
        from blocks of ``2**finest`` cells up; one pass over the cube on first use, then kept."""
        if finest not in self._pyramids:
            self._pyramids[finest] = build_pyramid(self.data, self.valid, finest)
        return self._pyramids[finest]

    def whole(self) -> np.ndarray:
        """The whole field in memory, ``[T, R, C]`` float64, +-inf as NaN (for whole-stack passes:
        history covariates, stack methods; a block never needs this)."""
        with dask.config.set(scheduler="synchronous"):
            values = np.asarray(self.data.values, np.float64)
        return np.where(np.isinf(values), np.nan, values)

    def history_pyramid(self, p: int, finest: int) -> Pyramid:
        """Block summaries of history covariate ``p`` over the *observed* cells (those of
        :meth:`pyramid`), so a far point's covariate is the mean over the same cells as its value
        (far points read only its means, at the blocks selected on the field's own pyramid)."""
        key = (-1 - p, finest)
        if key not in self._pyramids:
            cov = xr.DataArray(np.where(np.isfinite(self.whole()), self.history[p], np.nan), dims=self.data.dims)
            pyramid = build_pyramid(cov, self.valid, finest)
            # The same cells in every block, or the means would be over others: a covariate map must be
            # finite wherever the field is observed (history_covariates' maps are).
            if not np.array_equal(pyramid.count[0], self.pyramid(finest).count[0]):
                raise RuntimeError(f"{self.label}: history covariate {p} is not finite at every observed cell")
            self._pyramids[key] = pyramid
        return self._pyramids[key]

    def set_history(self, maps: np.ndarray) -> None:
        """Replace the history covariates (``[P, time, rows, cols]``), forgetting their block summaries."""
        self.history = maps
        self._pyramids = {key: pyr for key, pyr in self._pyramids.items() if not isinstance(key, tuple)}

    def valid_slab(self, key: tuple[slice, slice, slice]) -> np.ndarray:
        """The valid mask over ``key``, broadcast to ``[T, R, C]``."""
        sub = self.valid[key] if self.valid.ndim == 3 else self.valid[key[1:]][None]
        return np.broadcast_to(sub, tuple(s.stop - s.start for s in key))


def select_variables(ds: xr.Dataset, variables: str | list[str] | None, source: str,
                     mask: object = None) -> list[str]:
    """Resolve ``--var``: the named variables (checked) or every field of ``ds`` but the valid mask."""
    if isinstance(variables, str):
        variables = [variables]
    fields = [v for v in field_variables(ds) if v not in ("valid", mask)]
    if not variables:
        if not fields:
            raise ValueError(f"{source}: no gridded data variable to fill")
        return fields
    for v in variables:
        if v not in ds.data_vars:
            raise ValueError(f"--var {v}: no such variable in {source} (it has: {', '.join(fields) or 'none'})")
        if not set(horizontal_dims(ds)) <= set(ds[v].dims):
            raise ValueError(f"--var {v}: not on the horizontal grid of {source} (dims {ds[v].dims})")
        if ds[v].dtype == bool:
            raise ValueError(f"--var {v}: a boolean mask in {source}, not a field to fill "
                             f"(to say where data may exist, pass --valid-mask {v})")
    return list(variables)


def valid_cells(ds: xr.Dataset, valid_mask: MaskSpec | None, da: xr.DataArray, source: str) -> np.ndarray:
    """``--valid-mask``: True where data may exist, as ``[rows, cols]`` or ``[time, rows, cols]``.

    The rule is geonp's one (:func:`geonp.data.valid.valid_area`): a named mask (a variable, a
    file, a DataArray, ``observed`` or ``all``), else the input's ``valid`` variable, else the
    cells observed in some time step (every cell for a single step). ``da`` is the field as
    ``[time, rows, cols]`` (see ``canonical``).
    """
    mask, _ = valid_area(ds, da, valid_mask, source)
    dims = [d for d in da.dims if d in mask.dims]
    values = np.asarray(mask.transpose(*dims).values, bool)
    want = da.shape if "time" in dims else da.shape[1:]
    if values.shape != want:
        raise ValueError(f"--valid-mask: mask shape {values.shape} does not match {source} {want}")
    return values


def summarise(fields: list[Field], source: str) -> None:
    """Fill in each field's mean, spread, observed and gap counts in one pass over the cube.

    A field of a variable's extra dims with no observed value gets an empty valid area (it is
    left as it is); a variable none of whose fields has one is refused.
    """
    todo = []
    for f in fields:
        valid = xr.DataArray(f.valid, dims=f.data.dims[3 - f.valid.ndim:])
        observed = np.isfinite(f.data) & valid
        x = f.data.where(observed).astype(np.float64)
        todo.append((observed.sum(), x.sum(), (x**2).sum(), (~np.isfinite(f.data) & valid).sum(),
                     np.isinf(f.data).sum(), (abs(x) >= ABSURD).sum(), abs(x).max()))
    try:  # the first read of every chunk: a damaged one fails here, named, not as a codec's error
        (results,) = dask.compute(todo)
    except RuntimeError as err:  # a codec's (Zstd, Blosc, HDF5); a network failure stays an OSError
        names = ", ".join(dict.fromkeys(f.name for f in fields))
        raise ValueError(unreadable(f"{source}: reading {names} failed", err)) from err
    for f, (n, s, s2, gaps, infinite, absurd, largest) in zip(fields, results):
        n, s, s2 = int(n), float(s), float(s2)
        if absurd:
            # 1e20 and beyond is no geophysical value: a fill value the file does not declare.
            raise ValueError(f"--var {f.label}: {int(absurd)} cells of {source} hold values as large as "
                             f"{float(largest):.3g}, which look like an undeclared fill value; declare it "
                             "(_FillValue, missing_value or valid_max) or set those cells to NaN")
        if n == 0:
            if not any(g.observed for g in fields if g.name == f.name) and f is _last_of(fields, f.name):
                raise ValueError(f"--var {f.name}: no observed value inside the valid area of {source}")
            # One level or member without data (a pressure level under the ground everywhere):
            # nothing to fill it from, so it is left as it is, flagged outside the valid area.
            f.valid = np.zeros_like(f.valid)
            continue
        f.observed, f.gaps, f.infinite = n, int(gaps), int(infinite)
        # dask sums chunk by chunk, so the last bits of these sums depend on the chunking. Kept to
        # float32's 7 digits (more than a fallback value or a shrinkage prior needs) they almost
        # never do, so the mean and spread a fill uses do not depend on how the cube is chunked.
        f.mean = float(np.float32(s / n))
        f.spread = float(np.float32(np.sqrt(max(s2 / n - (s / n) ** 2, 0.0)))) or 1.0


def _last_of(fields: list[Field], name: str) -> Field:
    return [f for f in fields if f.name == name][-1]
