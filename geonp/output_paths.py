"""Where a command may write, checked before anything is read or written.

Standard library only, so the command line can refuse a bad ``-o`` before its heavy imports
(torch, xarray's readers), and the Python API (:func:`geonp.fill.engine.infill_file`,
:func:`geonp.evaluate.run_evaluate`) refuses the same paths with the same one-line messages.
The rule they share: an output never replaces, or lies around, the input it was made from.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Suffixes of the single-file formats geonp reads: ``-o filled.nc`` would get a Zarr folder
#: under a NetCDF name, which every reader of that name then fails to open.
FILE_FORMATS = (".nc", ".nc4", ".netcdf", ".cdf", ".h5", ".hdf", ".hdf5", ".grib", ".grb", ".grib2", ".grb2",
                ".tif", ".tiff")


def _named(out: str | os.PathLike, example: str) -> Path:
    """``out`` as a path, refusing an empty name or a bare folder such as ``.`` or ``..``."""
    text = os.fspath(out)
    if not text.strip() or Path(text).name in ("", ".", ".."):
        raise ValueError(f"-o {text!r}: name the output (e.g. -o {example}), not a folder")
    return Path(text)


def _local(input: str | os.PathLike | None) -> Path | None:
    """The input as a local path, or None for a URL (nothing local to protect)."""
    if input is None:
        return None
    text = os.fspath(input)
    if "://" in text and not text.startswith("file://"):
        return None
    return Path(text[len("file://"):] if text.startswith("file://") else text)


def check_store_path(out: str | os.PathLike, input: str | os.PathLike | None = None) -> Path:
    """Refuse an ``-o`` for ``geonp infill`` that is not a Zarr store's name, or that would
    replace, sit inside, or hold the input (``--overwrite`` would delete an input inside it).

    Args:
        out: the output Zarr store.
        input: the file or store being filled (a URL is not checked).

    Returns:
        ``Path(out)``.

    Raises:
        ValueError: one line naming ``-o``.
    """
    path = _named(out, "filled.zarr")
    source = _local(input)
    if source is not None:
        here, there = path.resolve(), source.resolve()
        if here == there:
            raise ValueError(f"-o {out}: the output would overwrite the input; choose another path")
        if there in here.parents:
            raise ValueError(f"-o {out}: the output would be written inside the input {input}; "
                             "choose a path outside it")
        if here in there.parents:
            raise ValueError(f"-o {out}: the input {input} lies inside the output, which a new fill "
                             "replaces; choose another path")
    if path.suffix.lower() in FILE_FORMATS:
        raise ValueError(f"-o {out}: geonp infill writes a Zarr store (a folder), not a {path.suffix} file; "
                         f"name it e.g. {path.with_suffix('.zarr').name}")
    return path


def check_report_path(out: str | os.PathLike, input: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Refuse an ``-o`` for ``geonp evaluate`` that is not a markdown table's name, is a folder, or
    whose table or JSON beside it would replace the input.

    Args:
        out: the markdown table (``.md``); its JSON goes beside it (``.json``).
        input: the file being evaluated (a URL is not checked).

    Returns:
        ``(markdown path, JSON path)``.

    Raises:
        ValueError: one line naming ``-o``.
    """
    path = _named(out, "evaluation.md")
    if path.suffix.lower() not in (".md", ".markdown"):
        raise ValueError(f"-o {out}: geonp evaluate writes a markdown table and its JSON beside it; "
                         f"name the table e.g. {path.with_suffix('.md').name}")
    if path.is_dir():
        raise ValueError(f"-o {out}: is a folder; name the table file, e.g. {out}/evaluation.md")
    written = (path, path.with_suffix(".json"))
    source = _local(input)
    if source is not None:
        for target in written:
            if target.resolve() == source.resolve() or source.resolve() in target.resolve().parents:
                raise ValueError(f"-o {out}: {target} would overwrite the input; choose another path")
    return written
