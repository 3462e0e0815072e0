"""Whole files or none: write to a temporary file beside the target, then rename it into place.

A process killed mid-write leaves the previous file (or none) and at worst a hidden
``.<name>.*.tmp`` beside it, never a truncated file under the real name. The rename is atomic
on one file system, which is why the temporary file sits in the target's own folder.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

#: The process's umask, read once: ``mkstemp`` makes a file only its owner may read, and a
#: finished file should get the permissions any other new file would (0666 less the umask).
_UMASK = os.umask(0)
os.umask(_UMASK)


def write_atomic(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(temporary path)`` and rename the result to ``path``; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """``Path.write_text``, whole or not at all."""
    return write_atomic(path, lambda tmp: Path(tmp).write_text(text))
