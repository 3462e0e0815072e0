"""Gap filling of gridded cubes: windows, model choice, block filling, the CF Zarr output.

``geonp.infill(ds, model=...)`` (in memory) and ``geonp infill INPUT -o OUT.zarr`` (resumable
store) are the entry points; see :mod:`geonp.fill.engine`.
"""

#: ``--fit-steps`` / ``fit_steps`` default, the same for the CLI, ``geonp.infill`` and the demo:
#: Adam steps of self-supervised fine-tuning on the input's own observed cells before filling
#: (measured against steps and learning rate in ``pipelines/results/finetune_curve.md``).
FIT_STEPS = 30
#: Learning rate of that fine-tuning.
FIT_LR = 1e-4
