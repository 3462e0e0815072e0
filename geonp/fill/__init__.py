"""Gap filling of gridded cubes: windows, model choice, block filling, the CF Zarr output.

``geonp.infill(ds, model=...)`` (in memory) and ``geonp infill INPUT -o OUT.zarr`` (resumable
store) are the entry points (:mod:`geonp.fill.engine`). A run is planned and checked first
(:mod:`~geonp.fill.plan`), its model fine-tuned and calibrated on the cube (:mod:`~geonp.fill.prepare`),
then its blocks filled (:mod:`~geonp.fill.blocks`), one after another or on dask
(:mod:`~geonp.fill.runners`), into the CF output (:mod:`~geonp.fill.output`).
"""

#: ``--fit-steps`` / ``fit_steps`` default, the same for the CLI, ``geonp.infill`` and the demo:
#: Adam steps of self-supervised fine-tuning on the input's own observed cells before filling
#: (``python -m pipelines.experiments.finetune_curve``; on the validation crops 30 steps at 1e-4 lowered the
#: bundled te-pt-tnp's RMSE by 1.5% on Alboran SST and 1.9% on OLCI chlorophyll in about a minute
#: on one thread; 3e-4 gained 3.9% and 3.0% there but left the demo's RMSE at 0.690 against
#: kriging's 0.689, where 1e-4 gives 0.686; 100 steps gain more but cost the demo's budget: on the
#: history benchmark, pipelines.benchmarks.history_cv, 100 steps lowered CRPS by 1.0% on both splits).
FIT_STEPS = 30
#: Learning rate of that fine-tuning.
FIT_LR = 1e-4
#: Share of fine-tuning windows whose clouds span the whole view, halo included
#: (``training_window``'s ``wide_clouds``).
FIT_WIDE_CLOUDS = 0.0
#: Share of fine-tuning windows whose hidden cells copy the input's own gap pattern from another
#: place (or day) of the cube (``FieldWindows``' ``own_gaps``), so fine-tuning practises on gaps
#: as wide as the ones it will fill. Chosen on the 9 validation crops by a rule fixed before the
#: run (``pipelines/results/finetune_own_gaps_*.md``): CRPS within 0.07% of plain fine-tuning on
#: average, 90% coverage nearer 0.90 (mean distance 0.011 against 0.015).
FIT_OWN_GAPS = 0.5
#: For a model with history covariates: how many folds of each field's stack fine-tuning hides
#: (:func:`geonp.tasks.history.history_folds`: the windows' targets are cells the covariates were
#: computed without, as the bundled weights were trained). 0: fine-tuning hides cells as for any
#: model. Chosen on history_cv's validation split: with 3 folds the mean CRPS ratio to the best of
#: kriging and dineof was 0.8613 against 0.8466 without (Alaska NDVI's sigma too wide, 90%
#: coverage 0.96), so fold fine-tuning stays an option.
FIT_HISTORY_FOLDS = 0
#: ``--calibrate-sigma`` / ``calibrate_sigma`` default: scale sigma per distance to the nearest
#: observation so that the input's own cells, hidden under its own gap patterns, get 90% coverage
#: (:mod:`geonp.fill.calibrate`). Off: on history_cv's validation split (bundled weights, 30 fit
#: steps) it brought the mean distance of 90% coverage from 0.90 over the distance bins from 0.034
#: to 0.030 (one cell from an observation 0.82-0.92 -> 0.90-0.94) but raised CRPS by 0.9% (the
#: geometric mean over the five products, the rule variants are chosen by). Test split, reported
#: once: bins within 0.85-0.95 went from 9 to 16 of 23, CRPS +0.2% to +4.3%. Measured again
#: with the weights and drift as shipped (``dineof-spread``, row ``shipped-calibrated``): validation
#: CRPS +0.9%, bins in range 16 -> 20 of 23; test CRPS +1.3% (-0.2% to +3.8% by product), bins
#: 9 -> 15 of 23, one cell from an observation 0.73-0.89 -> 0.86-0.95 on every product. What
#: limits it is the scale the scene's windows estimate, not the normal's shape
#: (``python -m pipelines.experiments.sigma_shape``): the best scale per bin, fitted on the hidden
#: cells themselves, would lower CRPS by 0.69% (validation) and 0.89% (test) and put 21 of 23 bins
#: in range on both, a Student-t little better; the windows miss how a clouded day departs from
#: its neighbours (Alboran beyond 12 cells, test: 0.63 as shipped and with the windows' scale,
#: 0.95 with the best). Scales fitted on the filled days themselves, their cells hidden once more,
#: came closest on test (by coverage: -0.52%, 17 of 23 bins) but not on validation (+0.48%, 15 of
#: 23 against 16), where variants are chosen; pooled with the windows' they won on both (by CRPS
#: -0.19% / -0.62%, 18 / 14 bins), but only while the refill hid the scored days alone: refilling
#: every gappy step, as infill must, lost on validation (+1.6% to +1.9%; docs/results/history_cv_test.md).
#: Still off, by the rule.
CALIBRATE_SIGMA = False
#: ``--nugget`` / ``nugget`` values, for weights whose kriging head takes the scene's nugget
#: (:mod:`geonp.fill.nugget`): choose per field on the input's own hidden cells (default), always the
#: scene's fitted share, always the network's own.
NUGGET_CHOICES = ("auto", "scene", "model")
