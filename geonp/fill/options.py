"""How a fill is made, as data: :class:`FillOptions`, with :class:`FitOptions` inside it.

The command line, ``geonp.infill`` and the ``.geonp`` accessor build one ``FillOptions`` and pass
it explicitly to planning (:func:`geonp.fill.plan.plan`), preparation (nugget choice,
fine-tuning, calibration) and the blocks; the store records it (``geonp_options``), and a resumed
run must ask for the same. Nothing in :mod:`geonp.fill` reads a module-level setting at run time:
a test or a benchmark that wants another fine-tuning rate builds other options.

The defaults are the choices measured; why each is what it is stays beside its field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

#: ``--nugget`` values, for weights whose kriging head takes the scene's nugget
#: (:mod:`geonp.fill.nugget`): choose per field on the input's own hidden cells (default), always the
#: scene's fitted share, always the network's own.
NUGGET_CHOICES = ("auto", "scene", "model")
#: ``--history`` choices (:mod:`geonp.fill.history_check`): check it per field, always use it, never.
HISTORY_CHOICES = ("auto", "use", "none")
#: What fine-tuning may change (``FitOptions.scope``): every weight, all but the first layer and
#: what comes before it, or the head's alone.
FIT_SCOPES = ("all", "upper", "head")


#: The nugget check's first draw of windows (``FillOptions.check_windows`` None).
NUGGET_CHECK_WINDOWS = 32
#: The windows ``--calibrate-sigma`` scales sigma on and ``--history auto`` scores first.
CHECK_WINDOWS = 64

@dataclass(frozen=True)
class FitOptions:
    """Self-supervised fine-tuning on the input's own observed cells before filling
    (:func:`geonp.fill.finetune.finetune`).

    Attributes:
        steps: ``--fit-steps``: Adam steps (0: no fine-tuning). 30, the same for the CLI,
            ``geonp.infill``, ``geonp evaluate`` and the demo: on the validation crops 30 steps at
            1e-4 lowered the bundled te-pt-tnp's RMSE by 1.5% on Alboran SST and 1.9% on OLCI
            chlorophyll in about a minute on one thread (``python -m
            pipelines.experiments.finetune_curve``); on the scene suite 0 steps was worse
            (RMSE x1.0027, CRPS x1.0331, ``pipelines/results/suite_decisions.md``).
        lr: the learning rate (1e-4; 3e-4 gained more on two crops but lost on the demo).
        batch_size: windows per step. 4 since 2026-11-29 (8 before): half of fine-tuning's
            time, the same accuracy on the scene suite's validation split (RMSE x1.0000 [0.9960,
            1.0045], CRPS x1.0001 [0.9933, 1.0060], no scene worse beyond its noise once
            fine-tuning's own seed-to-seed spread is counted: ``pipelines.suite_rule --cut``,
            row ``b4`` in ``pipelines/results/suite_decisions.md``).
        wide_clouds: share of windows whose clouds span the whole view, halo included
            (``training_window``'s ``wide_clouds``).
        own_gaps: share of windows whose hidden cells copy the input's own gap pattern from
            another place (or day) of the cube, so fine-tuning practises on gaps as wide as the
            ones it will fill. 0.5, chosen on the 9 validation crops by a rule fixed before the
            run (``pipelines/results/finetune_own_gaps_*.md``): CRPS within 0.07% of plain
            fine-tuning, 90% coverage nearer 0.90 (mean distance 0.011 against 0.015).
        history_folds: for a model with history covariates, how many folds of each field's
            stack fine-tuning hides (:func:`geonp.tasks.history.history_folds`); 0: windows hide
            cells as for any model. Off: on history_cv's validation split 3 folds gave a mean CRPS
            ratio to the best of kriging and dineof of 0.8613 against 0.8466 without; on the
            suite's validation split (row ``folds3``) CRPS x1.027 [0.985, 1.100]: better calibrated
            on soil moisture (c3s_sm#0 90% coverage 0.62 -> 0.80), far too wide on two gap-free
            stacks under one cloud mask (ersst#0 CRPS x2.43, era5land_iberia_t2m#0 x1.24), whose
            folds then hid the same place in every step (calibration windows on ersst#0 wanted
            sigma x6.8 at distance 1 against 0.89 at the fill's own cells). With folds that move a
            repeated donor's gaps (since bc9bac8) the widening is gone (ersst#0 CRPS x1.000) and
            coverage is in range in 76 of 120 distance bins against the shipped row's 69, but the
            rule still rejects it: RMSE x0.9944 [0.9816, 1.0041], CRPS x0.9924 [0.9784, 1.0028],
            ersst#0 RMSE x1.021 [1.002, 1.045].
        scope: which weights fine-tuning changes (:data:`FIT_SCOPES`): ``"all"``; ``"upper"``, all
            but the token embedding and the encoder's first layer (:func:`geonp.fill.finetune.
            upper_parameters`), so that a step's backward pass stops before that layer (the demo's
            fill 18.6-18.7 s against 20.9-21.5 s; rejected on the suite's validation split, row
            ``upper``: RMSE x0.9983 [0.9932, 1.0026], five scenes worse beyond their noise,
            era5_uk_t2m#0 CRPS x1.049); or
            ``"head"``, the parts after the encoder (:data:`geonp.fill.finetune.HEAD_MODULES`: the
            kriging head, the decoder, the likelihood), the encoder frozen, so that a step runs no
            backward pass through the attention (about a fifth of an ``"all"`` step's time on the demo).
    """

    steps: int = 30
    lr: float = 1e-4
    batch_size: int = 4
    wide_clouds: float = 0.0
    own_gaps: float = 0.5
    history_folds: int = 0
    scope: str = "all"

    def __post_init__(self) -> None:
        if int(self.steps) < 0:
            raise ValueError(f"--fit-steps must be >= 0, got {self.steps}")
        if not self.lr > 0:
            raise ValueError(f"fit lr must be > 0, got {self.lr}")
        if int(self.batch_size) < 1:
            raise ValueError(f"fit batch_size must be >= 1, got {self.batch_size}")
        for name in ("wide_clouds", "own_gaps"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"fit {name} must be a share in [0, 1], got {getattr(self, name)}")
        if int(self.history_folds) < 0:
            raise ValueError(f"fit history_folds must be >= 0, got {self.history_folds}")
        if self.scope not in FIT_SCOPES:
            raise ValueError(f"fit scope must be one of {', '.join(FIT_SCOPES)}, got {self.scope!r}")


@dataclass(frozen=True)
class FillOptions:
    """Everything about how a fill is made that is not the input itself.

    Attributes:
        fit: fine-tuning on the input (:class:`FitOptions`).
        calibrate_sigma: ``--calibrate-sigma``: scale sigma per distance to the nearest
            observation so that the input's own cells, hidden under its own gap patterns, get 90%
            coverage (:mod:`geonp.fill.calibrate`). Off: on history_cv's validation split it brought
            more distance bins into 0.85-0.95 (16 -> 20 of 23) but raised CRPS by 0.9%, and the
            rule chooses by CRPS (docs/results/history_cv_test.md).
        nugget: ``--nugget``, one of :data:`NUGGET_CHOICES`.
        history: ``--history``, one of :data:`HISTORY_CHOICES`: for a model with history
            covariates, whether each field's history is used (``use``), never used (``none``, flat
            maps as for one scene) or used only where the field's own hidden cells say it helps
            (``auto``, :mod:`geonp.fill.history_check`).
        check_windows: ``--check-windows``: windows of the input's own observed cells (each hides
            100-400 of them under gap shapes the input has) that the nugget check scores first (up
            to four times as many on a close call, :mod:`geonp.fill.nugget`), that ``--history
            auto`` scores first and that ``--calibrate-sigma`` scales sigma on. None: each check's
            own, as the suite judged it: :data:`NUGGET_CHECK_WINDOWS` (32) for the nugget check
            (on history_cv's five validation products 64 windows, doubled while the call was
            close, took every nugget choice the way the fills went; on the scene suite a first
            draw of 32 chose the same nugget on 29 of 31 validation scenes, no scene worse, 8%
            less time: ``suite_decisions.md``, ``cw32``), :data:`CHECK_WINDOWS` (64) for the others.
        batch_size: windows per model call.
        max_history_cells: the largest field (time x rows x cols cells) whose history covariates
            and DINEOF fill are computed, in memory (float64); a larger field gets flat covariates,
            and ``--model dineof`` refuses it.
        samples: ``--samples``: coherent samples of the fill to add as ``VAR_sample`` (0: none;
            :mod:`geonp.fill.samples`).
        seed: the run's random seed (fine-tuning windows, the nugget check, DINEOF, the samples).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        threads: CPU threads, at most the machine's CPUs (None: the cores this process may use,
            :func:`geonp.threads.usable_cores`).
        window: cells each window predicts, ``(T, R, C)``, ``"T,R,C"`` or a
            :class:`~geonp.tasks.windows.WindowSpec` (None: fitted to the cube).
    """

    fit: FitOptions = field(default_factory=FitOptions)
    calibrate_sigma: bool = False
    nugget: str = "auto"
    history: str = "use"
    check_windows: int | None = None
    samples: int = 0
    # The tasks layer's MAX_HISTORY_CELLS (geonp.tasks.covariate_maps), written out: importing the
    # tasks package loads torch, and the command line reads these defaults before any heavy import.
    max_history_cells: int = 50_000_000
    batch_size: int = 16
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    window: Any = None

    def __post_init__(self) -> None:
        if self.nugget not in NUGGET_CHOICES:
            raise ValueError(f"--nugget must be one of {', '.join(NUGGET_CHOICES)}, got {self.nugget!r}")
        if self.history not in HISTORY_CHOICES:
            raise ValueError(f"--history must be one of {', '.join(HISTORY_CHOICES)}, got {self.history!r}")
        if int(self.batch_size) < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")
        if int(self.max_history_cells) < 1:
            raise ValueError(f"max_history_cells must be >= 1, got {self.max_history_cells}")
        if int(self.samples) < 0:
            raise ValueError(f"--samples must be >= 0, got {self.samples}")
        if self.check_windows is not None and int(self.check_windows) < 1:
            raise ValueError(f"--check-windows must be >= 1, got {self.check_windows}")
        if self.threads is not None and int(self.threads) < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        cpus = os.cpu_count() or 1
        if self.threads is not None and int(self.threads) > cpus:  # more only contend (issue 54)
            raise ValueError(f"--threads {self.threads}: this machine has {cpus} CPUs; give at most {cpus}")
        if int(self.seed) < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")

    @classmethod
    def from_keywords(cls, fit_steps: int | None = None, calibrate_sigma: bool | None = None,
                      fit: FitOptions | None = None, **keywords: Any) -> FillOptions:
        """Options from ``geonp.infill``'s keywords.

        Args:
            fit_steps: fine-tuning steps (None: ``fit``'s, by default 30).
            calibrate_sigma: scale sigma on the input's own cells (None: off).
            fit: fine-tuning options to start from (None: :class:`FitOptions`' defaults).
            keywords: the other fields by name (``nugget``, ``history``, ``check_windows``, ``samples``,
                ``max_history_cells``, ``batch_size``,
                ``seed``, ``device``, ``threads``, ``window``); a None value keeps the default.

        Returns:
            The options.

        Raises:
            ValueError: an unknown keyword (one line naming it), or a bad value.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise ValueError(f"unknown infill option {unknown[0]!r}; options: fit_steps, calibrate_sigma, "
                             f"{', '.join(sorted(known - {'fit', 'calibrate_sigma'}))}, and checkpoint, "
                             "valid_mask, elevation for the input")
        fit = fit if fit is not None else FitOptions()
        if fit_steps is not None:
            fit = dataclasses.replace(fit, steps=int(fit_steps))
        given = {k: v for k, v in keywords.items() if v is not None}
        if calibrate_sigma is not None:
            given["calibrate_sigma"] = bool(calibrate_sigma)
        return cls(fit=fit, **given)

    def record(self) -> dict[str, Any]:
        """What a resumed run must repeat to write the same store (not where or how fast it runs).

        Returns:
            ``{"fit": {...}, "calibrate_sigma", "nugget", "history", "check_windows", "samples",
            "max_history_cells", "seed", "window"}``,
            JSON-serialisable.
        """
        window = self.window.as_dict() if hasattr(self.window, "as_dict") else self.window
        return {"fit": dataclasses.asdict(self.fit), "calibrate_sigma": self.calibrate_sigma, "nugget": self.nugget,
                "history": self.history, "check_windows": self.check_windows, "samples": self.samples,
                "max_history_cells": self.max_history_cells, "seed": self.seed,
                "window": list(window) if isinstance(window, tuple) else window}

    def describe(self) -> str:
        """One line for the store's provenance.

        Returns:
            :meth:`record` with ``batch_size``, ``device`` and ``threads``, as JSON (the store's
            ``geonp_options`` attribute).
        """
        return json.dumps({**self.record(), "batch_size": self.batch_size, "device": self.device,
                           "threads": self.threads}, sort_keys=True)
