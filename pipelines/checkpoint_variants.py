"""Checkpoints changed at inference only, the same trained tensors: the one tool the release
recipe (``pipelines.pretrain``), the benchmarks and the accuracy ablation share.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from geonp.checkpoint import read_checkpoint, write_checkpoint


def variant_checkpoint(checkpoint: Path, out: Path, mean: str | None = None,
                       model_args: dict[str, Any] | None = None, covariates: list[str] | None = None) -> Path:
    """A copy of ``checkpoint`` changed at inference only, same trained weights: ``mean`` pins a
    gated local-kriging model's gate (see :func:`forced_mean`); ``model_args`` replaces
    architecture arguments that hold no weights (e.g. ``kriging_neighbours``); ``covariates``
    (te-pt-tnp with a local kriging head) adds history covariates to the kriging drift, which
    holds no weight either: one more input each, recorded in the ``infill`` header so infill
    computes them (:func:`geonp.tasks.history.history_covariates`)."""
    tensors, meta = read_checkpoint(checkpoint)
    if covariates:
        meta = copy.deepcopy(meta)
        had = len(meta["infill"].get("covariates", []))
        meta["model"]["dim_x"] += len(covariates) - had
        meta["model"]["kwargs"]["kriging_covariates"] = len(covariates)
        meta["infill"]["covariates"] = list(covariates)
    if mean is not None:
        if "kriging_gate.bias" not in tensors:
            raise SystemExit(f"{checkpoint}: no kriging gate to force (mean: {mean})")
        tensors["kriging_gate.weight"] = torch.zeros_like(tensors["kriging_gate.weight"])
        tensors["kriging_gate.bias"] = torch.full_like(tensors["kriging_gate.bias"],
                                                       30.0 if mean == "kriging" else -30.0)
    if model_args:
        meta = copy.deepcopy(meta)
        meta["model"]["kwargs"].update(model_args)
    return write_checkpoint(out, tensors, meta)
