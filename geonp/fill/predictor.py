"""Which model fills the gaps, and running it on batches of windows.

``--model NAME`` resolves to weights in this order: ``--checkpoint PATH`` when given (it must
hold model NAME), else the weights bundled with geonp (``geonp/weights/NAME.safetensors``),
else, for models without trained weights (``linear``, ``kriging``, ``gp``), a fresh instance.
A checkpoint's ``inputs`` record says what it was trained on; infill takes only weights trained
on infill windows (their ``infill`` header gives the scaling, cells per input unit, and the
window geometry) and refuses the others with one line, so weights never see inputs they were
not trained on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geonp.models import build
from geonp.models.base import NeuralProcess
from geonp.models.registry import available, load_with_meta
from geonp.tasks.covariate_maps import check_nugget_input
from geonp.tasks.history import HISTORY_COVARIATES
from geonp.tasks.windows import WindowTask, collate_windows

#: ``--model`` names filled from a field's whole stack rather than window by window (:mod:`geonp.fill.stack`).
STACK_METHODS = ("dineof", "kriging")
#: Those that take ``--elevation``: kriging, as an external drift (:mod:`geonp.models.field_kriging`).
ELEVATION_STACK_METHODS = ("kriging",)
#: Per-cell covariates infill can give a model, by the names a checkpoint's header uses.
COVARIATES = HISTORY_COVARIATES


@dataclass
class ModelChoice:
    """A loaded model and what infill needs to know about it.

    ``checkpoint`` is None for fresh models; ``sha256`` is the checkpoint file's digest
    (recorded in the output's provenance); ``scaling`` the ``infill`` header of the checkpoint
    (``cells_per_unit``, ``steps_per_unit``) or empty; ``elevation`` whether it takes elevation;
    ``covariates`` the per-cell covariates it takes after the location inputs, from the header
    (``["dineof", "nearest_steps"]``: what the field's history predicts at each cell, see
    :func:`geonp.tasks.history.history_covariates`).
    """

    name: str
    model: NeuralProcess | None  # None for a stack method (geonp.fill.stack)
    checkpoint: Path | None = None
    sha256: str | None = None
    scaling: dict[str, Any] = field(default_factory=dict)
    elevation: bool = False
    covariates: list[str] = field(default_factory=list)


def bundled_checkpoint(name: str) -> Path | None:
    """The weights shipped inside the package for model ``name``, or None."""
    path = Path(str(resources.files("geonp") / "weights" / f"{name}.safetensors"))
    return path if path.is_file() else None


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_names() -> list[str]:
    """Every ``--model`` infill takes: the registry's window models and the stack methods."""
    return sorted([*available(), *STACK_METHODS])


def model_lines() -> list[str]:
    """``geonp models``: one line per ``--model``, what infill fills with when no ``--checkpoint``
    is given (bundled weights, none needed, or train one) and the presets that change something."""
    from geonp.models.catalog import MODELS
    from geonp.models.registry import default_preset, presets

    lines = []
    for name in available():
        sizes, default = presets(name), default_preset(name)
        # A preset that changes nothing is no choice: linear interpolation has none to offer.
        ordered = [default, *(p for p in sizes if p != default)]
        listed = ", ".join(f"{p} (default)" if p == default else p for p in ordered) \
            if any(sizes.values()) else "none (nothing to size)"
        weights = ("bundled weights" if bundled_checkpoint(name) else
                   "no weights needed" if not MODELS[name].trainable else "train one, then --checkpoint")
        lines.append(f"{name:14s} infill: {weights:29s} presets: {listed}")
    said = {"dineof": "no weights: filled from the EOFs of the field's whole stack (needs 3+ observed steps)",
            "kriging": "no weights: ordinary kriging per scene, variogram fitted per scene, quadrant neighbours"}
    return lines + [f"{name:14s} infill: {said[name]}" for name in STACK_METHODS]


def takes_elevation(name: str, checkpoint: str | Path | None = None) -> bool:
    """Whether ``--model name`` (with ``--checkpoint``, else its bundled weights) takes elevation as
    an input, read from the checkpoint's header: a model trained with ``data: {elevation: ...}``.
    Weightless models and the stack methods take none. Raises ValueError for an unreadable checkpoint."""
    if name in STACK_METHODS:
        return False
    path = Path(checkpoint) if checkpoint is not None else bundled_checkpoint(name)
    if path is None:
        return False
    from geonp.checkpoint import read_checkpoint

    meta = read_checkpoint(path)[1]
    covariates = meta.get("infill", {}).get("covariates", [])
    return int(meta.get("model", {}).get("dim_x", 3)) - len(covariates) == 4


def choose_model(name: str, checkpoint: str | Path | None = None, elevation: bool = False,
                 device: torch.device | str = "cpu") -> ModelChoice:
    """Resolve ``--model``/``--checkpoint`` to a loaded model on ``device``.

    Raises ValueError (one line) for an unknown model name, a checkpoint that is missing,
    corrupt or holds another model, a trained model with neither checkpoint nor bundled
    weights, and a model/checkpoint whose inputs do not match the elevation request.
    """
    names = model_names()
    if name not in names:
        raise ValueError(f"--model: unknown model {name!r}; available: {', '.join(names)}")
    if name in STACK_METHODS:
        if checkpoint is not None:
            raise ValueError(f"--checkpoint: model {name!r} has no weights; drop --checkpoint")
        if elevation and name not in ELEVATION_STACK_METHODS:
            raise ValueError(f"--elevation: model {name!r} takes no elevation; drop --elevation")
        return ModelChoice(name, None, elevation=elevation)
    path = Path(checkpoint) if checkpoint is not None else bundled_checkpoint(name)
    if path is None:
        fresh = build(name, dim_x=4 if elevation else 3, dim_y=1, preset="small")
        if fresh.trainable:
            raise ValueError(f"--model {name}: no bundled weights for this model; train one with `geonp train` "
                             "and pass --checkpoint PATH")
        return ModelChoice(name, fresh.to(device).eval(), elevation=elevation)
    model, meta = load_with_meta(path, device=device)
    held = meta["model"]["name"]
    if held != name:
        raise ValueError(f"--checkpoint {path}: holds model {held!r}, not {name!r} (pass --model {held})")
    _check_inputs_record(path, meta)
    scaling = dict(meta.get("infill", {}))
    covariates = [str(c) for c in scaling.get("covariates", [])]
    unknown = [c for c in covariates if c not in COVARIATES]
    if unknown:
        raise ValueError(f"--checkpoint {path}: takes covariates {unknown} this geonp cannot compute "
                         f"(it knows {', '.join(COVARIATES)})")
    drift = model.covariate_inputs
    if drift != len(covariates):
        raise ValueError(f"--checkpoint {path}: its header names covariates {covariates} but the model takes "
                         f"{drift} in its kriging drift; the checkpoint is inconsistent")
    check_nugget_input(covariates, getattr(model, "kriging_nugget_input", False), f"--checkpoint {path}")
    locations = model.dim_x - len(covariates)
    takes_elevation = locations == 4
    if locations not in (3, 4) or model.dim_y != 1:
        raise ValueError(f"--checkpoint {path}: model has {model.dim_x} inputs ({len(covariates)} covariates) and "
                         f"{model.dim_y} outputs; infill needs 3 location inputs (time, row, col) or 4 (with "
                         "elevation) and 1 output")
    if takes_elevation and not elevation:
        raise ValueError(f"--checkpoint {path}: the model takes elevation as an input; pass --elevation FILE "
                         "(or give the cube an elevation coordinate)")
    if elevation and not takes_elevation:
        raise ValueError(f"--elevation: model {name!r} ({path.name}) was trained without elevation; drop "
                         "--elevation or pass a checkpoint trained with it")
    model = model.for_prediction()
    return ModelChoice(name, model, path, file_sha256(path), scaling, takes_elevation, covariates)


def _check_inputs_record(path: Path, meta: dict[str, Any]) -> None:
    """Infill feeds a model window offsets in grid units and per-window standardised values
    (:mod:`geonp.tasks.windows`): accept only weights trained on exactly that, say why otherwise."""
    kind = meta.get("inputs", {}).get("kind", "windows" if "infill" in meta else None)
    if kind == "windows":
        return
    if kind == "cube":
        channels = ", ".join(meta["inputs"].get("channels", []))
        why = (f"trained on cube tasks (an encoding geonp no longer trains: inputs {channels} "
               "normalised over its training region), not on infill windows in grid units")
    elif kind == "synthetic":
        why = f"trained on synthetic {meta['inputs'].get('generator', '')} tasks, not on infill windows"
    else:
        why = "its header does not record what inputs it was trained on"
    raise ValueError(f"--checkpoint {path}: {why}; train one for infill with data: {{name: windows, ...}} "
                     "(README, Training)")


@torch.no_grad()
def predict_windows(model: NeuralProcess, tasks: list[WindowTask], device: torch.device | str = "cpu",
                    batch_size: int = 16) -> list[tuple[np.ndarray, np.ndarray]]:
    """Predictive mean and 1-sigma ``([Nt], [Nt])`` per window, in the variable's units.

    Windows are sorted by their number of targets (then of context cells) before batching, so
    padding stays small where it costs most: the fused attention kernel skips padded rows, but the
    token-wise layers around it compute every row. Sorted by context first, 61% of the demo's
    target rows were padding and its windows took 6.8-7.0 s; by targets first 32%, 5.6-6.1 s
    (2 threads; measured before local attention and the kriging head packed their real targets).
    The order of the returned list follows ``tasks``.
    """
    if model.supports_gridded:
        gridded = _predict_gridded(model, tasks, device, batch_size)
        if gridded is not None:
            return gridded
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(tasks)
    order = sorted(range(len(tasks)), key=lambda i: (tasks[i].targets.size, tasks[i].yc.size))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        b = collate_windows([tasks[i] for i in chunk], device)
        dist = model(b.xc, b.yc, b.xt, b.mask_c, b.mask_t)
        loc = dist.loc[..., 0].float().cpu().numpy()  # [B, Nt]
        scale = dist.scale[..., 0].float().cpu().numpy()
        for row, i in enumerate(chunk):
            m, t = tasks[i].targets.size, tasks[i]
            out[i] = (t.offset + t.scale * loc[row, :m].astype(np.float64), t.scale * scale[row, :m].astype(np.float64))
    return out


def _lattice(model: NeuralProcess, task: WindowTask) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]] | None:
    """Cell indices ``([Nc, G], [Nt, G])`` of a window on the model's grid and the grid's shape,
    or None when the window's inputs are not whole multiples of the model's grid spacing."""
    ppu = np.asarray(model.points_per_unit)
    g = len(ppu)
    scaled = np.concatenate([task.xc[:, :g], task.xt[:, :g]]).astype(np.float64) * ppu
    cells = np.rint(scaled)
    if np.abs(scaled - cells).max(initial=0.0) > 1e-3:
        return None
    cells = (cells - cells.min(0)).astype(np.int64)
    n = task.yc.size
    return cells[:n], cells[n:], tuple(int(k) for k in cells.max(0) + 1)


