"""Sigma calibrated on the input's own cells: distances, scales per bin, the wrapper, the engine."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import smooth_cube
from torch.distributions import Normal

import geonp
from geonp.fill.calibrate import SHRINK_CELLS, Z90, SigmaCalibrated, fit_scales, target_distance
from geonp.metrics import DISTANCE_BINS
from geonp.models.base import NeuralProcess


def test_target_distance_is_the_nearest_context_cell_of_the_same_step():
    rng = np.random.default_rng(0)
    cells = 8.0
    def points(n: int) -> torch.Tensor:  # [2, n, 3]: steps -1..1, rows and cols -9..9 cells
        cells_ = np.stack([rng.integers(-1, 2, (2, n)), rng.integers(-9, 10, (2, n)), rng.integers(-9, 10, (2, n))], -1)
        return torch.tensor(cells_ / np.array([1.0, cells, cells]), dtype=torch.float32)

    xc, xt = points(30), points(7)
    mask_c = torch.ones(2, 30, dtype=torch.bool)
    mask_c[1, 20:] = False
    got = target_distance(xc, xt, mask_c, cells).numpy()
    for b in range(2):
        for i in range(7):
            same = [j for j in range(30) if mask_c[b, j] and xc[b, j, 0] == xt[b, i, 0]]
            want = min((math.dist(xc[b, j, 1:3].tolist(), xt[b, i, 1:3].tolist()) * cells for j in same),
                       default=math.inf)
            assert got[b, i] == pytest.approx(want, rel=1e-5)


def test_scales_give_90_percent_coverage_where_cells_are_many_and_lean_on_all_bins_where_few():
    rng = np.random.default_rng(1)
    z = np.concatenate([rng.normal(0, 2.0, 20000), rng.normal(0, 0.5, 20000), rng.normal(0, 0.5, 3)])
    bins = np.concatenate([np.zeros(20000, int), np.ones(20000, int), np.full(3, 4)])
    s = fit_scales(z, bins)
    assert s[0] == pytest.approx(2.0 * (20000 + SHRINK_CELLS * s[2] / 2.0) / (20000 + SHRINK_CELLS), rel=0.03)
    assert np.mean(np.abs(z[:20000]) / s[0] < Z90) == pytest.approx(0.9, abs=0.01)
    overall = np.quantile(np.abs(z), 0.9) / Z90
    assert s[2] == s[3] == pytest.approx(overall)  # no cells at 4-12: the all-bins scale
    assert abs(s[4] - overall) < 0.02 * overall  # three cells barely move it
    assert np.array_equal(fit_scales(np.array([]), np.array([], int)), np.ones(len(DISTANCE_BINS)))
    assert fit_scales(np.full(10, 100.0), np.zeros(10, int))[0] == 4.0  # within the limits


class Fixed(NeuralProcess):
    """Mean 1, sigma 2 everywhere."""

    def predict(self, xc, yc, xt, mask_c, mask_t):
        return Normal(torch.ones(*xt.shape[:2], 1), torch.full((*xt.shape[:2], 1), 2.0))


def test_the_wrapper_scales_sigma_by_distance_bin_and_keeps_the_mean():
    scales = np.array([1.0, 1.5, 2.0, 2.5, 3.0])
    model = SigmaCalibrated(Fixed(3, 1), scales, 8.0)
    xc = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]])  # one cell at the target step, one a step later
    xt = torch.tensor([[[0.0, 1 / 8, 0.0], [0.0, 5 / 8, 0.0], [0.0, 20 / 8, 0.0], [1.0, 0.0, 3 / 8],
                        [-1.0, 0.0, 0.0]]])
    dist = model(xc, torch.zeros(1, 2, 1), xt)
    assert torch.equal(dist.loc, torch.ones(1, 5, 1))
    # 1 cell, 5 cells, 20 cells, 3 cells (the later step's own cell), no cell at that step (>12).
    assert dist.scale[0, :, 0].tolist() == [2.0, 2.0 * 2.0, 2.0 * 3.0, 2.0 * 1.5, 2.0 * 3.0]


def test_infill_with_calibration_keeps_the_mean_and_records_the_scales():
    ds = smooth_cube(t=2, r=24, c=30)
    plain = geonp.infill(ds, "sst", model="te-pt-tnp", fit_steps=0)
    calibrated = geonp.infill(ds, "sst", model="te-pt-tnp", fit_steps=0, calibrate_sigma=True,
                              check_windows=16)  # a test's budget
    np.testing.assert_array_equal(plain["sst"].values, calibrated["sst"].values)
    gap = np.isnan(ds["sst"].values) & ds["valid"].values
    ratio = calibrated["sst_std"].values[gap] / plain["sst_std"].values[gap]
    scales = [float(part.split(": ")[1]) for part in calibrated.attrs["geonp_sigma_scales"].split(", ")]
    assert len(scales) == len(DISTANCE_BINS)
    # A cell is scaled by its bin's factor; in the bands where two windows overlap their blend
    # lies between the two windows' factors (each window thins its own context).
    exact = np.isclose(ratio[:, None], np.array(scales)[None, :], rtol=1e-2).any(axis=1)
    assert exact.mean() > 0.6
    assert ratio.min() >= min(scales) * 0.99 and ratio.max() <= max(scales) * 1.01
    assert "geonp_sigma_scales" not in plain.attrs


def test_the_cli_flag_calibrates_and_records_the_scales_in_the_store(tmp_path, tiny_checkpoint):
    import xarray as xr

    from geonp.cli import main

    path = tmp_path / "in.nc"
    smooth_cube(t=2, r=24, c=30).to_netcdf(path)
    assert main(["infill", str(path), "--var", "sst", "--model", "te-pt-tnp", "--checkpoint", tiny_checkpoint,
                 "--fit-steps", "0", "--calibrate-sigma", "--check-windows", "8", "-o", str(tmp_path / "out.zarr"),
                 "-q"]) == 0
    attrs = xr.open_zarr(tmp_path / "out.zarr").attrs
    assert len(attrs["geonp_sigma_scales"].split(", ")) == len(DISTANCE_BINS)
    assert '"calibrate_sigma": true' in attrs["geonp_request"]  # a store is resumed only under the same request


def test_too_few_observed_cells_to_calibrate_is_one_line():
    ds = smooth_cube(t=1, r=24, c=30)
    keep = np.zeros(ds["sst"].shape, bool)
    keep[0, 10, 3:9] = True  # six observed cells: a window cannot hide eight of them
    ds["sst"] = ds["sst"].where(keep)
    with pytest.raises(ValueError, match="^--calibrate-sigma: the input has too few observed cells"):
        geonp.infill(ds, "sst", model="te-pt-tnp", fit_steps=0, calibrate_sigma=True)


def test_a_single_scene_with_its_own_coarse_covariate_calibrates(tmp_path):
    """One scene has no history to fold, though its coarse covariate is not flat: calibration hides
    its cells under clouds as for a model without covariates (it once found no window to score)."""
    from geonp.fill.predictor import bundled_checkpoint
    from pipelines.checkpoint_variants import variant_checkpoint

    coarse = variant_checkpoint(bundled_checkpoint("te-pt-tnp"), tmp_path / "coarse.safetensors", covariates=["coarse"])
    ds = smooth_cube(t=1, r=40, c=48)
    out = geonp.infill(ds, "sst", model="te-pt-tnp", checkpoint=str(coarse), fit_steps=0, calibrate_sigma=True,
                       check_windows=16)  # a test's budget
    assert "geonp_sigma_scales" in out.attrs and "coarse" in out.attrs["geonp_history"]
