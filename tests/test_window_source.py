"""Training windows: real clouds from another day, and the training-field entries
(satellite QC, parts of a field by index or region, excluded boxes, daily files joined along
time, elevation from a DEM)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from conftest import real_file

from geonp.tasks.real_fields import load_field, prepare_fields
from geonp.tasks.training import training_window
from geonp.tasks.window_source import WindowSource
from geonp.tasks.windows import WindowSpec


def _history(t: int = 6, r: int = 40, c: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """A field whose step ``k`` misses every column ``c`` with ``(c + 3k) % 8 < 3``: each step's
    gaps are whole columns, and any other step's gaps hide some of its observed columns."""
    rr, cc = np.meshgrid(np.arange(r), np.arange(c), indexing="ij")
    values = np.stack([np.sin(rr / 6) + np.cos(cc / 9) + 0.1 * k for k in range(t)]).astype(np.float64)
    for k in range(t):
        values[k, :, (np.arange(c) + 3 * k) % 8 < 3] = np.nan
    return values, np.ones(values.shape, bool)


def test_real_clouds_are_another_steps_gaps():
    values, valid = _history()
    spec = WindowSpec(core=(1, 16, 16), overlap=(0, 4, 4), halo=(2, 6, 6))
    rng = np.random.default_rng(0)
    seen = 0
    for _ in range(40):
        task = training_window(values, valid, spec, rng, 1.0, real_clouds=1.0)
        if task is None:
            continue
        # Targets sit on one step, in whole columns of the prediction region (20 rows): the
        # donor's gap pattern, never a smooth synthetic blob.
        assert np.ptp(task.xt[:, 0]) == 0
        cols = np.unique(task.xt[:, 2])
        assert all(np.sum(task.xt[:, 2] == c) == 20 for c in cols)
        # The rest of the history is context: other steps are present.
        assert np.unique(task.xc[:, 0]).size > 1
        seen += 1
    assert seen > 10


def test_without_real_clouds_the_stream_is_unchanged():
    values, valid = _history()
    spec = WindowSpec()
    a = training_window(values, valid, spec, np.random.default_rng(5), 1.0)
    b = training_window(values, valid, spec, np.random.default_rng(5), 1.0, real_clouds=0.0)
    np.testing.assert_array_equal(a.xt, b.xt)
    np.testing.assert_array_equal(a.yc, b.yc)


def test_wide_clouds_also_hide_the_halo_and_score_only_the_region():
    values = np.random.default_rng(0).standard_normal((3, 60, 60))  # every cell observed
    valid = np.ones(values.shape, bool)
    spec = WindowSpec(core=(1, 16, 16), overlap=(0, 4, 4), halo=(1, 6, 6), max_context=10_000)
    hidden_halo = []
    for wide in (0.0, 1.0):
        rng = np.random.default_rng(3)
        for _ in range(20):
            task = training_window(values, valid, spec, rng, 1.0, wide_clouds=wide)
            if task is None:
                continue
            # Targets only inside the 20 x 20 prediction region (the centre is rounded down to a cell).
            assert np.abs(task.xt[:, 1:] * spec.cells_per_unit).max() <= 10
            # Another step is all context and spans the view: the central step's cells in view.
            steps, counts = np.unique(task.xc[:, 0], return_counts=True)
            view_cells = int(counts[steps != 0].max())
            on_centre = int(counts[steps == 0].sum())
            hidden_halo.append((wide, view_cells - on_centre - task.xt.shape[0]))
    assert all(n == 0 for w, n in hidden_halo if w == 0.0)  # the halo is always clear
    assert sum(n > 0 for w, n in hidden_halo if w == 1.0) > 10  # wide clouds hide part of it


def test_without_wide_clouds_the_stream_is_unchanged():
    values, valid = _history()
    spec = WindowSpec()
    a = training_window(values, valid, spec, np.random.default_rng(5), 1.0, real_clouds=0.5)
    b = training_window(values, valid, spec, np.random.default_rng(5), 1.0, real_clouds=0.5, wide_clouds=0.0)
    np.testing.assert_array_equal(a.xt, b.xt)
    np.testing.assert_array_equal(a.yc, b.yc)


