"""The coarse pass (``geonp.tasks.coarse``): a wide cloud's rims carried across it."""

from __future__ import annotations

import numpy as np
import pytest

from geonp.tasks.coarse import coarse_trend
from geonp.tasks.history import history_covariates


def plane(rows: int = 100, cols: int = 120) -> np.ndarray:
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return 0.05 * r - 0.02 * c + 3.0


def test_a_plane_under_a_wide_cloud_is_carried_across_it_exactly():
    truth = plane()
    field = truth[None].copy()
    field[0, 20:80, 30:90] = np.nan  # 60 x 60 cells, 30 cells from the rim at its middle
    trend = coarse_trend(field)[0]
    np.testing.assert_allclose(trend[20:80, 30:90], truth[20:80, 30:90], atol=1e-9)


def test_the_trend_averages_small_scale_noise_away_and_ignores_cells_outside_the_valid_area():
    rng = np.random.default_rng(0)
    truth = plane()
    noisy = truth + rng.normal(0, 1.0, truth.shape)
    valid = np.ones(truth.shape, bool)
    valid[:, :10] = False
    noisy[:, :10] = 1e6  # land holding a value: never used
    trend = coarse_trend(noisy[None], valid)[0]
    inner = (slice(10, 90), slice(20, 110))  # away from the edges, where the nearest block extrapolates
    assert np.sqrt(np.mean((trend - truth)[inner] ** 2)) < 0.25  # block means of 64 cells: noise / 8
    assert np.all(np.isfinite(trend))


def test_steps_are_independent_and_a_step_without_observations_is_nan():
    a = plane()[None]
    b = (10 - plane())[None]
    stack = np.concatenate([a, b, np.full_like(a, np.nan)])
    stack[:, 40:60, 40:60] = np.nan
    out = coarse_trend(stack)
    np.testing.assert_allclose(out[0], coarse_trend(stack[:1])[0])
    np.testing.assert_allclose(out[1], coarse_trend(stack[1:2])[0])
    assert np.isnan(out[2]).all()


def test_a_few_observations_give_the_mean_and_bad_arguments_are_refused():
    field = np.full((1, 40, 40), np.nan)
    field[0, 3, 3], field[0, 30, 30] = 1.0, 3.0  # two blocks: no triangle
    np.testing.assert_allclose(coarse_trend(field), 2.0)
    with pytest.raises(ValueError, match="time, rows, cols"):
        coarse_trend(np.zeros((4, 4)))
    with pytest.raises(ValueError, match="at least 1 cell"):
        coarse_trend(np.zeros((1, 4, 4)), factor=0)
    with pytest.raises(ValueError, match="does not match"):
        coarse_trend(np.zeros((1, 4, 4)), np.ones((3, 3), bool))


def test_history_covariates_compute_coarse_for_one_scene_and_keep_history_flat():
    field = plane()[None].copy()
    field[0, 20:80, 30:90] = np.nan
    maps, what = history_covariates(field, None, ["dineof", "coarse"])
    assert maps.shape == (2, 1, 100, 120)
    assert np.ptp(maps[0]) == 0.0  # one scene: no history to learn from
    np.testing.assert_allclose(maps[1, 0, 20:80, 30:90], plane()[20:80, 30:90], atol=1e-5)
    assert "coarse" in what and "dineof not used" in what


def test_blocks_in_one_line_give_the_step_mean_instead_of_failing():
    thin = np.tile(np.linspace(0, 1, 200), (6, 1))[None]  # one block high: block centres on a line
    np.testing.assert_allclose(coarse_trend(thin), thin.mean())
    transect = np.full((1, 64, 64), np.nan)
    transect[0, 30] = np.arange(64.0)  # one observed row, as a ship track
    np.testing.assert_allclose(coarse_trend(transect), transect[0, 30].mean())


def test_reading_the_surface_in_bands_changes_nothing():
    rng = np.random.default_rng(2)
    field = (plane() + rng.normal(0, 0.5, (100, 120)))[None]
    field[0, 10:60, 20:100] = np.nan
    whole = coarse_trend(field)
    np.testing.assert_array_equal(coarse_trend(field, band_cells=7 * 120), whole)  # 7 rows at a time


def test_trend_covariates_are_the_cells_row_and_column_for_one_scene_too():
    field = plane()[None].copy()
    field[0, 20:80, 30:90] = np.nan
    maps, what = history_covariates(field, None, ["dineof", "trend_row", "trend_col"])
    seen = field[np.isfinite(field)]
    row, col = maps[1, 0], maps[2, 0]
    assert np.ptp(maps[0]) == 0.0 and "dineof not used" in what and "linear trend" in what
    assert np.ptp(row, axis=1).max() == 0.0 and np.ptp(col, axis=0).max() == 0.0  # rows and columns
    np.testing.assert_allclose(np.diff(row[:, 0]), seen.std() / 99, rtol=1e-4)  # evenly spaced
    np.testing.assert_allclose(np.ptp(col[0]), seen.std(), rtol=1e-4)  # the field's spread end to end
    np.testing.assert_allclose([row.mean(), col.mean()], seen.mean(), rtol=1e-5)  # its mean at the centre


def test_te_pt_tnp_with_the_trend_in_its_drift_fills_a_plane_across_a_wide_gap(tmp_path):
    """Ordinary kriging levels off to its neighbours' mean inside a wide gap; with the row and column
    in the drift te-pt-tnp's kriging head is universal kriging, whose mean follows the plane."""
    import xarray as xr

    import geonp
    from geonp.fill.predictor import bundled_checkpoint
    from pipelines.checkpoint_variants import variant_checkpoint

    truth = plane(48, 56)
    field = truth.copy()
    field[12:36, 16:40] = np.nan  # 24 x 24 cells
    ds = xr.Dataset({"v": (("time", "lat", "lon"), field[None])},
                    coords={"time": [np.datetime64("2020-01-01")], "lat": np.arange(48.0), "lon": np.arange(56.0)})
    errors = {}
    for label, covariates in (("shipped", None), ("trend", ["dineof", "spread", "trend_row", "trend_col", "nugget"])):
        checkpoint = None if covariates is None else str(variant_checkpoint(
            bundled_checkpoint("te-pt-tnp"), tmp_path / f"{label}.safetensors", covariates=covariates))
        out = geonp.infill(ds, "v", model="te-pt-tnp", checkpoint=checkpoint, fit_steps=0, nugget="model")
        gap = np.isnan(field)
        errors[label] = float(np.sqrt(np.mean((out["v"].values[0][gap] - truth[gap]) ** 2)))
    assert errors["trend"] < 0.02 < errors["shipped"], errors  # the plane spans 2.35 + 1.1 across the field
