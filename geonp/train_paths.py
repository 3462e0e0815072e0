"""The paths a training config names, resolved and checked before a run writes anything.

A config names files in three places: ``out_dir`` (where the run lives), ``init_from`` (weights
to start from) and its data (the ``files``, ``val_files`` and ``elevation`` of infill windows).
Relative paths mean what the code that opens them makes of them: the working directory for the
first two, the shared data folder
(:func:`geonp.data.readers.data_folder`) for window files and their DEM. A typo found after an hour of
loading, or a run that writes its state over its own input, costs a user the hour; so every path
is checked at once and an error names the key, the path as written and where it was looked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def config_paths(init_from: str | None, data: dict[str, Any]) -> Iterator[tuple[str, Path]]:
    """``(config key, resolved path)`` of every input file the config names (URLs left out)."""
    if init_from is not None:
        yield "init_from", _resolved(init_from, None)
    if data.get("name") == "windows":
        from geonp.data.readers import data_folder

        folder = data_folder()
        if isinstance(data.get("elevation"), str):
            yield "data.elevation", _resolved(data["elevation"], folder)
        for group in ("files", "val_files"):
            for i, entry in enumerate(data.get(group) or []):
                if not isinstance(entry, dict):
                    raise ValueError(f"config: data.{group}[{i}] must be a mapping with path and variable")
                paths = entry.get("paths", [entry.get("path")] if "path" in entry else [])
                if not paths:
                    raise ValueError(f"config: data.{group}[{i}] needs 'path' (or 'paths')")
                for j, p in enumerate(paths):
                    key = f"data.{group}[{i}].path" + (f"s[{j}]" if "paths" in entry else "")
                    yield key, _resolved(str(p), folder)


def check_paths(out_dir: str | None, init_from: str | None, data: dict[str, Any]) -> None:
    """Raise ValueError (one line naming the key) if an input is missing or the output is unusable.

    Checks: every input file exists; ``out_dir`` is not a file, is none of the inputs and holds
    none of them (a run rewrites what is in its folder).
    """
    inputs = list(config_paths(init_from, data))
    for key, path in inputs:
        if not path.exists():
            raise ValueError(f"config {key}: {path}: no such file or directory")
    if out_dir is None:
        return
    out = _resolved(out_dir, None)
    if out.exists() and not out.is_dir():
        raise ValueError(f"config out_dir: {out} is a file, not a folder")
    for key, path in inputs:
        if path == out or out in path.parents:
            raise ValueError(f"config out_dir: {out} holds the input {key} ({path}); choose another folder")
        if path.is_dir() and path in out.parents:
            raise ValueError(f"config out_dir: {out} lies inside the input {key} ({path}); choose another folder")


def _resolved(path: str, base: Path | None) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute() and base is not None:
        p = base / p
    return p.resolve()
