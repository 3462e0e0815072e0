"""Tasks: the one task encoding, between the data floor (I/O) and the models.

A cube becomes neural-process tasks in one way, for training, fine-tuning and infill alike:
grid-unit windows with per-window standardisation whose scaling the checkpoint records
(:mod:`~geonp.tasks.windows`), self-supervised training windows (:mod:`~geonp.tasks.training`),
far context beyond a window's halo (:mod:`~geonp.tasks.far_context`),
cloud-shaped gaps and the one function that borrows them from other steps
(:mod:`~geonp.tasks.clouds`), the cells an evaluation hides (:mod:`~geonp.tasks.hidden`),
history covariates of a stack (:mod:`~geonp.tasks.history`, :mod:`~geonp.tasks.dineof` and its
iterations :mod:`~geonp.tasks.eofs`,
:mod:`~geonp.tasks.cell_history`, :mod:`~geonp.tasks.analogs`) and a step's large scale (:mod:`~geonp.tasks.coarse`),
synthetic fields and generators (:mod:`~geonp.tasks.synthetic`), the ``Batch`` every model
takes (:mod:`~geonp.tasks.batch`) and the task sources ``geonp train`` draws from
(:mod:`~geonp.tasks.sources`, :mod:`~geonp.tasks.window_source`).
"""

from geonp.tasks.batch import Batch
from geonp.tasks.windows import WindowSpec

__all__ = ["Batch", "WindowSpec"]