@torch.no_grad()
def _predict_gridded(model: NeuralProcess, tasks: list[WindowTask], device: torch.device | str,
                     batch_size: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Windows through the model's grid path (``predict_gridded``), batched by grid shape.

    Returns None (use the point path) unless every window lies on the model's lattice, which
    holds when the checkpoint's grid density matches the window scaling (cells per unit).
    """
    lattices = [_lattice(model, t) for t in tasks]
    if any(lat is None for lat in lattices):
        return None
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(tasks)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, (_, _, shape) in enumerate(lattices):
        by_shape.setdefault(shape, []).append(i)
    for shape, members in by_shape.items():
        for start in range(0, len(members), batch_size):
            chunk = members[start:start + batch_size]
            y = np.zeros((len(chunk), *shape, 1), np.float32)  # [B, *G, 1]
            mask = np.zeros((len(chunk), *shape), bool)  # [B, *G]
            cov = np.zeros((len(chunk), *shape, model.num_covariates), np.float32)  # [B, *G, Dcov]
            for row, i in enumerate(chunk):
                (ci, ti, _), t = lattices[i], tasks[i]
                y[(row, *ci.T, 0)] = t.yc
                mask[(row, *ci.T)] = True
                cov[(row, *ci.T)] = t.xc[:, len(shape):]
                cov[(row, *ti.T)] = t.xt[:, len(shape):]
            as_tensor = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
            dist = model.predict_gridded(as_tensor(y), as_tensor(mask),
                                         as_tensor(cov) if model.num_covariates else None)
            loc = dist.loc[..., 0].float().cpu().numpy()  # [B, *G]
            scale = dist.scale[..., 0].float().cpu().numpy()
            for row, i in enumerate(chunk):
                ti, t = lattices[i][1], tasks[i]
                at = (row, *ti.T)
                out[i] = (t.offset + t.scale * loc[at].astype(np.float64), t.scale * scale[at].astype(np.float64))
    return out
