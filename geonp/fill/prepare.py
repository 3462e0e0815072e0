"""The model made ready for one cube before its blocks are filled: whether each field's history
covariates are used (``--history``, for a model that takes them), its kriging nugget chosen on
the cube's own observations (``--nugget``, for a model that takes the scene's), fine-tuned on
them (``--fit-steps``) and, when asked, its sigma calibrated on them (``--calibrate-sigma``).

All run once per run, before the blocks, so every block (and every dask worker) fills with the
same weights; a resumable store keeps the fine-tuned weights, so a killed run resumes with them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from geonp.atomic import write_text_atomic
from geonp.fill.nugget import choose_nugget, takes_nugget, use_network_nugget
from geonp.fill.plan import Plan
from geonp.fill.stack import add_history_folds


def prepare(p: Plan, store_dir: Path | None, say: Callable[[str], None] | None) -> None:
    """Choose whether to use each field's history and the nugget, fine-tune, then calibrate the
    plan's model in place (each only when the plan asks for it).

    Args:
        p: the run's plan; ``p.choice.model`` is replaced by the prepared model.
        store_dir: the resumable output store, where the fine-tuned weights are kept (None: in memory).
        say: progress messages, or None for quiet.
    """
    if all(f.gaps == 0 for f in p.fields):  # nothing to fill: the plan's note says so
        return
    _choose_history(p, store_dir, say)
    _choose_nugget(p, store_dir, say)
    _finetune(p, store_dir, say)
    _calibrate(p, say)


def _choose_history(p: Plan, store_dir: Path | None, say: Callable[[str], None] | None) -> None:
    """``--history``: each field's history covariates used or replaced by flat maps
    (:mod:`geonp.fill.history_check`), for a model that takes history covariates. A resumable store
    keeps the choice, as it keeps the nugget's (:func:`_choose_nugget`)."""
    from geonp.fill.history_check import choose_history, drop_history, history_names

    if p.choice.model is None or not history_names(p.choice.covariates) or p.options.history == "use":
        return
    saved = None if store_dir is None else store_dir / "geonp_history_used.json"
    if saved is not None and saved.exists():
        record = json.loads(saved.read_text())
        drop_history(p.fields, record["dropped"], p.choice.covariates)
        p.history_chosen = record["said"]
        return
    p.history_chosen, dropped = choose_history(p.choice.model, p.fields, p.spec, p.device, p.choice.covariates,
                                               p.options.history, p.options.seed, p.elevation, say,
                                               p.options.check_windows)
    if saved is not None:
        write_text_atomic(saved, json.dumps({"said": p.history_chosen, "dropped": dropped}))


def _choose_nugget(p: Plan, store_dir: Path | None, say: Callable[[str], None] | None) -> None:
    """``--nugget``: the scene's nugget or the network's own in the kriging head, per field
    (:mod:`geonp.fill.nugget`), for a model that takes the scene's. A resumable store keeps the
    choice, so a resumed run fills with the nugget its saved fine-tuned weights were trained with
    even where a near tie could tip the other way on another machine."""
    if not takes_nugget(p.choice.model):
        return
    saved = None if store_dir is None else store_dir / "geonp_nugget.json"
    if saved is not None and saved.exists():
        record = json.loads(saved.read_text())
        use_network_nugget(p.fields, record["network"])
        p.nugget_chosen, p.nugget_network = record["said"], record["network"]
        return
    p.nugget_chosen, p.nugget_network = choose_nugget(p.choice.model, p.fields, p.spec, p.device, p.options.nugget,
                                                      p.options.seed, p.elevation, p.choice.covariates, say,
                                                      p.options.check_windows)
    if saved is not None:
        write_text_atomic(saved, json.dumps({"said": p.nugget_chosen, "network": p.nugget_network}))


def _finetune(p: Plan, store_dir: Path | None, say: Callable[[str], None] | None) -> None:
    """``--fit-steps``: fine-tune on the cube's own observations (reusing weights saved by a killed run)."""
    fit = p.options.fit
    if p.fit_steps == 0:  # nothing to fine-tune, or nothing asked (geonp.fill.plan.steps_taken)
        return
    from geonp.fill.finetune import finetune
    from geonp.models import load, save

    saved = None if store_dir is None else store_dir / "geonp_fitted_model.safetensors"
    if saved is not None and saved.exists():
        # The same attention blocking as the fine-tuned model had: another blocking sums in
        # another order, and a resumed run must write what an uninterrupted one would.
        p.choice.model = load(saved, device=p.device).for_prediction()
        return
    if p.choice.covariates and fit.history_folds:
        for f in p.fields:
            add_history_folds(f, p.choice.covariates, fit.history_folds, p.options.seed, p.options.max_history_cells,
                              p.device)
    p.choice.model = finetune(p.choice.model, p.fields, p.spec, p.device, fit, p.options.seed, p.elevation, say)
    for f in p.fields:
        f.folds = []  # only fine-tuning needs them: blocks (and dask workers) do not carry them
    if saved is not None:
        save(p.choice.model, saved, extra={"infill": {"fit_steps": fit.steps}})

def _calibrate(p: Plan, say: Callable[[str], None] | None) -> None:
    """Sigma scaled per distance bin on the input's own hidden cells (:mod:`geonp.fill.calibrate`),
    when the plan asks for it and the model is a trained neural process."""
    if not p.options.calibrate_sigma or p.choice.model is None or not p.choice.model.trainable \
            or all(f.gaps == 0 for f in p.fields):
        return
    from geonp.fill.calibrate import calibrate, describe

    p.choice.model, scales = calibrate(p.choice.model, p.fields, p.spec, p.device, p.options.seed, p.elevation,
                                       p.choice.covariates, p.options.check_windows)
    p.sigma_scales = describe(scales)
    if say:
        say("sigma calibrated on the input's own cells (the scales: geonp infill -v)")
