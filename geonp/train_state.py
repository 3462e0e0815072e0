"""A training run's resumable state as one safetensors file, and growing a model from a checkpoint.

``state.safetensors`` holds the weights, the optimizer's moments (flattened into named tensors
plus JSON, so nothing is pickled), the step, the elapsed seconds and, for every rank of a
distributed run, its random-generator states (task sources draw from them). Restoring all of it
is what makes a resumed run end with the weights an uninterrupted run would have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from geonp.checkpoint import read_checkpoint, write_checkpoint
from geonp.models.base import NeuralProcess
from geonp.models.registry import same_model


def rank_state(rng: torch.Generator, device: torch.device) -> dict[str, Any]:
    """One rank's random states (gathered to rank 0 before saving): task sources draw from ``rng``,
    so these are all an exact resume needs of the data."""
    out: dict[str, Any] = {"rng.data": rng.get_state(), "rng.torch": torch.get_rng_state()}
    if device.type == "cuda":
        out["rng.cuda"] = torch.cuda.get_rng_state(device)
    return out


def restore_rank(state: dict[str, Any], rng: torch.Generator, device: torch.device) -> None:
    """Put back what :func:`rank_state` recorded."""
    rng.set_state(state["rng.data"])
    torch.set_rng_state(state["rng.torch"])
    if "rng.cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["rng.cuda"], device)


def save_state(path: Path, model: NeuralProcess, opt: torch.optim.Optimizer, step: int, elapsed: float,
               config: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    """Write the run's state atomically; ``ranks`` from :func:`rank_state`, in rank order."""
    opt_tensors, opt_meta = _optimizer_tensors(opt)
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors.update(opt_tensors)
    for r, state in enumerate(ranks):
        suffix = "" if r == 0 else f".{r}"  # rank 0 keeps the names of a single-process state
        tensors.update({f"{k}{suffix}": v for k, v in state.items() if k.startswith("rng.")})
    meta = {"kind": "train-state", "model": model.config, "step": step, "elapsed_s": elapsed,
            "optimizer": opt_meta, "train_config": config, "world_size": len(ranks)}
    write_checkpoint(path, tensors, meta)


def load_state(path: Path, model: NeuralProcess, opt: torch.optim.Optimizer, rank: int,
               world: int) -> tuple[int, float, dict[str, Any]]:
    """Load weights and optimizer from ``path``; return ``(step, elapsed_s, this rank's state)``.

    Raises ValueError (one line) for a file that is not a training state, one written for another
    model configuration, or one written by a different number of processes (each rank's task
    stream continues only where that same rank left it).
    """
    tensors, meta = read_checkpoint(path)
    if meta.get("kind") != "train-state":
        raise ValueError(f"checkpoint {path}: not a training state")
    if not same_model(meta["model"], model.config):
        raise ValueError(f"checkpoint {path}: was written for a different model configuration")
    written = int(meta.get("world_size", 1))
    if written != world:
        raise ValueError(f"checkpoint {path}: written by {written} training process(es), resumed with {world}; "
                         f"resume with --nproc-per-node giving {written} in all")
    weights = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    model.load_state_dict(weights)
    _restore_optimizer(opt, tensors, meta["optimizer"])
    mine: dict[str, Any] = {}
    for key, value in tensors.items():  # rank 0's "rng.data", rank r's "rng.data.r"
        parts = key.split(".")
        if parts[0] == "rng" and parts[2:] == ([] if rank == 0 else [str(rank)]):
            mine[".".join(parts[:2])] = value
    return int(meta["step"]), float(meta["elapsed_s"]), mine


def initialise_from(model: NeuralProcess, path: str | Path) -> list[str]:
    """Copy into ``model`` every weight of checkpoint ``path`` with the same name and shape.

    For growing a trained model (e.g. adding local attention blocks, which start as the
    identity): the weights the checkpoint lacks keep their fresh initialisation. Returns the
    names of the weights copied. Raises ValueError (one line) for a missing file, another model
    or nothing in common.
    """
    from geonp.models.registry import load_with_meta

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config init_from: {path}: no such file")
    source, meta = load_with_meta(path)
    held = meta["model"]["name"]
    if held != model.registry_name:
        raise ValueError(f"config init_from: {path} holds model {held!r}, not {model.registry_name!r}")
    own = model.state_dict()
    copied = {k: v for k, v in source.state_dict().items() if k in own and own[k].shape == v.shape}
    if not copied:
        raise ValueError(f"config init_from: {path} shares no weight with the configured model")
    model.load_state_dict(copied, strict=False)
    return sorted(copied)


def _optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    # Flatten optimizer state into named tensors plus JSON, so no pickle is needed.
    state = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{idx}.{key}"] = value
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _restore_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Put back the optimizer state saved by :func:`_optimizer_tensors`."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = value
    for name, value in meta["scalars"].items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    groups = meta["param_groups"]
    opt.load_state_dict({"state": state, "param_groups": groups})
