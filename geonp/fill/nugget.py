"""Which nugget te-pt-tnp's kriging head uses on this input: the scene's or the network's own.

A model that takes the ``nugget`` covariate (``kriging.nugget_input``) can weigh its kriging
neighbours with the nugget share of the variogram fitted to each step of the input
(:func:`geonp.variogram.step_nugget_shares`), as a geostatistician would, or with the near-zero
nugget its network predicts. Neither wins everywhere: on history_cv the scene's nugget lowered
CRPS on noisy NDVI (Sentinel-2 -3.5%, Alaska -4.8%, validation) and raised it on smooth SST and
soil moisture (+1.2%, +0.9%). So, like a geostatistician cross-validating a variogram, infill
asks the input: hide some of its observed cells under gap patterns it really has (the windows
calibration draws, :func:`geonp.fill.calibrate.calibrate`), predict them both ways, and take the
scene's nugget where it lowers the mean CRPS of those cells by more than :data:`CHOICE_Z`
standard errors; otherwise the network's own, which the weights were trained with. Chosen once
per field, before fine-tuning, which then trains with it.

A field whose variogram finds no nugget at any step (under :data:`SMOOTH_SHARE` of the variance:
reanalysis temperature, smooth SST) keeps the scene's without the check: there the two choices
differ by a few tenths of a percent of CRPS at most, and the check cost a sixth of the fill.

The check is sequential: ``windows`` windows first (:data:`NUGGET_CHECK_WINDOWS`, 32), then as
many again as have been scored (32, 64: 128 in all) while the gain lies within :data:`CHOICE_MARGIN`
standard errors of the threshold, up to :data:`CHOICE_MORE` times the first draw. A clear case
(most large scenes) costs the first draw only; a close one gets the windows that settle it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from geonp.fill.calibrate import BATCH, own_cell_windows
from geonp.fill.field import Field
from geonp.fill.options import NUGGET_CHECK_WINDOWS, NUGGET_CHOICES
from geonp.metrics import crps_normal
from geonp.models.base import NeuralProcess
from geonp.tasks.covariate_maps import OWN_NUGGET, flat_covariates, is_flat

#: More windows are drawn while the gain is within this many standard errors of the threshold
#: (:data:`CHOICE_Z` standard errors): at 64 windows four of history_cv's five validation
#: products were (0.06 / 1.2 / 1.4 / 1.2 standard errors); with the windows this draws
#: (128 / 128 / 256 / 256 / 64) all five end 1.4 or more from zero, on the side the fills say.
CHOICE_MARGIN = 1.0
#: At most this many times the first draw's windows are drawn (128 of 32; about 0.2 s a window on
#: one thread for a 150k-cell scene, so a close call costs at most about 20 s more there).
CHOICE_MORE = 4
#: The scene's nugget replaces the network's own (the one the weights were trained with) only when it
#: lowers mean CRPS on the hidden cells by more than this many standard errors (clustered by window).
#: Chosen on history_cv's validation split (bundled small weights, 64 windows): the gains were
#: 0.06 / 1.2 / 1.4 / 1.2 / -1.5 standard errors (Alboran / OLCI / Sentinel-2 / Alaska / soil
#: moisture) where the fills say the scene's nugget loses / wins / wins / wins / loses; one standard
#: error takes all five the fills' way, two none (the network's everywhere), zero Alboran's wrongly.
CHOICE_Z = 1.0
#: History folds of the check's own windows (their covariates computed without the cells hidden),
#: one DINEOF of the whole stack each: one fold hides cells in every step. Three (calibration's count)
#: cost the hourly ERA5 cube's check 60 s of a 264 s profile on 2 cores; one changed the fill of two of
#: the suite's 31 validation scenes, within 1.3% (suite_decisions.md, ``check1``).
CHECK_FOLDS = 1


#: A field whose variogram puts the nugget under this share of the variance at every step is taken at
#: its word without the check: the scene's nugget (near zero, kriging exact at the data). On the scene
#: suite's 48 scenes the fitted shares were either at most 0.0001 or at least 0.0015; on the 14
#: validation scenes at most 0.0001 the check's two CRPS figures were within 0.33%, the scene's
#: ahead by up to 0.33% and the network's by at most 0.02% (suite_decisions.md, ``smooth``).
SMOOTH_SHARE = 1e-3


class NothingToHide(Exception):
    """The input has too few observed cells to draw a window from (the network's own nugget then)."""


def takes_nugget(model: NeuralProcess | None) -> bool:
    """Whether ``model`` reads its last covariate as its kriging head's nugget share."""
    return bool(getattr(model, "kriging_nugget_input", False))


@torch.no_grad()
def paired_window_crps(draw: Callable[[], Any], predict: Callable[[Any], tuple[torch.Tensor, torch.Tensor, list]],
                       windows: int, first: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CRPS (in each window's standardised units) of every hidden cell of ``windows`` windows, two
    ways: ``(candidate [n], default [n], window of each cell [n])``, windows numbered from ``first``.

    ``draw()`` draws :data:`geonp.fill.calibrate.BATCH` windows (a ValueError from it, a source
    with too few observed cells to hide any, becomes :class:`NothingToHide`); ``predict(drawn)``
    gives their truths ``yt [B, Nt, 1]``, target mask ``[B, Nt]`` and the two predictive
    distributions ``[candidate, default]``, each ``[B, Nt, 1]``."""
    candidate, default, window = [], [], []
    for i in range(first // BATCH, first // BATCH + max(1, windows // BATCH)):
        try:
            drawn = draw()
        except ValueError as err:  # FieldWindows: too few observed cells to hide any
            raise NothingToHide(str(err)) from None
        yt, mask_t, dists = predict(drawn)
        keep = mask_t.cpu().numpy()  # [B, Nt]
        window.append(np.broadcast_to(i * BATCH + np.arange(keep.shape[0])[:, None], keep.shape)[keep])
        truth = yt[..., 0].cpu().numpy()[keep]
        for dist, out in zip(dists, (candidate, default)):
            out.append(crps_normal(truth, dist.loc[..., 0].float().cpu().numpy()[keep],
                                   dist.scale[..., 0].float().cpu().numpy()[keep]))
    return np.concatenate(candidate), np.concatenate(default), np.concatenate(window)


def paired_crps(model: NeuralProcess, source, device: torch.device | str, windows: int,
                first: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CRPS (in each window's standardised units) of every hidden cell of ``windows`` windows
    (in batches of :data:`geonp.fill.calibrate.BATCH`) drawn by ``source``, ``(scene's nugget [n], network's own [n],
    window of each cell [n])``: the same cells both ways, windows numbered from ``first``.
    :class:`NothingToHide` when ``source`` can draw no window."""
    def predict(b):  # both options from one pass of the transformer: only the kriging head reads the nugget
        return b.yt, b.mask_t, model.predict_per_nugget(b.xc, b.yc, b.xt, b.mask_c, b.mask_t, [None, OWN_NUGGET])

    return paired_window_crps(lambda: source.sample(BATCH).to(device), predict, windows, first)


def paired_gain(candidate: np.ndarray, default: np.ndarray, window: np.ndarray) -> tuple[float, float]:
    """How much lower ``candidate`` makes mean CRPS than ``default``, ``default - candidate`` over
    the same cells ``[n]``, and its standard error, clustered by ``window [n]`` (cells of one
    window share their context, so they are not independent), with the usual ``G / (G - 1)``
    small-sample factor for ``G`` windows; infinite with fewer than two windows (nothing to tell)."""
    diff = default - candidate
    gain = float(diff.mean())
    groups = np.unique(window, return_inverse=True)[1]
    count = int(groups.max()) + 1 if groups.size else 0
    if count < 2:
        return gain, float("inf")
    totals = np.bincount(groups, weights=diff - gain)  # per window
    return gain, float(np.sqrt(np.square(totals).sum() * count / (count - 1)) / diff.size)


def settled_crps(score: Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]],
                 windows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``score(windows, first)`` (``(candidate, default, window)`` CRPS per hidden cell of
    ``windows`` windows numbered from ``first``, as :func:`paired_crps`) on ``windows`` windows,
    then on as many again as have been scored while the candidate's gain (:func:`paired_gain`) is
    within :data:`CHOICE_MARGIN` standard errors of the threshold (:data:`CHOICE_Z` standard
    errors) and fewer than :data:`CHOICE_MORE` times the first draw have been scored. A later
    draw that finds no window to hide ends it with what the earlier ones scored."""
    candidate, default, window = score(windows, 0)
    drawn = windows
    while drawn < CHOICE_MORE * windows:
        gain, error = paired_gain(candidate, default, window)
        if not abs(gain - CHOICE_Z * error) < CHOICE_MARGIN * error:
            break
        try:
            more = score(drawn, drawn)
        except NothingToHide:  # windows are drawn at random: a later draw can come up empty
            break
        candidate, default, window = (np.concatenate(pair) for pair in zip((candidate, default, window), more))
        drawn *= 2
    return candidate, default, window


def choose_nugget(model: NeuralProcess, fields: list[Field], spec, device: torch.device | str, choice: str = "auto",
                  seed: int = 0, elevation: np.ndarray | None = None, covariates: list[str] | None = None,
                  say: Callable[[str], None] | None = None,
                  windows: int | None = None) -> tuple[str, list[str]]:
    """Set each field's nugget map (the last of ``field.history``) to the nugget ``choice`` gives
    (:data:`NUGGET_CHOICES`; ``auto``: the scene's where its variogram finds no nugget at any step
    (:data:`SMOOTH_SHARE`) or where it lowers CRPS on the field's own hidden cells by more than
    :data:`CHOICE_Z` standard errors, else the network's own). Returns a few
    words per field on what was chosen and why (for provenance) and the labels of the fields that
    got the network's own (:func:`use_network_nugget` repeats the choice on a resumed run).

    ``model`` must take the nugget (:func:`takes_nugget`); ``covariates`` are the names of its
    history covariates (the folds' windows need them); ``windows``: the first draw of the check
    (:func:`settled_crps`; ``FillOptions.check_windows``, None: :data:`NUGGET_CHECK_WINDOWS`). A
    field whose nugget map is flat (no step could be fitted) keeps the network's own.
    """
    if choice not in NUGGET_CHOICES:
        raise ValueError(f"--nugget must be one of {', '.join(NUGGET_CHOICES)}, got {choice!r}")
    windows = windows or NUGGET_CHECK_WINDOWS
    said = []
    for f in fields:
        if f.history is None:
            continue
        if is_flat(f.history[-1]) or float(f.history[-1].flat[0]) < 0:  # flat, or no step could be fitted
            _use_own(f)
            said.append(f"{f.label}: the network's (no step's variogram)")
            continue
        if choice != "auto":
            if choice == "model":
                _use_own(f)
            said.append(f"{f.label}: {'the scene' if choice == 'scene' else 'the network'}'s (asked)")
            continue
        if float(np.max(f.history[-1])) < SMOOTH_SHARE:
            said.append(f"{f.label}: the scene's (its variogram's nugget under {SMOOTH_SHARE:.1%} of the variance "
                        "at every step: smooth at the grid's scale, nothing to check)")
            if say:
                say(f"{f.label}: noise level (nugget) measured on the scene: none at the grid's scale")
            continue
        with own_cell_windows([f], spec, seed, seed + 15485863, model.dim_x, elevation, covariates,
                              folds=CHECK_FOLDS, device=device) as source:
            try:
                scene, own, window = settled_crps(lambda n, first: paired_crps(model, source, device, n, first),
                                                  windows)
            except NothingToHide:
                scene = own = window = np.zeros(0)
        if not scene.size:
            _use_own(f)
            said.append(f"{f.label}: the network's (no cell to hide)")
            continue
        gain, error = paired_gain(scene, own, window)
        # Both CRPS figures named: "the network's (CRPS ... against the network's ...)" read as a
        # comparison of the network with itself.
        why = (f"CRPS with the scene's nugget {scene.mean():.4g} against the network's {own.mean():.4g} "
               f"on {scene.size} hidden cells "
               f"of {np.unique(window).size} windows, "
               f"difference {gain:.2g} +- {error:.2g}")
        scenes = gain > CHOICE_Z * error
        if not scenes:
            _use_own(f)
        said.append(f"{f.label}: the {'scene' if scenes else 'network'}'s ({why})")
        if say:  # the figures stay in the output's geonp_nugget attribute (geonp infill -v prints them)
            say(f"{f.label}: noise level (nugget) {'measured on the scene' if scenes else 'as trained'}, "
                f"checked on {scene.size} of the scene's own cells")
    network = [f.label for f in fields if f.history is not None and float(f.history[-1].flat[0]) == OWN_NUGGET]
    return "; ".join(said), network


def use_network_nugget(fields: list[Field], labels: list[str]) -> None:
    """Give the fields named ``labels`` the network's own nugget, as an earlier choice did."""
    for f in fields:
        if f.history is not None and f.label in labels:
            _use_own(f)


def _use_own(f: Field) -> None:
    """``f``'s nugget map set to the network's own (its other covariate maps untouched)."""
    if is_flat(f.history):  # one number per map: stays a view, whatever the field's size
        values = [float(m.flat[0]) for m in f.history]
        f.set_history(flat_covariates(len(values), f.shape, values[:-1] + [OWN_NUGGET]))
        return
    history = f.history if f.history.flags.writeable else np.array(f.history, np.float32)
    history[-1] = OWN_NUGGET
    f.set_history(history)
