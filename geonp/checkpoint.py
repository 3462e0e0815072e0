"""Checkpoint files: safetensors tensors plus a JSON header, never pickle.

Every file geonp writes for weights or training state is a safetensors file whose
string metadata holds one JSON document (``geonp`` key). Loading parses only the
safetensors header and raw tensor bytes, so nothing in a checkpoint can execute.
Writes go to a temporary file in the same folder and are renamed into place, so a
crash never leaves a half-written checkpoint under the final name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from geonp.atomic import write_atomic
from geonp.version import __version__

_META_KEY = "geonp"
_PICKLE_MAGIC = b"\x80"  # pickle protocol >= 2 starts with PROTO
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default container (a zip holding a pickle)


def write_checkpoint(path: str | os.PathLike, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Atomically write ``tensors`` and the JSON-serialisable ``meta`` to ``path``.

    Args:
        path: the safetensors file to write; written to a temporary file beside it and renamed.
        tensors: named tensors (copied to CPU, contiguous, before writing).
        meta: JSON-serialisable header (config, scaling, provenance); the geonp version is added.

    Returns:
        ``Path(path)``.
    """
    header = json.dumps({"geonp_version": __version__, **meta}, sort_keys=True)
    # safetensors refuses shared or non-contiguous storage: give it plain copies.
    flat = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    return write_atomic(path, lambda tmp: save_file(flat, tmp, metadata={_META_KEY: header}))


def _looks_like_safetensors(path: Path) -> bool:
    # Layout: little-endian u64 header length N, then N bytes of JSON starting with "{".
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 9:
        return False
    n = int.from_bytes(head[:8], "little")
    return head[8:9] == b"{" and 8 + n <= size


def read_checkpoint(
    path: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a file written by :func:`write_checkpoint`.

    Args:
        path: the checkpoint file.
        device: where to put the tensors.

    Returns:
        ``(tensors, meta)``: the named tensors on ``device`` and the JSON header as a dict.

    Raises:
        ValueError: naming the file when it is missing, is a pickle or ``torch.save`` archive
            (refused: unpickling can run arbitrary code), or is not a geonp safetensors checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        why = "a folder, not a checkpoint file" if path.is_dir() else "no such file"
        raise ValueError(f"checkpoint {path}: {why}")
    if not _looks_like_safetensors(path):
        with open(path, "rb") as f:
            head = f.read(4)
        if head.startswith(_ZIP_MAGIC) or head.startswith(_PICKLE_MAGIC):
            raise ValueError(
                f"checkpoint {path}: refusing a pickle/torch.save payload; geonp reads only safetensors files"
            )
        raise ValueError(f"checkpoint {path}: not a safetensors file")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        tensors = load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"checkpoint {path}: not a readable safetensors file ({err})") from None
    if _META_KEY not in metadata:
        raise ValueError(f"checkpoint {path}: safetensors file without a geonp header")
    try:
        meta = json.loads(metadata[_META_KEY])
    except json.JSONDecodeError as err:
        raise ValueError(f"checkpoint {path}: corrupt geonp header ({err})") from None
    return tensors, meta
