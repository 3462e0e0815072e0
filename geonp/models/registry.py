"""Build models by name, list them, and save/load them as safetensors + JSON.

``build("te-pt-tnp", dim_x=1, dim_y=1, preset="small", num_pseudo=16)`` picks the
class registered under that name, applies the named preset (architecture sizes),
then the explicit overrides; ``build("te-pt-tnp", dim_x=6, dim_y=1)`` is the model the
bundled weights are (its default preset, ``shipped``). ``save``/``load`` round-trip exactly: the weights go
to safetensors, the name and build arguments to the JSON header; loading rebuilds
the model from that header and never unpickles anything.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from geonp.checkpoint import read_checkpoint, write_checkpoint
from geonp.models.base import NeuralProcess
from geonp.models.catalog import DEFAULT_PRESETS, MODELS, PRESETS

#: Build arguments that change how a model computes, not what it computes (memory knobs):
#: checkpoints that differ only in these describe the same model.
RUNTIME_KEYS = frozenset({"max_block_elems"})

def _ensure_loaded() -> None:
    """Import the model modules, which runs their ``@register`` decorators (:mod:`geonp.models.catalog`)."""
    import geonp.models.baselines  # noqa: F401
    import geonp.models.convcnp  # noqa: F401
    import geonp.models.gp  # noqa: F401
    import geonp.models.interpolation  # noqa: F401
    import geonp.models.kriging  # noqa: F401
    import geonp.models.tnp  # noqa: F401
    import geonp.models.tnpkr  # noqa: F401


def available() -> list[str]:
    """The model names :func:`build` accepts (``geonp models`` lists them with their presets).

    Returns:
        The registered names, sorted.
    """
    _ensure_loaded()
    return sorted(MODELS)


def presets(name: str) -> dict[str, dict[str, Any]]:
    """The named presets of a model.

    Args:
        name: a registered model name.

    Returns:
        ``{preset name: constructor overrides}``, e.g. ``{"paper": {...}, "small": {...}}``.

    Raises:
        ValueError: an unknown model name (the message lists the available ones).
    """
    _ensure_loaded()
    _check_name(name)
    return {k: dict(v) for k, v in PRESETS[name].items()}


def default_preset(name: str) -> str:
    """The preset :func:`build` takes when none is named (``"paper"``; te-pt-tnp's ``"shipped"``).

    Raises:
        ValueError: an unknown model name.
    """
    _ensure_loaded()
    _check_name(name)
    return DEFAULT_PRESETS[name]


def _check_name(name: str) -> None:
    if name not in MODELS:
        raise ValueError(f"unknown model name {name!r}; available: {', '.join(sorted(MODELS))}")


def build(name: str, dim_x: int, dim_y: int, preset: str | None = None, **overrides: Any) -> NeuralProcess:
    """Build a model of the family by name, with freshly initialised weights.

    Args:
        name: a registered name (:func:`available`), e.g. ``"te-pt-tnp"``.
        dim_x: number of input dimensions ``Dx`` (e.g. 2 for rows and cols, 3 with time).
        dim_y: number of output dimensions ``Dy`` (variables predicted jointly).
        preset: a named set of arguments (:func:`presets`), e.g. ``"paper"``, ``"small"``, ``"tiny"``;
            None: the model's default (``"paper"``; for te-pt-tnp ``"shipped"``, the bundled model).
        overrides: any constructor argument, set explicitly over the preset's.

    Returns:
        The model; ``model.config`` records how it was built, so :func:`save` can rebuild it.

    Raises:
        ValueError: an unknown name or preset, or an argument the model does not take (a variant
            that lost is not an argument: its row and commit are in ``pipelines/results``).
    """
    _ensure_loaded()
    _check_name(name)
    preset = DEFAULT_PRESETS[name] if preset is None else preset
    if preset not in PRESETS[name]:
        raise ValueError(f"unknown preset {preset!r} for model {name!r}; available: {', '.join(PRESETS[name])}")
    kwargs = copy.deepcopy({**PRESETS[name][preset], **overrides})  # the config never shares a preset's lists
    cls = MODELS[name]
    try:
        model = cls(dim_x=dim_x, dim_y=dim_y, **kwargs)
    except TypeError as err:
        raise ValueError(f"bad argument for model {name!r}: {err}") from None
    model.config = {"name": name, "dim_x": dim_x, "dim_y": dim_y, "preset": preset, "kwargs": kwargs}
    return model


def same_model(config_a: dict[str, Any], config_b: dict[str, Any]) -> bool:
    """Whether two build configs describe the same model: the same name, sizes and constructor
    arguments once each preset and the class defaults are filled in (so ``preset="small"`` with the
    shipped arguments spelt out is te-pt-tnp's ``shipped``), ignoring :data:`RUNTIME_KEYS`."""
    return _effective(config_a) == _effective(config_b)


def _effective(cfg: dict[str, Any]) -> dict[str, Any]:
    """A build config's name, sizes and every constructor argument it resolves to."""
    import inspect

    _ensure_loaded()
    name = cfg["name"]
    defaults = {k: p.default for k, p in inspect.signature(MODELS[name]).parameters.items()
                if p.default is not inspect.Parameter.empty} if name in MODELS else {}
    preset = PRESETS.get(name, {}).get(cfg.get("preset", "paper"), {})
    kwargs = {k: v for k, v in {**defaults, **preset, **cfg.get("kwargs", {})}.items() if k not in RUNTIME_KEYS}
    return {"name": name, "dim_x": cfg.get("dim_x"), "dim_y": cfg.get("dim_y"), "kwargs": kwargs}


def save(model: NeuralProcess, path: str | os.PathLike, extra: dict[str, Any] | None = None) -> None:
    """Write a model's weights and build config to a safetensors file (no pickle).

    Args:
        model: a model made by :func:`build` (it carries its build config).
        path: the file to write, atomically.
        extra: more JSON-serialisable header entries (training data, scaling, provenance).

    Raises:
        ValueError: the model has no build config.
    """
    if not getattr(model, "config", None):
        raise ValueError("model has no build config: build it with geonp.models.build(...)")
    write_checkpoint(path, dict(model.state_dict()), {"kind": "model", "model": model.config, **(extra or {})})


def load(path: str | os.PathLike, device: str | torch.device = "cpu") -> NeuralProcess:
    """Rebuild a model saved by :func:`save` and load its weights (strictly).

    Args:
        path: the checkpoint.
        device: where to put the weights.

    Returns:
        The model, in training mode as ``nn.Module`` starts (call ``.eval()`` to predict).

    Raises:
        ValueError: naming the file: missing, not a geonp checkpoint, or a pickle (refused).
    """
    return load_with_meta(path, device)[0]


def load_with_meta(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[NeuralProcess, dict[str, Any]]:
    """Like :func:`load`, also returning the checkpoint's JSON header (build config, extras)."""
    tensors, meta = read_checkpoint(path, device=device)
    if meta.get("kind") not in ("model", "train-state") or "model" not in meta:
        raise ValueError(f"checkpoint {path}: holds no model config")
    cfg = meta["model"]
    model = build(cfg["name"], cfg["dim_x"], cfg["dim_y"], preset=cfg.get("preset", "paper"), **cfg["kwargs"])
    prefix = "model." if meta["kind"] == "train-state" else ""
    state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise ValueError(f"checkpoint {path}: weights do not fit model {cfg['name']!r} ({first})") from None
    return model.to(device), meta
