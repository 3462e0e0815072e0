"""ConvCNP in the infill engine: windows go through its grid path, which agrees with its point path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import smooth_cube

import geonp
from geonp.fill import predictor
from geonp.models import build, save
from geonp.tasks.training import training_window
from geonp.tasks.windows import WindowSpec

# The grid matches the window scaling: 1 step per unit in time, 8 cells per unit in space.
WINDOW_CONVCNP = {"points_per_unit": [1, 8, 8], "downsample": [False, True, True], "kernel_size": [3, 5, 5]}


def convcnp(dim_x: int = 3):
    torch.manual_seed(0)
    return build("convcnp", dim_x, 1, preset="tiny", **WINDOW_CONVCNP).eval()


def windows(n: int = 3, elevation: bool = False):
    rng = np.random.default_rng(0)
    t, r, c = np.meshgrid(np.arange(5), np.arange(60), np.arange(60), indexing="ij")
    values = np.sin(r / 6.0) + np.cos(c / 9.0) + 0.1 * t
    values[rng.random(values.shape) < 0.2] = np.nan
    elev = rng.uniform(0, 2000, (60, 60)) if elevation else None
    spec, tasks = WindowSpec(), []
    while len(tasks) < n:
        task = training_window(values, np.ones(values.shape, bool), spec, rng, 1.0, elev)
        if task is not None:
            tasks.append(task)
    return tasks


@pytest.mark.parametrize("elevation", [False, True])
def test_grid_path_agrees_with_point_path_on_windows(elevation, monkeypatch):
    model, tasks = convcnp(4 if elevation else 3), windows(elevation=elevation)
    assert predictor._predict_gridded(model, tasks, "cpu", 4) is not None  # the grid path is taken
    gridded = predictor.predict_windows(model, tasks, batch_size=4)
    monkeypatch.setattr(type(model), "supports_gridded", False)
    pointwise = predictor.predict_windows(model, tasks, batch_size=4)
    for (m1, s1), (m2, s2) in zip(gridded, pointwise):
        np.testing.assert_allclose(m1, m2, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(s1, s2, rtol=1e-4, atol=1e-4)


def test_off_lattice_windows_fall_back_to_the_point_path():
    model = build("convcnp", 3, 1, preset="tiny")  # 16 points per unit in time: windows are off its lattice
    tasks = windows(2)
    tasks[0].xt[:, 0] += 0.5 / 16  # half a grid step
    assert predictor._predict_gridded(model, tasks, "cpu", 4) is None
    assert all(np.isfinite(m).all() for m, _ in predictor.predict_windows(model, tasks))


def test_infill_with_a_convcnp_checkpoint(tmp_path):
    path = tmp_path / "convcnp.safetensors"
    save(convcnp(), path, extra={"infill": {"cells_per_unit": 8.0, "window": {"max_context": 300}}})
    ds = smooth_cube()
    out = geonp.infill(ds, "sst", model="convcnp", checkpoint=str(path), fit_steps=0)
    assert "'max_context': 300" in out.attrs["geonp_window"]  # the training windows' context cap
    hole = out["sst_flag"].values == 1
    assert hole.any() and np.isfinite(out["sst"].values[hole]).all() and (out["sst_std"].values[hole] > 0).all()
    observed = out["sst_flag"].values == 0
    np.testing.assert_array_equal(out["sst"].values[observed], ds["sst"].values[observed])
