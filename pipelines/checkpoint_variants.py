"""Checkpoints changed at inference only, the same trained tensors: the one tool the release
recipe (``pipelines.release.pretrain``), the benchmarks and the accuracy ablation share; and a
resumable run's weights as a checkpoint infill reads, before the run is finished:

    python -m pipelines.checkpoint_variants pipelines/weights/resume/accuracy/history-folds-small \
        runs/history-folds-small-now.safetensors --model-args '{"kriging": {"slope_prior": "empirical"}}'

``--covariates '["dineof", "spread"]'`` gives those weights another history drift (no weight in it).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import yaml

from geonp.checkpoint import read_checkpoint, write_checkpoint


def variant_checkpoint(checkpoint: Path, out: Path, model_args: dict[str, Any] | None = None,
                       covariates: list[str] | None = None, window: dict[str, Any] | None = None) -> Path:
    """A copy of ``checkpoint`` changed at inference only, same trained weights: ``model_args`` replaces
    architecture arguments that hold no weights, a mapping merged into the header's (e.g.
    ``{"kriging": {"neighbours": 128}}`` changes that one setting of the kriging head); ``covariates``
    (te-pt-tnp with a local kriging head) adds history covariates to the kriging drift, which
    holds no weight either: one more input each, recorded in the ``infill`` header so infill
    computes them (:func:`geonp.tasks.history.history_covariates`), and ``[]`` takes every one
    out (the drift becomes ordinary kriging's constant); the head reads the last as its nugget
    (``kriging.nugget_input``) exactly when they end with ``nugget``; ``window`` replaces the context
    geometry infill reads around each window, ``halo`` (time, rows, cols cells) or ``time_cells``
    (:func:`geonp.fill.plan.plan` takes them from the header's ``infill.window``)."""
    tensors, meta = read_checkpoint(checkpoint)
    if window:
        if not isinstance(window, dict):
            raise ValueError(f"window: a JSON object of halo and time_cells is needed, got {window!r}")
        unknown = set(window) - {"halo", "time_cells"}
        if unknown:
            raise ValueError(f"window: only halo and time_cells are read at infill, not {', '.join(sorted(unknown))}")
        meta = copy.deepcopy(meta)
        meta["infill"].setdefault("window", {}).update(window)
        _window_spec(meta["infill"]["window"])  # refused here, not at infill
    if covariates is not None:  # [] takes them all out: the same weights with an ordinary-kriging drift
        if not isinstance(covariates, list) or not all(isinstance(c, str) for c in covariates):
            raise ValueError(f"covariates: a JSON list of names is needed, got {covariates!r}")
        from geonp.tasks.history import HISTORY_COVARIATES

        unknown = [c for c in covariates if c not in HISTORY_COVARIATES]
        if unknown:
            raise ValueError(f"covariates: unknown {unknown}; geonp computes {', '.join(HISTORY_COVARIATES)}")
        meta = copy.deepcopy(meta)
        had = len(meta["infill"].get("covariates", []))
        meta["model"]["dim_x"] += len(covariates) - had
        head = meta["model"]["kwargs"].get("kriging")
        if head is None:
            raise ValueError("covariates: the model has no kriging head to take them")
        head["covariates"] = len(covariates)
        meta["infill"]["covariates"] = list(covariates)
        # The head takes its nugget from the covariates exactly when they end with it.
        head["nugget_input"] = "nugget" in covariates
    if model_args:
        if not isinstance(model_args, dict):
            raise ValueError(f"model arguments must be a JSON object, got {model_args!r}")
        meta = copy.deepcopy(meta)
        meta["model"]["kwargs"] = merged(meta["model"]["kwargs"], model_args)
    if covariates is not None or model_args:
        from geonp.tasks.covariate_maps import check_nugget_input

        head = meta["model"]["kwargs"].get("kriging") or {}
        check_nugget_input(meta["infill"].get("covariates", []), head.get("nugget_input", False), "variant")
    if model_args or covariates is not None:
        _buildable(meta["model"])
    return write_checkpoint(out, tensors, meta)


def merged(base: dict, overrides: dict) -> dict:
    """``base`` with ``overrides`` merged in, mappings recursively (lists and values replaced), so
    ``{"kriging": {"neighbours": 128}}`` changes that one setting of the kriging head; a new dict."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _window_spec(window: dict[str, Any]):
    """A header's ``infill.window`` as a :class:`~geonp.tasks.windows.WindowSpec`; ValueError in one line."""
    from geonp.tasks.windows import WindowSpec

    try:
        return WindowSpec.from_dict(window)
    except (TypeError, ValueError) as err:
        raise ValueError(f"window {window}: {err}") from None


def _buildable(model: dict[str, Any]) -> None:
    """Refuse a header whose model cannot be built (an unknown or ill-typed argument) before it is written."""
    from geonp.models import build

    if not isinstance(model.get("kwargs"), dict):
        raise ValueError(f"model arguments must be a JSON object, got {model.get('kwargs')!r}")
    try:
        build(model["name"], model["dim_x"], model["dim_y"], preset=model.get("preset", "paper"), **model["kwargs"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"model {model['name']} cannot be built with these arguments: {err}") from None


def bundled_variants(items: list[str], folder: Path, model: str = "te-pt-tnp") -> dict[str, str]:
    """``LABEL=JSON`` command-line items -> ``{label: checkpoint path}``: the bundled ``model`` changed at
    inference only, the JSON holding ``covariates`` (a list), ``model_args`` (a dict) and ``window``
    (a dict: ``halo``, ``time_cells``), e.g. ``eb={"model_args": {"kriging": {"slope_prior": "empirical"}}}``
    or ``halo20={"window": {"halo": [1, 20, 20]}}``; written into ``folder``."""
    from geonp.fill.predictor import bundled_checkpoint

    out = {}
    for item in items:
        label, _, text = item.partition("=")
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as err:
            raise SystemExit(f"--variant {label}: not JSON ({err})") from None
        if not isinstance(spec, dict):
            raise SystemExit(f"--variant {label}: a JSON object is needed, got {text}")
        unknown = set(spec) - {"covariates", "model_args", "window"}
        if unknown:
            raise SystemExit(f"--variant {label}: unknown key(s) {', '.join(sorted(unknown))}")
        try:
            out[label] = str(variant_checkpoint(bundled_checkpoint(model), folder / f"{label}.safetensors",
                                                model_args=spec.get("model_args"), covariates=spec.get("covariates"),
                                                window=spec.get("window")))
        except ValueError as err:
            raise SystemExit(f"--variant {label}: {err}") from None
    return out


def state_checkpoint(run: Path, out: Path, model_args: dict[str, Any] | None = None) -> Path:
    """The weights of a resumable windows run (``run``: its folder, holding ``config.yaml`` and
    ``state.safetensors``) as a model checkpoint with the header its finished run would write
    (:func:`geonp.tasks.window_source.windows_checkpoint_meta`), ``model_args`` set as
    :func:`variant_checkpoint`'s. Costs none of the data loading that resuming the run would."""
    from geonp.models.registry import load_with_meta, save
    from geonp.tasks.window_source import windows_checkpoint_meta

    config, state = run / "config.yaml", run / "state.safetensors"
    for need in (config, state):
        if not need.is_file():
            raise SystemExit(f"{run}: no {need.name} (a resumable run's folder holds config.yaml, state.safetensors)")
    loaded = yaml.safe_load(config.read_text())
    data = (loaded.get("data") if isinstance(loaded, dict) else None) or {}
    if not isinstance(data, dict) or data.get("name") != "windows":
        raise SystemExit(f"{config}: not a windows run (data.name: windows); only those are read at infill")
    if not isinstance(model_args or {}, dict):
        raise SystemExit(f"model arguments must be a JSON object, got {model_args!r}")
    try:
        spec = _window_spec(data.get("window") or {})
        model, meta = load_with_meta(state)
        model.config["kwargs"] = merged(model.config["kwargs"], model_args or {})
        _buildable(model.config)
    except ValueError as err:
        raise SystemExit(f"{run}: {err}") from None
    header = windows_checkpoint_meta(spec, data.get("covariates") or [], bool(data.get("elevation")))
    save(model, out, extra={"step": meta["step"], **header})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a resumable windows run's folder (config.yaml, state.safetensors)")
    parser.add_argument("out", type=Path, help="the checkpoint to write")
    parser.add_argument("--model-args", default="{}", help="JSON: architecture arguments that hold no weights")
    parser.add_argument("--covariates", default=None,
                        help='JSON list: the history covariates of the kriging drift instead of the run\'s '
                             '(e.g. \'["dineof", "spread"]\'; the drift holds no weight)')
    args = parser.parse_args()
    try:
        model_args = json.loads(args.model_args)
        covariates = None if args.covariates is None else json.loads(args.covariates)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--model-args / --covariates: not JSON ({err})") from None
    out = state_checkpoint(args.run, args.out, model_args)
    if covariates is not None:
        try:
            variant_checkpoint(out, out, covariates=covariates)
        except ValueError as err:
            out.unlink()  # no checkpoint that looks like the one asked for
            raise SystemExit(f"--covariates: {err}") from None
    step = read_checkpoint(out)[1]["step"]
    print(f"{args.out}: {args.run.name} at step {step}")


if __name__ == "__main__":
    main()