def test_a_gap_donor_is_the_cloud_over_the_whole_view():
    values = np.random.default_rng(0).standard_normal((3, 60, 60))  # every cell observed
    valid = np.ones(values.shape, bool)
    donor = np.zeros((60, 60), bool)
    donor[:, ::4] = True  # every fourth column is a gap elsewhere in the scene
    spec = WindowSpec(core=(1, 16, 16), overlap=(0, 4, 4), halo=(1, 6, 6), max_context=10_000)
    rng = np.random.default_rng(3)
    for _ in range(10):
        task = training_window(values, valid, spec, rng, 1.0, gap_donor=donor)
        # Any 20 adjacent columns of the 20 x 20 region hold 5 donor columns: 100 targets.
        assert task.xt.shape[0] == 100
        steps, counts = np.unique(task.xc[:, 0], return_counts=True)
        view_cells, on_centre = int(counts[steps != 0].max()), int(counts[steps == 0].sum())
        # The donor's columns leave the context in the halo too, unscored: about a quarter of the view.
        hidden = view_cells - on_centre
        assert task.xt.shape[0] < hidden and abs(hidden / view_cells - 0.25) < 0.05


def test_a_gap_donor_that_hides_nothing_falls_back_to_synthetic_clouds():
    values = np.random.default_rng(0).standard_normal((1, 60, 60))
    valid = np.ones(values.shape, bool)
    task = training_window(values, valid, WindowSpec(), np.random.default_rng(3), 1.0,
                           gap_donor=np.zeros((60, 60), bool))
    assert task is not None and task.xt.shape[0] > 0


def test_field_entries_select_exclude_and_join(tmp_path):
    rng = np.random.default_rng(0)
    for day in range(3):
        ds = xr.Dataset({"sm": (("time", "lat", "lon"), rng.random((1, 10, 12)))},
                        coords={"time": pd.date_range(f"2020-01-0{day + 1}", periods=1),
                                "lat": np.linspace(40, 49, 10), "lon": np.linspace(0, 11, 12)})
        ds["sm"][0, :2, :2] = np.nan
        ds.to_netcdf(tmp_path / f"d{day}.nc")
    entry = {"paths": [f"d{d}.nc" for d in range(3)], "variable": "sm", "isel": {"lon": [2, 12]},
             "exclude": [{"lat": [4, 6], "lon": [0, 3]}]}
    values, valid, spread, elevation = load_field(entry, tmp_path)
    assert values.shape == (3, 10, 10) and elevation is None
    assert np.isnan(values[:, 4:6, :3]).all() and np.isfinite(values[:, 4:6, 3:]).all()
    assert np.isfinite(values[:, :2, :]).all()  # the gaps at lon 0-1 were cut away by isel
    assert valid.shape == values.shape and spread > 0


def test_satellite_entries_use_the_products_valid_area():
    path = real_file("satellite/alboran_sst_avhrr_2017-05.nc")
    entry = {"path": path, "variable": "SST", "satellite": {"valid_mask": "mask"},
             "isel": {"time": [6, 10], "lon": [150, 301]}}
    values, valid, _, _ = load_field(entry, None)
    assert values.shape == (4, 201, 151)
    land = ~valid[0]
    assert land.any() and np.isnan(values[:, land]).all()
    assert (valid & np.isnan(values)).any()  # clouds over the sea are gaps to learn from
    source = WindowSource(files=[entry], synthetic=0.0, real_clouds=1.0)
    batch = source.sample(4, __import__("torch").Generator().manual_seed(0))
    assert batch.mask_t.sum() > 0


def test_thinning_keeps_the_target_day_first_when_asked():
    from geonp.tasks.windows import window_task

    values = np.random.default_rng(0).random((7, 20, 20))
    context = np.ones(values.shape, bool)
    target = np.zeros(values.shape, bool)
    target[3, 8:12, 8:12] = True
    context &= ~target
    centre = (3, 9.5, 9.5)
    focus = (slice(8, 12), slice(8, 12))
    plain = window_task(values, context, target, centre, WindowSpec(max_context=300), 1.0, focus=focus)
    timed = window_task(values, context, target, centre, WindowSpec(max_context=300, time_cells=4.0), 1.0,
                        focus=focus)
    day = lambda task: np.abs(task.xc[:, 0])  # steps from the target day  # noqa: E731
    assert day(plain).max() == 3  # space only: cells of every day are kept alike
    # A step away counts 4 cells: the target day and its neighbours fill the cap first.
    assert day(timed).max() <= 2 and np.mean(day(timed) == 0) > np.mean(day(plain) == 0)


def test_infill_reads_the_history_the_model_was_trained_with(tmp_path):
    from conftest import smooth_cube

    import geonp
    from geonp.models import build, save

    path = tmp_path / "history.safetensors"
    save(build("te-pt-tnp", 3, 1, preset="tiny"), path,
         extra={"infill": {"cells_per_unit": 8.0, "window": {"halo": [2, 10, 10], "time_cells": 4.0}}})
    out = geonp.infill(smooth_cube(t=5), "sst", model="te-pt-tnp", checkpoint=str(path), fit_steps=0)
    assert "'halo': [2, 10, 10]" in out.attrs["geonp_window"] and "'time_cells': 4.0" in out.attrs["geonp_window"]


