"""A neural process's own joint sampling, coarse to fine, as a sampler ``samples_check`` can score
against geonp's conditional simulation (issue 55, item 2):

    python -m pipelines.experiments.samples_check --split validation --models te-pt-tnp \
        --scenes modis_lst_brazil#2 olci_chl#0 --samples 8 --variants scene sequential \
        --out pipelines/results/samples_sequential_validation

A neural process predicts each target on its own; its joint predictive is sampled by drawing some
targets, adding them to the context, and predicting the rest given them (the TNP and TE-TNP
papers' autoregressive sampling). Here in whole fills of the scene, coarse to fine: a sample draws
the gap cells of a lattice of stride 4 (random offset) from the fill, each on its own (they lie 4
cells apart), fills again with them as observations, draws the cells of a stride-2 lattice, fills
again and draws the rest. Every cell is then drawn from a predictive that has seen the cells drawn
before it within its window; a sample costs two fills beyond the first, which all samples share.
The later fills skip fine-tuning (``REFIT_STEPS``): with it a sample would cost two fine-tunings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from geonp.fill.output import FLAG_INFILLED, SAMPLE_DIM

#: Lattice strides drawn before the last stage (which draws every cell left).
STRIDES = (4, 2)
#: Fine-tuning steps of the fills after the first (0: the weights as shipped).
REFIT_STEPS = 0


def sequential_samples(fill: xr.Dataset, data: xr.Dataset, name: str, model: str, n: int, seed: int,
                       infill_kwargs: dict[str, Any]) -> xr.Dataset:
    """``fill`` (``name``, ``name_std``, ``name_flag`` of ``data[name]``, the model's fill with
    ``infill_kwargs``) with ``name_sample [sample, *dims]``: ``n`` samples drawn coarse to fine, each
    stage a fill of ``data`` with the cells drawn so far as observations (module docstring)."""
    from geonp.fill.engine import infill

    da = data[name]
    first = fill[name].values.astype(np.float64), fill[f"{name}_std"].values.astype(np.float64)
    gaps = (fill[f"{name}_flag"].values == FLAG_INFILLED) & np.isfinite(first[0]) & np.isfinite(first[1])
    rows, cols = np.indices(da.shape[-2:])
    rng = np.random.default_rng([seed, 15332])
    again = {**infill_kwargs, "fit_steps": REFIT_STEPS}
    drawn = []
    for _ in range(n):
        given = da.values.astype(np.float64)
        (mean, std), left = first, gaps.copy()
        for stride in (*STRIDES, 1):
            r0, c0 = rng.integers(0, stride, 2)
            on = left & (rows % stride == r0) & (cols % stride == c0)  # [R, C] broadcast over leading dims
            given[on] = mean[on] + std[on] * rng.standard_normal(int(on.sum()))
            left &= ~on
            if stride > 1:
                out = infill(data.assign({name: da.copy(data=given)}), name, model, seed=seed, **again)
                mean, std = (out[v].values.astype(np.float64) for v in (name, f"{name}_std"))
        drawn.append(given)
    return fill.assign({f"{name}_sample": ((SAMPLE_DIM, *da.dims), np.stack(drawn))})
