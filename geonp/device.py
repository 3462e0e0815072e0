"""Where geonp computes: the one place a ``--device`` word becomes a :class:`torch.device`.

Training, infill, evaluation and every benchmark take the same words (``auto``, ``cpu``, ``cuda``,
``cuda:N``) and resolve them here, so ``auto`` means one thing everywhere.
"""

from __future__ import annotations

import torch


def resolve_device(device: str) -> torch.device:
    """The device a ``--device`` word names.

    Args:
        device: ``auto`` (CUDA when a GPU is present, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``.

    Returns:
        the :class:`torch.device`.

    Raises:
        ValueError: ``cuda`` without a GPU, or a word that names no device geonp runs on.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but no CUDA GPU is available (use --device cpu or auto)")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    return torch.device(device)
