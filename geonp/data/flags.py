"""CF flag variables: which pixels carry a named flag, and validity expressions over flags.

Satellite products mark cloud, land, glint and retrieval failures in flag variables that
follow CF (``flag_masks`` for bit fields, ``flag_values`` for enumerations, with the names in
``flag_meanings``). ESA products add a ``valid_pixel_expression`` such as
``"c2rcc_flags.Valid_PE && !quality_flags.land"``; ``valid_pixels`` evaluates those, lazily.
"""

from __future__ import annotations

import re

import numpy as np
import xarray as xr

_TOKEN = re.compile(r"\s*(&&|\|\||!|\(|\)|\band\b|\bor\b|\bnot\b|[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)?)")


def flag_names(flags: xr.DataArray) -> list[str]:
    """The flag names a CF flag variable declares, in order."""
    return str(flags.attrs.get("flag_meanings", "")).split()


def has_flag(flags: xr.DataArray, name: str) -> xr.DataArray:
    """Boolean array, True where ``flags`` carries the flag ``name`` (False where flags are NaN).

    Works for bit fields (``flag_masks``, compared as unsigned 32/64-bit integers, since
    products store bit 31 as a negative mask or flags as float) and enumerations
    (``flag_values``).
    """
    names = flag_names(flags)
    if name not in names:
        raise ValueError(f"flag variable {flags.name!r} has no flag {name!r}; it has {', '.join(names) or 'none'}")
    i = names.index(name)
    finite = np.isfinite(flags) if np.issubdtype(flags.dtype, np.floating) else xr.ones_like(flags, dtype=bool)
    bits = flags.fillna(0).astype(np.int64) if np.issubdtype(flags.dtype, np.floating) else flags.astype(np.int64)
    if "flag_masks" in flags.attrs:
        mask = int(np.atleast_1d(flags.attrs["flag_masks"])[i]) & 0xFFFFFFFFFFFFFFFF
        mask = mask - (1 << 64) if mask >= 1 << 63 else mask
        if mask < 0 and mask >= -(1 << 31):  # a signed 32-bit mask: the same bit, unsigned
            mask &= 0xFFFFFFFF
        hit = (bits & mask) != 0
        if "flag_values" in flags.attrs:  # masks with values: a multi-bit field equal to a value
            hit = (bits & mask) == int(np.atleast_1d(flags.attrs["flag_values"])[i])
    elif "flag_values" in flags.attrs:
        hit = bits == int(np.atleast_1d(flags.attrs["flag_values"])[i])
    else:
        raise ValueError(f"flag variable {flags.name!r} has neither flag_masks nor flag_values")
    return hit & finite


def valid_pixels(ds: xr.Dataset, expression: str) -> xr.DataArray:
    """Evaluate a validity expression over ``ds``'s flag variables.

    Grammar: ``VAR.FLAG``, ``!``/``not``, ``&&``/``and``, ``||``/``or`` and parentheses,
    e.g. ``"c2rcc_flags.Valid_PE && !quality_flags.land"``.

    Returns:
        A lazy boolean DataArray on the flag variables' dimensions.
    """
    tokens = _TOKEN.findall(expression)
    if "".join(tokens) != re.sub(r"\s+", "", expression):
        raise ValueError(f"cannot parse the validity expression {expression!r}")
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def either() -> xr.DataArray:
        out = both()
        while peek() in ("||", "or"):
            take()
            out = out | both()
        return out

    def both() -> xr.DataArray:
        out = single()
        while peek() in ("&&", "and"):
            take()
            out = out & single()
        return out

    def single() -> xr.DataArray:
        token = take() if peek() is not None else ""
        if token in ("!", "not"):
            return ~single()
        if token == "(":
            out = either()
            if take() != ")":
                raise ValueError(f"unbalanced parentheses in {expression!r}")
            return out
        if "." not in token:
            raise ValueError(f"expected VARIABLE.FLAG in {expression!r}, got {token!r}")
        var, flag = token.split(".")
        if var not in ds.variables:
            raise ValueError(f"validity expression {expression!r} names {var!r}, which is not in the file")
        return has_flag(ds[var], flag)

    result = either()
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r} in the validity expression {expression!r}")
    return result