def test_a_history_fold_sets_the_targets_and_keeps_its_hidden_cells_out_of_the_context():
    from geonp.tasks.history import history_folds

    values, valid = _history(t=9)
    folds = history_folds(values, valid, ["dineof"], 3)
    spec = WindowSpec(core=(1, 16, 16), overlap=(0, 4, 4), halo=(2, 6, 6))
    # The covariate channel marks the fold's hidden cells (1) and the rest (0), so the task's
    # inputs say which cells became targets and context.
    for fold in folds:
        fold.covariates = fold.hidden[None].astype(np.float32)
    rng = np.random.default_rng(0)
    made = 0
    for _ in range(60):
        task = training_window(values, valid, spec, rng, 1.0, folds=folds)
        if task is None:
            continue
        made += 1
        assert np.ptp(task.xt[:, 0]) == 0  # targets on one step
        assert np.ptp(task.xt[:, 3]) == 0 and np.ptp(task.xc[:, 3]) == 0  # every target hidden, no context
        assert task.xt[0, 3] > task.xc[0, 3]
        assert np.unique(task.xc[:, 0]).size > 1  # the other steps are context
    assert made >= 20  # the fold of the window's own step: most placements give a task


def test_history_folds_are_computed_only_for_fields_with_a_history(tmp_path):
    values, _ = _history(t=6)
    ds = xr.Dataset({"v": (("time", "lat", "lon"), values)},
                    coords={"time": pd.date_range("2020-01-01", periods=6), "lat": np.arange(40.0),
                            "lon": np.arange(40.0)})
    ds.to_netcdf(tmp_path / "stack.nc")
    ds.isel(time=[0]).to_netcdf(tmp_path / "scene.nc")
    src = WindowSource(files=[{"path": str(tmp_path / "stack.nc"), "variable": "v"},
                              {"path": str(tmp_path / "scene.nc"), "variable": "v"}],
                       synthetic=0.0, covariates=["dineof"], history_folds=2, workers=2,
                       window={"core": [1, 16, 16], "overlap": [0, 4, 4], "halo": [2, 6, 6]})
    (stack_folds, scene_folds) = (f[4] for f in src.fields)
    assert len(stack_folds) == 2 and scene_folds == []
    # Two worker processes prepare exactly what one does here: each field's folds have their own seed.
    serial = prepare_fields([{"path": str(tmp_path / "stack.nc"), "variable": "v"}], tmp_path, None, ["dineof"], 2,
                            workers=1)[0]
    np.testing.assert_array_equal(serial[0], src.fields[0][0])
    for mine, theirs in zip(serial[4], stack_folds, strict=True):
        np.testing.assert_array_equal(mine.hidden, theirs.hidden)
        np.testing.assert_array_equal(mine.covariates, theirs.covariates)
    # Views come back as views: the valid mask over every step, the single scene's flat covariates.
    from geonp.tasks.covariate_maps import is_flat

    assert src.fields[0][1].strides[0] == 0 and is_flat(src.fields[1][3])
    with pytest.raises(ValueError, match="data.workers must be a whole number >= 1, got 0"):
        WindowSource(files=[{"path": str(tmp_path / "scene.nc"), "variable": "v"}], covariates=["dineof"], workers=0)
    # Windows of a field with folds are retried on that field, so the stack keeps its share of
    # the windows beside the single scene (a stack's window has context on several steps).
    plain = WindowSource(files=[{"path": str(tmp_path / "stack.nc"), "variable": "v"},
                                {"path": str(tmp_path / "scene.nc"), "variable": "v"}],
                         synthetic=0.0, covariates=["dineof"],
                         window={"core": [1, 16, 16], "overlap": [0, 4, 4], "halo": [2, 6, 6]})

    def stack_share(source):
        rng = np.random.default_rng(3)
        return np.mean([np.unique(source._window(rng, source.fields, 0.0).xc[:, 0]).size > 1 for _ in range(60)])

    assert abs(stack_share(src) - stack_share(plain)) < 0.2
    import torch

    batch = src.sample(4, torch.Generator().manual_seed(0))
    assert batch.xc.shape[-1] == 4  # time, row, col and the dineof covariate
    for bad, why in ((2.5, "whole number"), (-1, "whole number"), ("3", "whole number")):
        with pytest.raises(ValueError, match=f"data.history_folds must be a {why}"):
            WindowSource(synthetic=1.0, covariates=["dineof"], history_folds=bad)
    with pytest.raises(ValueError, match="needs data.covariates"):
        WindowSource(synthetic=1.0, history_folds=3)


