"""L3 gridded satellite products: flagged pixels become gaps, split into cloud gaps and never-valid area.

A satellite field has two kinds of missing values. *Gaps* (cloud, a failed retrieval, a
rejected quality flag) lie where a value could have been observed: they are what a model fills.
The *never-valid area* (land for SST and ocean colour, sea for land surface temperature, outside
the swath) has no value to find. ``open_satellite`` returns the field with NaN at both and a
boolean ``valid`` mask on the horizontal grid that tells them apart: ``valid & isnan(field)`` are
the gaps to fill, ``~valid`` is never valid.

The valid area comes from, in order of precedence:

1. ``valid_mask``: a static mask given by the user (a variable of the file, another file, a
   ``(file, variable)`` pair or a DataArray); a value > 0.5 (or True) marks the valid area;
2. the product preset, when it knows better (MODIS LST: QC says "not produced for reasons other
   than cloud", which is the ocean and outside the swath);
3. otherwise, the cells observed at least once: a cell with no finite value, after the flag
   rejection, in any time step is never valid. With few time steps this also marks a cell that
   was cloudy every time as never valid; pass a mask when that matters.

Presets (``preset="auto"`` recognises them from the file; ``preset=None`` turns them off):

- ``modis_lst``: MOD11/MYD11 ``LST_Day_*``/``LST_Night_*`` with ``QC_Day``/``QC_Night``. Keeps a
  pixel when the mandatory QA (bits 0-1) is 00 (good) or 01 (produced, other quality) and the
  LST error flag (bits 6-7) is at most 2 K; the data quality and emissivity error bits are not
  used. The valid area is where the mandatory QA is not 11 in some time step.
- ``olci``: Sentinel-3 OLCI (C2RCC) with ``quality_flags``. Rejects ``land``, ``coastline`` (mixed
  pixels), ``invalid`` and ``cosmetic`` (filled in, not measured). ``c2rcc_flags.Cloud_risk`` is
  *not* rejected: in the North Sea January 2017 scenes it is set on 98.7% of the pixels that pass
  ``Valid_PE`` (which ``open_cube`` already applies), so rejecting it would leave almost nothing.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import xarray as xr

from geonp.data.cube import horizontal_dims, open_cube
from geonp.data.flags import flag_names, has_flag
from geonp.data.valid import MaskSpec, is_file, valid_area

FlagSpec = Mapping[str, str | Sequence[str]]


@dataclass(frozen=True)
class Preset:
    """What a known product needs beyond the generic flag rejection.

    Attributes:
        name: short name, accepted by ``open_satellite(preset=...)``.
        matches: ``(ds, variable) -> bool``, True when the preset applies to that variable.
        reject_flags: flags to reject, ``{flag variable: [flag names]}``.
        qc: ``(ds, variable) -> bool DataArray``, True where a value passes the product's QC.
        valid_area: ``(ds, variable) -> bool DataArray``, True where values are possible.
        description: one line for the output's ``geonp_qc`` attribute.
    """

    name: str
    matches: Callable[[xr.Dataset, str], bool]
    reject_flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    qc: Callable[[xr.Dataset, str], xr.DataArray] | None = None
    valid_area: Callable[[xr.Dataset, str], xr.DataArray] | None = None
    description: str = ""


# MOD11 LST error flag (bits 6-7): code -> upper bound of the LST error in K.
_LST_ERROR_BOUND_K = {0: 1.0, 1: 2.0, 2: 3.0, 3: np.inf}


def _modis_qc_name(ds: xr.Dataset, variable: str) -> str | None:
    if not variable.startswith("LST_"):
        return None
    for part in ("Day", "Night"):
        if f"_{part}" in variable and f"QC_{part}" in ds.variables:
            return f"QC_{part}"
    return None


def modis_lst_qc(qc: xr.DataArray, *, max_error_k: float = 2.0) -> xr.DataArray:
    """True where a MOD11/MYD11 LST pixel passes QC (lazy, same shape as ``qc``).

    Args:
        qc: the ``QC_Day``/``QC_Night`` bit field (integer or float; NaN fails).
        max_error_k: the largest LST error bound to accept, in K (1, 2, 3 or inf).

    Returns:
        Mandatory QA (bits 0-1) in {00, 01} and LST error flag (bits 6-7) within ``max_error_k``.
    """
    bits = qc.fillna(3).astype(np.int64) if np.issubdtype(qc.dtype, np.floating) else qc.astype(np.int64)
    codes = [c for c, bound in _LST_ERROR_BOUND_K.items() if bound <= max_error_k]
    error_ok = ((bits >> 6) & 3).isin(codes)
    return ((bits & 3) <= 1) & error_ok


def modis_lst_preset(max_error_k: float = 2.0) -> Preset:
    """The MODIS LST preset (see the module docstring), with its LST error bound in K."""

    def qc(ds: xr.Dataset, variable: str) -> xr.DataArray:
        return modis_lst_qc(ds[_modis_qc_name(ds, variable)], max_error_k=max_error_k)

    def valid_area(ds: xr.Dataset, variable: str) -> xr.DataArray:
        q = ds[_modis_qc_name(ds, variable)]
        # Mandatory QA 11 ("not produced, reasons other than cloud") is the ocean and outside
        # the swath; 10 is cloud, a gap inside the valid area.
        return np.isfinite(q) & ((q.fillna(3).astype(np.int64) & 3) != 3)

    return Preset("modis_lst", lambda ds, v: _modis_qc_name(ds, v) is not None, qc=qc, valid_area=valid_area,
                  description=f"MOD11 QC: mandatory QA in {{00, 01}} and LST error <= {max_error_k:g} K")


def olci_preset(reject: Sequence[str] = ("land", "coastline", "invalid", "cosmetic")) -> Preset:
    """The OLCI preset (see the module docstring), rejecting ``quality_flags`` ``reject``."""

    def matches(ds: xr.Dataset, variable: str) -> bool:
        return "quality_flags" in ds.variables and {"land", "invalid"} <= set(flag_names(ds["quality_flags"]))

    return Preset("olci", matches, reject_flags={"quality_flags": tuple(reject)},
                  description=f"OLCI quality_flags rejected: {', '.join(reject)}")


PRESETS: dict[str, Callable[[], Preset]] = {"modis_lst": modis_lst_preset, "olci": olci_preset}


def open_satellite(
    path: str | os.PathLike,
    variable: str,
    *,
    reject_flags: FlagSpec | None = None,
    valid_mask: MaskSpec | None = None,
    preset: str | Preset | None = "auto",
) -> xr.Dataset:
    """Open one variable of an L3 product with flagged pixels as gaps and its valid area.

    Args:
        path: a NetCDF/HDF5 file or Zarr store (anything ``open_cube`` reads).
        variable: the field, e.g. ``"SST"``, ``"conc_chl"``, ``"LST_Day_1km"``.
        reject_flags: CF flags to turn into gaps, ``{flag variable: flag name or names}``, e.g.
            ``{"quality_flags": ["land", "invalid"], "c2rcc_flags": ["Cloud_risk"]}``; added to
            the preset's.
        valid_mask: the static valid area: a variable of the file (``"mask"``), another file
            (its one variable, or the one whose name contains "mask"), a ``(file, variable)``
            pair, or a DataArray on the same horizontal grid (or, for lat/lon grids, a larger
            grid holding it); values > 0.5 or True are valid, NaN is not; a mask with a time
            dim counts a cell valid when any step does. Default: the preset's valid area, else
            the cells observed at least once.
        preset: ``"auto"`` (recognise MODIS LST and OLCI), a name from ``PRESETS``, a ``Preset``,
            or None for the generic rules only.

    Returns:
        A lazy Dataset with ``variable`` (dims as in the file, e.g. ``(time, lat, lon)`` or
        ``(y, x)``; NaN at every gap and outside the valid area) and ``valid`` (bool on the
        horizontal dims ``(lat, lon)`` or ``(y, x)``); coordinates as ``open_cube`` gives them.

    Raises:
        ValueError: naming the file: an unknown variable, flag variable or flag name; a preset
            that does not fit; a mask that is not on the cube's grid or cannot be found.
    """
    name = str(path)
    ds = open_cube(path, variable)
    if isinstance(valid_mask, str) and valid_mask not in ds.variables and not is_file(valid_mask) \
            and valid_mask not in ("observed", "all"):
        try:  # a field of the file that open_cube dropped (it keeps only flag-like variables)
            ds = open_cube(path, [variable, valid_mask])
        except ValueError:
            raise ValueError(f"{name}: valid_mask {valid_mask!r} is neither a variable of the file "
                             f"(it has {', '.join(map(str, ds.data_vars))}) nor an existing file") from None
    return quality_screen(ds, variable, reject_flags=reject_flags, valid_mask=valid_mask, preset=preset, source=name)


def quality_screen(
    ds: xr.Dataset,
    variable: str,
    *,
    reject_flags: FlagSpec | None = None,
    valid_mask: MaskSpec | None = None,
    preset: str | Preset | None = "auto",
    source: str | None = None,
) -> xr.Dataset:
    """The product-agnostic core of ``open_satellite`` for a Dataset already open (``open_cube`` convention).

    Arguments and result as ``open_satellite``; ``ds`` must hold ``variable`` and the flag/QC
    (and mask) variables named. ``source`` names the data in error messages (default
    ``ds.attrs["geonp_source"]``).
    """
    name = source or str(ds.attrs.get("geonp_source", "the dataset"))
    if variable not in ds.data_vars:
        raise ValueError(f"{name}: unknown variable {variable!r}; it has {', '.join(map(str, ds.data_vars))}")
    chosen = _pick_preset(ds, variable, preset, name)
    flags = {k: list(v) for k, v in (chosen.reject_flags.items() if chosen else ())}
    for var, names in (reject_flags or {}).items():
        flags.setdefault(var, []).extend([names] if isinstance(names, str) else names)
    da = ds[variable]
    keep = _not_flagged(ds, da, flags, name)
    if chosen is not None and chosen.qc is not None:
        good = chosen.qc(ds, variable)
        keep = good if keep is None else keep & good
    screened = da if keep is None else da.where(keep)

    hdims = horizontal_dims(ds)
    if valid_mask is None and chosen is not None and chosen.valid_area is not None:
        valid, how = chosen.valid_area(ds, variable), f"{chosen.name} preset"
    else:  # the user's mask, else the cells observed at least once (geonp.data.valid), on the screened values
        if valid_mask is None and int(np.prod([da.sizes[d] for d in da.dims if d not in hdims])) < 2:
            warnings.warn(f"{name}: {variable!r} has one time step and no valid_mask: every gap is taken as "
                          "never valid (nothing to fill); pass valid_mask", UserWarning, stacklevel=2)
        valid, how = valid_area(ds.drop_vars("valid", errors="ignore").assign({variable: screened}), screened,
                                "observed" if valid_mask is None else valid_mask, name)
    others = [d for d in valid.dims if d not in hdims]  # a static area: valid in any time step
    valid = (valid.any(others) if others else valid).transpose(*[d for d in da.dims if d in hdims])
    valid = valid.drop_vars([c for c in valid.coords if c not in da.coords], errors="ignore")

    out = screened.where(valid)
    out.attrs = {**da.attrs, "geonp_rejected_flags": "; ".join(f"{k}: {' '.join(v)}" for k, v in flags.items()),
                 "geonp_qc": chosen.description if chosen else "", "geonp_valid_area": how}
    out.attrs.pop("valid_pixel_expression", None)  # already applied: the flags are no longer in the output
    valid.attrs = {"long_name": "inside the area where values are possible (NaN there is a gap to fill)",
                   "comment": "False: never valid (e.g. land for SST, sea for LST, outside the swath)",
                   "geonp_valid_area": how}
    result = out.to_dataset(name=variable).assign(valid=valid)
    result.attrs = {**ds.attrs, "geonp_source": name}
    result.attrs["geonp_preset"] = chosen.name if chosen else ""
    return result


def gaps(ds: xr.Dataset, variable: str | None = None) -> xr.DataArray:
    """Lazy bool array, True at the gaps to fill: inside ``valid`` and NaN (dims of the field)."""
    da = ds[variable or _the_field(ds)]
    return ds["valid"] & np.isnan(da)


def gap_fraction(ds: xr.Dataset, variable: str | None = None) -> xr.DataArray:
    """Lazy fraction (0..1) of the valid area that is a gap, per time step (dims: the non-horizontal ones)."""
    hdims = list(horizontal_dims(ds))
    return gaps(ds, variable).sum(hdims) / ds["valid"].sum()


def _the_field(ds: xr.Dataset) -> str:
    names = [str(v) for v in ds.data_vars if v != "valid"]
    if len(names) != 1:
        raise ValueError(f"name the variable: the dataset has {', '.join(names)}")
    return names[0]


def _pick_preset(ds: xr.Dataset, variable: str, preset: str | Preset | None, name: str) -> Preset | None:
    if preset is None:
        return None
    if preset == "auto":
        return next((p for p in (make() for make in PRESETS.values()) if p.matches(ds, variable)), None)
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known: auto, {', '.join(PRESETS)} (or None)")
        preset = PRESETS[preset]()
    if not preset.matches(ds, variable):
        raise ValueError(f"{name}: the {preset.name!r} preset does not apply to {variable!r} "
                         "(its QC/flag variables are missing)")
    return preset


def _not_flagged(ds: xr.Dataset, da: xr.DataArray, flags: Mapping[str, list[str]], name: str) -> xr.DataArray | None:
    """True where none of ``flags`` is set (pixels whose flags are NaN are kept), or None for no flags."""
    keep = None
    flag_vars = [str(v) for v in ds.variables if "flag_meanings" in ds[v].attrs]
    for var, names in flags.items():
        if var not in ds.variables:
            raise ValueError(f"{name}: no flag variable {var!r}; "
                             f"the flag variables are {', '.join(flag_vars) or 'none'}")
        if not set(ds[var].dims) <= set(da.dims):
            raise ValueError(f"{name}: flag variable {var!r} has dims {ds[var].dims}, not a subset of "
                             f"{da.name!r}'s {da.dims}")
        for flag in names:
            try:
                hit = has_flag(ds[var], flag)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None
            keep = ~hit if keep is None else keep & ~hit
    return keep


