"""Whether a field's history helps te-pt-tnp on this input: its history covariates, or none.

A stack's history (DINEOF's reconstruction from the other dates, each cell's spread over them) is
what makes te-pt-tnp the best filler of multi-date stacks where the dates share their patterns.
Where they do not, or where the reconstruction is poor, the kriging head's external drift carries
the history's error into every gap cell, next to an observation too: on the scene suite's
validation split, one cell from an observation, te-pt-tnp's RMSE was 1.58x linear's on
esacci_sm#0 (DINEOF itself 1.09x linear's over the scene), and 1.17-1.81x at 2-6 cells on
c3s_sm#0 (DINEOF 1.64x).

So infill asks the input, as the nugget check does (:mod:`geonp.fill.nugget`): hide observed
cells under the field's history folds (:func:`geonp.tasks.history.history_folds`: the covariates
are computed without the hidden cells, as they are without a real gap's), predict them once with
the history and once with flat maps in its place (what one scene gets, the field's mean: the
drift becomes ordinary kriging's constant), and drop the history where the flat maps lower mean
CRPS by more than :data:`geonp.fill.nugget.CHOICE_Z` standard errors, clustered by window; the
history, which the weights were trained with, stays otherwise. Both predictions see the same
windows and hidden cells: two window sources with one seed, whose folds differ only in the maps.
Chosen once per field, before the nugget check and fine-tuning, which then see what the blocks see.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from geonp.fill.calibrate import BATCH
from geonp.fill.field import Field
from geonp.fill.nugget import CHOICE_Z, NothingToHide, paired_gain, paired_window_crps, settled_crps
from geonp.fill.options import CHECK_WINDOWS, HISTORY_CHOICES
from geonp.fill.stack import add_history_folds
from geonp.models.base import NeuralProcess
from geonp.tasks.covariate_maps import is_flat
from geonp.tasks.history import STEP_COVARIATES, HistoryFold, has_history

#: History folds the check hides cells under (each one DINEOF run).
CHECK_FOLDS = 3


def history_names(covariates: list[str]) -> list[str]:
    """Of a model's covariates, those that come from the field's history (not from a step itself)."""
    return [c for c in covariates if c not in STEP_COVARIATES]


def without_history(maps: np.ndarray, covariates: list[str], mean: float) -> np.ndarray:
    """``maps [P, T, R, C]`` with each history covariate's map set to ``mean`` (what one scene gets);
    the step's own covariates (:data:`geonp.tasks.history.STEP_COVARIATES`) as they are."""
    out = np.array(maps, np.float32)
    for i, name in enumerate(covariates):
        if name not in STEP_COVARIATES:
            out[i] = mean
    return out


def paired_sources(f: Field, covariates: list[str], spec, seed: int, dim_x: int,
                   elevation: np.ndarray | None = None) -> tuple:
    """Two window sources (:class:`geonp.fill.finetune.FieldWindows`, seeded ``seed``) of field ``f``,
    which must hold its history folds: they draw the same windows and hide the same cells, the
    first with the folds' history covariates, the second with flat maps in their place
    (:func:`without_history`)."""
    from geonp.fill.finetune import FieldWindows

    flat_field = copy.copy(f)  # the same data, its own folds
    flat_field.folds = [HistoryFold(fold.hidden, without_history(fold.covariates, covariates, f.mean))
                        for fold in f.folds]
    return (FieldWindows([f], spec, seed, dim_x, elevation), FieldWindows([flat_field], spec, seed, dim_x, elevation))


def paired_history_crps(model: NeuralProcess, with_history, flat, device: torch.device | str, windows: int,
                        first: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CRPS (in each window's standardised units) of every hidden cell of ``windows`` windows,
    ``(flat maps [n], the history [n], window of each cell [n])``: ``with_history`` and ``flat``
    are window sources that draw the same windows, the one with the history covariates, the other
    with flat maps; windows numbered from ``first``. :class:`NothingToHide` when none can be drawn."""
    def predict(pair):
        a, b = pair
        flat_maps = model(b.xc, b.yc, b.xt, b.mask_c, b.mask_t)
        return a.yt, a.mask_t, [flat_maps, model(a.xc, a.yc, a.xt, a.mask_c, a.mask_t)]

    return paired_window_crps(lambda: (with_history.sample(BATCH).to(device), flat.sample(BATCH).to(device)),
                              predict, windows, first)


def choose_history(model: NeuralProcess, fields: list[Field], spec, device: torch.device | str,
                   covariates: list[str], choice: str = "auto", seed: int = 0, elevation: np.ndarray | None = None,
                   say: Callable[[str], None] | None = None,
                   windows: int | None = None) -> tuple[str, list[str]]:
    """Keep or drop each field's history covariates as ``choice`` says (:data:`HISTORY_CHOICES`;
    ``auto``: dropped where flat maps lower CRPS on the field's own hidden cells by more than
    :data:`CHOICE_Z` standard errors). Returns a few words per field on what was chosen and why
    (for provenance) and the labels of the fields whose history was dropped
    (:func:`drop_history` repeats the choice on a resumed run).

    A field without a history (one scene, flat maps) is left as it is and not named. ``windows``:
    the first draw of the check (:func:`geonp.fill.nugget.settled_crps`; None:
    :data:`~geonp.fill.options.CHECK_WINDOWS`).
    """
    if choice not in HISTORY_CHOICES:
        raise ValueError(f"--history must be one of {', '.join(HISTORY_CHOICES)}, got {choice!r}")
    said, dropped = [], []
    for f in fields:
        if f.history is None or is_flat(f.history) or not history_names(covariates) \
                or not has_history(f.whole(), f.valid):
            continue  # no history in its maps (one scene, or a field too large): nothing to check
        if choice != "auto":
            if choice == "none":
                drop_history([f], [f.label], covariates)
                dropped.append(f.label)
            said.append(f"{f.label}: {'used' if choice == 'use' else 'not used'} (asked)")
            continue
        add_history_folds(f, covariates, CHECK_FOLDS, seed, device=device)
        with_history, flat = paired_sources(f, covariates, spec, seed + 32452843, model.dim_x, elevation)
        try:
            flat_crps, history_crps, window = settled_crps(
                partial(paired_history_crps, model, with_history, flat, device), windows or CHECK_WINDOWS)
        except NothingToHide:
            flat_crps = history_crps = window = np.zeros(0)
        f.folds = []
        if not flat_crps.size:
            said.append(f"{f.label}: used (no cell to hide)")
            continue
        gain, error = paired_gain(flat_crps, history_crps, window)
        drop = gain > CHOICE_Z * error
        if drop:
            drop_history([f], [f.label], covariates)
            dropped.append(f.label)
        said.append(f"{f.label}: {'not used' if drop else 'used'} (CRPS with the history {history_crps.mean():.4g} "
                    f"against {flat_crps.mean():.4g} without, on {flat_crps.size} hidden cells of "
                    f"{np.unique(window).size} windows, difference {gain:.2g} +- {error:.2g})")
        if say:
            say(f"{f.label}: history {'not used: without it' if drop else 'used: with it'} the field's own "
                f"cells were filled better ({flat_crps.size} checked)")
    return "; ".join(said), dropped


def drop_history(fields: list[Field], labels: list[str], covariates: list[str]) -> None:
    """Give the fields named ``labels`` flat maps for their history covariates, as one scene gets."""
    for f in fields:
        if f.history is not None and f.label in labels:
            f.set_history(without_history(f.history, covariates, f.mean))
            f.history_dropped = True