def _era5_like(tmp_path) -> tuple[dict, np.ndarray]:
    """A 4-step field on 0.25-degree cells (50-55 N, -5-0 E) and a DEM over it (``z`` in m2 s-2):
    the field entry and the DEM's heights in metres on the field's grid."""
    lat, lon = np.arange(50.0, 55.01, 0.25), np.arange(-5.0, 0.01, 0.25)
    rr, cc = np.meshgrid(lat, lon, indexing="ij")
    height = 100.0 * (rr - 50.0) + 20.0 * (cc + 5.0)  # m: a smooth slope, 0-600 m
    rng = np.random.default_rng(0)
    t2m = 280.0 - 0.0065 * height + rng.normal(0, 0.3, (4, *height.shape))
    xr.Dataset({"t2m": (("time", "lat", "lon"), t2m)},
               coords={"time": pd.date_range("2019-03-01", periods=4, freq="h"), "lat": lat, "lon": lon}
               ).to_netcdf(tmp_path / "t2m.nc")
    xr.Dataset({"z": (("lat", "lon"), height * 9.80665, {"units": "m**2 s**-2", "standard_name": "geopotential"})},
               coords={"lat": lat, "lon": lon}).to_netcdf(tmp_path / "dem.nc")
    return {"path": str(tmp_path / "t2m.nc"), "variable": "t2m"}, height


def test_region_and_time_entries_cut_the_field_in_degrees_and_dates(tmp_path):
    entry, _ = _era5_like(tmp_path)
    values, _, _, _ = load_field({**entry, "region": [52.0, 53.0, -5.0, -4.0]}, tmp_path)
    assert values.shape == (4, 5, 5)  # 52-53 N and 5-4 W, both ends included, in 0.25-degree cells
    hours, _, _, _ = load_field({**entry, "time": ["2019-03-01T01", "2019-03-01T02"]}, tmp_path)
    assert hours.shape[0] == 2
    with pytest.raises(ValueError, match="holds no grid cell"):
        load_field({**entry, "region": [10.0, 20.0, 0.0, 1.0]}, tmp_path)
    with pytest.raises(ValueError, match=r"unknown key\(s\) regoin"):
        load_field({**entry, "regoin": [52.0, 53.0, -5.0, -4.0]}, tmp_path)


def test_elevation_is_the_fourth_input_of_real_windows_and_zero_on_synthetic_ones(tmp_path):
    import torch

    entry, height = _era5_like(tmp_path)
    src = WindowSource(files=[entry], synthetic=0.0, elevation=str(tmp_path / "dem.nc"),
                       window={"core": [1, 8, 8], "overlap": [0, 2, 2], "halo": [1, 4, 4]})
    assert src.dim_x == 4 and src.checkpoint_meta["infill"]["elevation"] is True
    np.testing.assert_allclose(src.fields[0][5], height, atol=1e-3)
    task = src._window(np.random.default_rng(0), src.fields, 0.0)
    # Each cell's fourth input is its DEM height in km: rows and columns are offsets from the
    # window's centre, so the heights of the offsets' cells must follow the DEM's slope.
    dr, dc = task.xt[:, 1] * 8, task.xt[:, 2] * 8  # cells (8 cells per unit)
    slope = np.linalg.lstsq(np.stack([dr, dc, np.ones_like(dr)], 1), task.xt[:, 3] * 1000, rcond=None)[0]
    np.testing.assert_allclose(slope[:2], [25.0, 5.0], atol=1e-2)  # m per cell: 100 m/deg and 20 m/deg
    synthetic = WindowSource(files=[entry], synthetic=1.0, elevation=str(tmp_path / "dem.nc"))
    batch = synthetic.sample(2, torch.Generator().manual_seed(0))
    assert batch.xc.shape[-1] == 4 and float(batch.xc[..., 3].abs().max()) == 0.0
    with pytest.raises(ValueError, match="needs real training files"):
        WindowSource(synthetic=1.0, elevation=str(tmp_path / "dem.nc"))


def test_a_missing_dem_is_named_before_training(tmp_path):
    from geonp.train_paths import check_paths

    entry, _ = _era5_like(tmp_path)
    data = {"name": "windows", "files": [entry], "elevation": str(tmp_path / "nope.nc")}
    with pytest.raises(ValueError, match="data.elevation: .*nope.nc: no such file"):
        check_paths(str(tmp_path / "run"), None, data)
