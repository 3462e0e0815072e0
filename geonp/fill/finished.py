"""Whether a path holds a finished infill output, read with Zarr alone: the command line refuses to
replace one without ``--overwrite`` before it imports PyTorch and xarray (under a second, where
the refusal from :class:`geonp.fill.output.InfillStore` comes after five)."""

from __future__ import annotations

import os
from pathlib import Path

#: The output store's attribute saying how far the fill got: ``incomplete`` or ``complete``.
STATUS = "geonp_status"
#: Suffixes of the finished store while it is written, and of the work store while they swap.
FINAL, WORK = ".geonp-final", ".geonp-work"


def finished_message(path: str | os.PathLike) -> str:
    """The one line that refuses to replace the finished output at ``path``."""
    return f"{path} already exists (a complete infill output); pass --overwrite to replace it"


def is_finished(path: str | os.PathLike) -> bool:
    """True when ``path`` is a Zarr group whose :data:`STATUS` says ``complete``; False for anything
    else (nothing there, another kind of file, an unfinished run), which the fill itself checks."""
    if not os.path.isdir(path):
        return False
    import zarr

    try:
        group = zarr.open_group(str(path), mode="r", use_consolidated=False)
    except (OSError, ValueError):  # not a Zarr group (zarr's errors are both)
        return False
    return group.attrs.get(STATUS) == "complete"


def refused_early(path: str | os.PathLike) -> bool:
    """Whether the command line refuses ``path`` as an output before the heavy imports: a finished
    output with no swap left behind (a run that died while removing its work store leaves
    ``<path>.geonp-work``, which the fill removes before it refuses)."""
    path = Path(path)
    return is_finished(path) and not path.with_name(path.name + WORK).exists()
