"""Whether a path holds a finished infill output, read with Zarr alone: the command line refuses to
replace one without ``--overwrite`` before it imports PyTorch and xarray (under a second, where
the refusal from :class:`geonp.fill.output.InfillStore` comes after five)."""

from __future__ import annotations

import os

#: The output store's attribute saying how far the fill got: ``incomplete`` or ``complete``.
STATUS = "geonp_status"


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
