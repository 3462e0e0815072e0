"""What a stack's own history says about each of its cells, as a model's covariates.

:func:`history_covariates` computes them for a field (DINEOF's held-out predictions,
:mod:`geonp.tasks.dineof`; the simpler per-cell ones of :mod:`geonp.tasks.cell_history`; analog
scenes; the step's own large scale and roughness), and :func:`history_folds` computes them again
without some of a stack's cells, so that a training window meets a covariate as blind to its
targets as infill's is to a real gap.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from geonp.tasks.analogs import analog_prediction
from geonp.tasks.cell_history import nearest_steps, other_steps_mean, other_steps_spread
from geonp.tasks.clouds import borrow_gaps
from geonp.tasks.coarse import coarse_trend
from geonp.tasks.covariate_maps import MAX_HISTORY_CELLS, OWN_NUGGET, flat_covariates, flat_values
from geonp.tasks.dineof import MIN_STEPS, cross_validation_cells, dineof
from geonp.threads import chosen_threads, one_blas_thread
from geonp.variogram import drift_residuals, step_nugget_shares

if TYPE_CHECKING:
    import torch

#: The covariates :func:`history_covariates` computes, by the names checkpoints record.
HISTORY_COVARIATES = ("dineof", "nearest_steps", "analogs", "mean", "spread", "coarse", "trend_row", "trend_col",
                      "nugget")
#: Of those, the ones that come from a step itself, not its history: computed for one scene too.
STEP_COVARIATES = ("coarse", "trend_row", "trend_col", "nugget")
#: The coordinate covariates: with both in a kriging drift its local mean is a plane in rows and
#: columns (universal kriging with a linear trend), not a constant.
TREND_COVARIATES = ("trend_row", "trend_col")
#: What each covariate is, in the words the output's ``geonp_history`` attribute uses.
COVARIATE_WORDS = {"dineof": "the DINEOF reconstruction from the other dates", "nearest_steps":
                   "the nearest dates' values", "analogs": "the most similar dates' values", "mean":
                   "the cell's mean over the other dates", "spread": "the cell's spread over the other dates",
                   "coarse": "the scene's own large scale", "trend_row": "the row (a linear trend)",
                   "trend_col": "the column (a linear trend)", "nugget": "the scene's noise level"}


def no_history_words(why: str) -> str:
    """The provenance words for a field that gets flat history covariates (``why``: the reason)."""
    return f"no history used ({why}); the scene's own large scale and noise level where the model takes them"


def history_covariates(values: np.ndarray, valid: np.ndarray | None, names: list[str] | tuple[str, ...], *,
                       rng: np.random.Generator | None = None,
                       max_cells: int = MAX_HISTORY_CELLS,
                       cv_mask: np.ndarray | None = None,
                       device: torch.device | str | None = None) -> tuple[np.ndarray, str]:
    """What a field's own history predicts at each of its cells, as model covariates.

    Each covariate predicts a cell at a step from the *other* steps (at an observed cell its own
    value is left out, as it is unknown at a gap; ``analogs`` keeps it only among the hundreds of
    cells its day-to-day fits use), so a model learns how far to trust the history from
    comparisons that are fair:

    * ``dineof``: the :func:`dineof` prediction from the stack's EOFs
      (``Reconstruction.held_out``), the recurring patterns of a long history;
    * ``nearest_steps``: the cell's value interpolated linearly in time between its nearest
      observed steps before and after (the one there is, at an end), persistence;
    * ``analogs``: the cell from the steps most like this one, whenever they were, each mapped by
      the offset and scale fitted between the two days (:func:`geonp.tasks.analogs.analog_prediction`);
    * ``mean``: the cell's mean over its other observed steps, its climatology: the same offset
      from its neighbours on every day;
    * ``spread``: the standard deviation of the cell's other observed steps; not a prediction of
      the cell but, beside ``mean``, how far a day's anomaly reaches there
      (:func:`geonp.tasks.cell_history.other_steps_spread`);
    * ``coarse``: not history but the step's own large scale, its block means interpolated across
      the whole step (:func:`geonp.tasks.coarse.coarse_trend`), which carries a wide cloud's rims
      across it;
    * ``trend_row``, ``trend_col``: not predictions either but the cell's row and column, so that a
      kriging drift holding both is a plane (universal kriging with a linear trend, the trend a
      geostatistician fits where a scene slopes). An affine map of the index, the field's mean at the
      centre and its standard deviation across the whole extent: the drift's slopes do not depend on
      the map, and a window standardises it like values without huge numbers;
    * ``nugget``: not a prediction either but the step's own roughness, the nugget share of the
      variogram fitted to what the covariates before it leave of its observed cells
      (:func:`geonp.variogram.drift_residuals`, :func:`geonp.variogram.step_nugget_shares`), one number over the
      step (the median step's where a step has too few cells); te-pt-tnp's kriging head takes it
      as its nugget (``kriging.nugget_input``), as a geostatistician fits the variogram of the
      residuals from the drift per scene. A share, not in the field's units: it must come last
      among the names (:func:`geonp.tasks.covariate_maps.unscaled_count`).

    A field with fewer than :data:`MIN_STEPS` steps holding observations (one scene) gets flat
    history maps (``coarse`` is still computed), and one above ``max_cells`` (default
    :data:`MAX_HISTORY_CELLS`) flat maps only; flat maps make a model's external drift the ordinary-kriging constant.

    Args:
        values: ``[T, R, C]`` the field, NaN at gaps.
        valid: ``[R, C]`` or ``[T, R, C]`` bool, True where a value can exist; None: everywhere.
        names: the covariates, in the order the model takes them.
        rng: as :func:`dineof`.
        max_cells: the largest field (time x rows x cols cells) whose history is computed.
        cv_mask: DINEOF's cross-validation cells, drawn beforehand (:func:`dineof`'s ``cv_mask``);
            None: drawn from ``rng``.
        device: the torch device DINEOF's iterations run on (:func:`dineof`'s ``device``); None: NumPy.

    Returns:
        ``(float32 [P, T, R, C], what)``: the maps (finite everywhere; where nothing predicts a
        cell it holds the field's mean, a ``spread`` the median cell's) and a few words saying
        what they are, for provenance.
    """
    rng = np.random.default_rng([0, 4099]) if rng is None else rng  # infill passes [its seed, 4099]
    unknown = [n for n in names if n not in HISTORY_COVARIATES]
    if unknown:
        raise ValueError(f"unknown history covariates {unknown}; geonp computes {', '.join(HISTORY_COVARIATES)}")
    values = np.asarray(values, np.float64)
    ok = np.ones(values.shape[1:], bool) if valid is None else np.asarray(valid, bool)
    observed = np.isfinite(values) & np.broadcast_to(ok, values.shape)
    mean = float(values[observed].mean()) if observed.any() else 0.0
    lacking = _without_history(values, observed, max_cells)
    if lacking is not None and (values.size > max_cells or not set(names) & set(STEP_COVARIATES)):
        return flat_covariates(len(names), values.shape, flat_values(names, mean)), no_history_words(lacking)
    out = np.full((len(names), *values.shape), mean, np.float32)
    said = []
    for i, name in enumerate(names):
        if name == "coarse":
            pred = coarse_trend(np.where(observed, values, np.nan), valid)
            said.append(f"{COVARIATE_WORDS[name]} ({name})")
        elif name in TREND_COVARIATES:
            pred = _coordinate(values, observed, mean, axis=1 if name == "trend_row" else 2)
            said.append(f"{COVARIATE_WORDS[name]} ({name})")
        elif name == "nugget":  # last (unscaled_count): the drift covariates before it are in out[:i]
            shares = step_nugget_shares(drift_residuals(values, observed, out[:i]))
            known = np.isfinite(shares)
            # No step could be fitted: the network's own nugget (OWN_NUGGET), as for flat maps.
            out[i] = np.where(known, shares, np.median(shares[known]) if known.any() else OWN_NUGGET)[:, None, None]
            said.append(f"{COVARIATE_WORDS[name]} ({name})")
            continue
        elif lacking is not None:
            said.append(f"{name} not used ({lacking})")
            continue
        elif name == "dineof":
            # resume: half DINEOF's time; te-pt-tnp on the suite the same to 0.02% (suite_decisions.md)
            rec = dineof(values, valid, rng=rng, cv_mask=cv_mask, resume=True, device=device)
            pred = rec.held_out
            said.append(f"{COVARIATE_WORDS[name]}, {rec.modes} modes ({name})")
        else:
            seen_only = np.where(observed, values, np.nan)
            per_cell = {"nearest_steps": nearest_steps, "analogs": analog_prediction, "mean": other_steps_mean,
                        "spread": other_steps_spread}
            pred = per_cell[name](seen_only)
            said.append(f"{COVARIATE_WORDS[name]} ({name})")
        # Where nothing predicts a cell: the field's mean, or for a spread the typical cell's spread.
        fallback = (float(np.nanmedian(pred)) if np.isfinite(pred).any() else 0.0) if name == "spread" else mean
        out[i] = np.where(np.isfinite(pred), pred, fallback)
    return out, "inputs: " + ", ".join(said)


def _coordinate(values: np.ndarray, observed: np.ndarray, mean: float, axis: int) -> np.ndarray:
    """``[T, R, C]``: each cell's index along ``axis`` (1 rows, 2 columns), mapped affinely to the
    field's mean at the centre and its standard deviation (over observed cells; 1 where it is 0)
    across the whole extent."""
    spread = float(values[observed].std()) if observed.any() else 0.0
    n = values.shape[axis]
    pos = (np.arange(n) - (n - 1) / 2) / max(n - 1, 1)  # -0.5 .. 0.5
    line = mean + (spread if spread > 0 else 1.0) * pos
    shape = [1, 1, 1]
    shape[axis] = n
    return np.broadcast_to(line.reshape(shape), values.shape)


#: :func:`history_folds`' generator seed by default (donor choice and DINEOF's cross-validation).
FOLD_SEED = (0, 6151)
#: Share of a hidden step's observed cells a fold hides, at least and at most.
FOLD_LOW, FOLD_HIGH = 0.10, 0.5


@dataclass
class HistoryFold:
    """A stack's history covariates as a model meets them at infill: computed without some cells.

    ``hidden``: bool ``[T, R, C]``, observed cells hidden under other steps' real gaps before the
    covariates were computed; ``covariates``: float32 ``[P, T, R, C]``, the
    :func:`history_covariates` of the stack without them. A training window whose targets are
    hidden cells of a fold (and whose context leaves out every hidden cell) sees a covariate exactly
    as uninformed of its targets as infill's is of a real gap: the EOFs, the steps' loadings and
    the neighbours under the same cloud all come from the rest of the stack.
    """

    hidden: np.ndarray
    covariates: np.ndarray


def history_folds(values: np.ndarray, valid: np.ndarray | None, names: list[str] | tuple[str, ...], folds: int, *,
                  rng: np.random.Generator | None = None, low: float = FOLD_LOW, high: float = FOLD_HIGH,
                  threads: int | None = None, device: torch.device | str | None = None) -> list[HistoryFold]:
    """``folds`` :class:`HistoryFold` of a stack; fold ``f`` hides cells in steps ``f, f + folds, ...``.

    Each hidden step loses ``low`` to ``high`` of its observed cells under another step's real gaps
    (:func:`geonp.tasks.clouds.borrow_gaps`), the history cross-validation's protocol; the other
    steps stay whole, the history. Costs one :func:`history_covariates` per fold.

    Args:
        values: ``[T, R, C]`` the field, NaN at gaps.
        valid: ``[R, C]`` or ``[T, R, C]`` bool, True where a value can exist; None: everywhere.
        names: the covariates, as :func:`history_covariates`.
        folds: how many folds (at least 1).
        rng: donor choice and DINEOF's cross-validation; default seed :data:`FOLD_SEED`.
        low, high: share of a hidden step's observed cells to hide.
        threads: folds computed at once (default :func:`geonp.threads.chosen_threads`); the folds
            are the same for any number (each on one BLAS thread).
        device: the torch device DINEOF's iterations run on (:func:`dineof`'s ``device``); None: NumPy.

    Returns:
        the folds, in order (at most one per step); a stack without a history
        (:func:`has_history`) gets one fold that hides nothing, with flat covariates.
    """
    if folds < 1:
        raise ValueError(f"history folds must be at least 1, got {folds}")
    rng = np.random.default_rng(FOLD_SEED) if rng is None else rng
    values = np.asarray(values, np.float64)
    ok = np.broadcast_to(np.ones(values.shape[1:], bool) if valid is None else np.asarray(valid, bool), values.shape)
    if not has_history(values, valid):  # flat maps hide nothing: one view of the mean, no DINEOF
        flat, _ = history_covariates(values, valid, names)
        return [HistoryFold(np.zeros(values.shape, bool), flat)]
    # Every random draw first, in the order one fold after another would make them (its hidden
    # cells, then its DINEOF's cross-validation cells), so the folds are the same whatever runs them;
    # then the folds' covariates, each a DINEOF of its own, side by side on the threads geonp may use
    # (their linear algebra releases the GIL).
    drawn: list[tuple[np.ndarray, np.ndarray | None]] = []  # per fold: hidden cells, DINEOF's cv cells
    for f in range(min(folds, len(values))):
        hidden = fold_hidden(values, ok, f, folds, rng, low=low, high=high)
        seen = np.where(hidden, np.nan, values)
        # history_covariates runs DINEOF (the one draw it makes) exactly when this holds.
        runs_dineof = "dineof" in names and _without_history(seen, np.isfinite(seen) & ok) is None
        drawn.append((hidden, cross_validation_cells(seen, ok, rng) if runs_dineof else None))
    threads = max(1, min(len(drawn), chosen_threads() if threads is None else threads))

    def covariates_of(fold: tuple[np.ndarray, np.ndarray | None]) -> HistoryFold:
        hidden, cv = fold  # the fold's stack rebuilt here: one per running thread in memory, not one per fold
        return HistoryFold(hidden, history_covariates(np.where(hidden, np.nan, values), valid, names, cv_mask=cv,
                                                      device=device)[0])

    # Several folds: one BLAS thread on either path, so that the sums are the same whatever the
    # number of threads (set in the calling thread: set first from a pool thread, OpenBLAS's count
    # did not change for the others, geonp.threads.one_blas_thread). One fold takes one path anyway
    # and keeps the process's BLAS threads for what runs outside DINEOF's iterations.
    with one_blas_thread() if len(drawn) > 1 else nullcontext():
        if threads == 1:
            return [covariates_of(fold) for fold in drawn]
        with ThreadPoolExecutor(threads, thread_name_prefix="geonp-fold") as pool:
            return list(pool.map(covariates_of, drawn))


def fold_hidden(values: np.ndarray, ok: np.ndarray, fold: int, folds: int, rng: np.random.Generator, *,
                low: float = FOLD_LOW, high: float = FOLD_HIGH) -> np.ndarray:
    """The cells fold ``fold`` of ``folds`` hides (:func:`history_folds`): bool ``[T, R, C]``.

    Args:
        values: ``[T, R, C]`` the field, NaN at gaps.
        ok: bool ``[T, R, C]``, True where a value can exist.
        fold: which fold: it hides cells in steps ``fold, fold + folds, ...``.
        folds: how many folds.
        rng: donor choice (:func:`geonp.tasks.clouds.borrow_gaps`).
        low, high: share of a hidden step's observed cells to hide, under another step's real gaps.

    Returns:
        True at the observed cells hidden.
    """
    observed = np.isfinite(values) & ok
    hidden, _ = borrow_gaps(observed, ~np.isfinite(values) & ok, rng, low=low, high=high,
                            steps=list(range(fold, len(values), folds)), move_repeats=True)
    return hidden


def _without_history(values: np.ndarray, observed: np.ndarray, max_cells: int = MAX_HISTORY_CELLS) -> str | None:
    """Why a stack gets flat history covariates, or None when it has a history to learn from."""
    if values.size > max_cells:
        return f"the field's {values.size:,} cells exceed {max_cells:,}"
    if int(observed.any(axis=(1, 2)).sum()) < MIN_STEPS:
        return f"fewer than {MIN_STEPS} steps with observations"
    return None


def has_history(values: np.ndarray, valid: np.ndarray | None, max_cells: int = MAX_HISTORY_CELLS) -> bool:
    """Whether :func:`history_covariates` computes more than flat maps for this ``[T, R, C]`` stack."""
    ok = np.ones(values.shape[1:], bool) if valid is None else np.asarray(valid, bool)
    return _without_history(values, np.isfinite(values) & np.broadcast_to(ok, values.shape), max_cells) is None
