"""The scene's own nugget in te-pt-tnp's kriging head: the ``nugget`` covariate, how a window hands it
over (as a share, not standardised) and how the head takes it (``kriging.nugget_input``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import data_dir

from geonp.models import build
from geonp.models.local_kriging import NUGGET_SHARE_RANGE, LocalKriging
from geonp.tasks.covariate_maps import (
    OWN_NUGGET,
    check_nugget_input,
    flat_covariates,
    flat_values,
    is_flat,
    unscaled_count,
)
from geonp.tasks.history import history_covariates
from geonp.tasks.windows import WindowSpec, window_task
from geonp.variogram import step_nugget_shares


def rough_and_smooth(seed: int = 0) -> np.ndarray:
    """Two steps of one smooth field: the first as it is, the second with white noise of the
    field's own variance added (a nugget of about half the variance)."""
    rng = np.random.default_rng(seed)
    r, c = np.meshgrid(np.arange(60), np.arange(60), indexing="ij")
    smooth = np.sin(r / 9.0) + np.cos(c / 11.0)
    return np.stack([smooth, smooth + smooth.std() * rng.standard_normal(smooth.shape)])


def test_a_noisy_step_has_a_larger_nugget_share_than_a_smooth_one():
    values = rough_and_smooth()
    values[:, :5, :5] = np.nan  # gaps do not stop the fit
    shares = step_nugget_shares(values)
    assert shares[0] < 0.05 and 0.15 < shares[1] < 0.7  # the exponential fit gives the smooth part some of it
    sparse = np.full((1, 60, 60), np.nan)
    sparse[0, 0, :10] = 1.0  # too few cells for a variogram: NaN, not a guess
    assert np.isnan(step_nugget_shares(sparse)[0])


def test_the_nugget_covariate_is_one_share_per_step_and_the_median_where_a_step_cannot_tell():
    values = np.concatenate([rough_and_smooth(), np.full((1, 60, 60), np.nan)])
    values[2, 0, :3] = 1.0  # a step with three cells
    maps, what = history_covariates(values, None, ["nugget"])
    shares = step_nugget_shares(values)
    assert "nugget" in what and maps.shape == (1, 3, 60, 60)
    for t in range(2):
        assert np.allclose(maps[0, t], np.float32(shares[t]))
    assert np.allclose(maps[0, 2], np.float32(np.median(shares[:2])))


def test_flat_maps_hold_one_number_per_covariate_and_the_networks_nugget():
    maps = flat_covariates(2, (3, 4, 5), flat_values(["mean", "nugget"], 7.5))
    assert is_flat(maps) and is_flat(maps[1]) and maps.shape == (2, 3, 4, 5)
    assert float(maps[0].flat[0]) == 7.5 and float(maps[1].flat[0]) == OWN_NUGGET  # the network's own
    assert not is_flat(np.zeros((2, 3, 4, 5), np.float32))


def test_the_nugget_must_come_last_and_match_the_model():
    assert unscaled_count(["dineof", "nugget"]) == 1 and unscaled_count(["dineof"]) == 0
    with pytest.raises(ValueError, match="must come last"):
        unscaled_count(["nugget", "dineof"])
    check_nugget_input(["dineof", "nugget"], True, "x")
    with pytest.raises(ValueError, match="--checkpoint m.safetensors: .*kriging: {nugget_input: true}"):
        check_nugget_input(["dineof", "nugget"], False, "--checkpoint m.safetensors")
    with pytest.raises(ValueError, match="config: .*add nugget"):
        check_nugget_input(["dineof"], True, "config")


def test_a_window_standardises_the_drift_covariates_and_leaves_the_share_as_it_is():
    values = 10.0 + np.arange(2 * 6 * 6, dtype=float).reshape(2, 6, 6)
    context = np.ones(values.shape, bool)
    context[1, 2, 2] = False
    target = ~context
    history = np.stack([values + 1.0, np.full(values.shape, 0.25)])  # a prediction, a share
    spec = WindowSpec(core=(1, 4, 4), overlap=(0, 0, 0), halo=(1, 1, 1), unscaled_covariates=1)
    task = window_task(values, context, target, (1.0, 2.0, 2.0), spec, 5.0, history=history)
    drift, share = task.xc[:, 3], task.xc[:, 4]
    assert np.allclose(drift * task.scale + task.offset, values[context] + 1.0, atol=1e-4)
    assert np.allclose(share, 0.25) and np.allclose(task.xt[:, 4], 0.25)
    with pytest.raises(ValueError, match="unscaled_covariates"):
        WindowSpec(unscaled_covariates=-1)


def test_the_scene_nugget_sets_the_weights_and_the_variance_stays_the_networks():
    from geonp.models.kriging_linalg import JITTER as _JITTER
    from geonp.models.local_kriging import INIT_LENGTHSCALES, INIT_NUGGET, INIT_SILL

    head = LocalKriging(dim_model=4, dim_x=2, kernel="exponential")  # untrained: the initial covariance
    zt, xt = torch.zeros(1, 2, 4), torch.tensor([[[0.2, 0.1], [0.0, 0.0]]])
    xc = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.5, 0.5]]])
    yc = torch.tensor([[[1.0], [2.0], [4.0], [0.0]]])
    index, valid = torch.arange(4).view(1, 1, 4).expand(1, 2, 4), torch.ones(1, 2, 4, dtype=torch.bool)
    own = head(zt, xt, xc, yc, index, valid)
    share = torch.tensor([[0.0, 0.5]])
    mean, logvar = head(zt, xt, xc, yc, index, valid, nugget_share=share)
    pts, ys = xc[0].double().numpy(), yc[0, :, 0].double().numpy()
    ell = INIT_LENGTHSCALES["exponential"]

    def cov(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return INIT_SILL * np.exp(-np.linalg.norm(a[:, None] - b[None], axis=-1) / ell)

    for i, s in enumerate([NUGGET_SHARE_RANGE[0], 0.5]):
        target = xt[0, i:i + 1].double().numpy()
        scene = INIT_SILL * s / (1 - s)
        big = np.ones((5, 5))  # ordinary kriging, bordered, with the scene's nugget
        big[:4, :4], big[4, 4] = cov(pts, pts) + (scene + _JITTER) * np.eye(4), 0.0
        w = np.linalg.solve(big, np.append(cov(target, pts)[0], 1.0))[:4]
        assert np.isclose(mean[0, i, 0].item(), w @ ys, atol=1e-4)
        # The same weights' error variance under the network's own covariance (its nugget INIT_NUGGET).
        net = INIT_SILL + INIT_NUGGET - 2 * w @ cov(target, pts)[0] + w @ (cov(pts, pts) + INIT_NUGGET * np.eye(4)) @ w
        assert np.isclose(logvar[0, i, 0].exp().item(), net, rtol=2e-3)
        assert logvar[0, i, 0] >= own[1][0, i, 0] - 1e-4  # no weights beat the network's own under its covariance
    assert not torch.allclose(mean, own[0])

    # With an external drift (slopes from the neighbours alone): the same, for the drift's weights.
    dc, dt = torch.tensor([[[0.3], [-1.0], [0.8], [0.1]]]), torch.tensor([[[0.0], [0.2]]])
    mean, logvar = head(zt, xt, xc, yc, index, valid, dt, dc, nugget_share=share)
    d = dc[0, :, 0].double().numpy()
    for i, s in enumerate([NUGGET_SHARE_RANGE[0], 0.5]):
        target = xt[0, i:i + 1].double().numpy()
        big = np.zeros((6, 6))
        big[:4, :4] = cov(pts, pts) + (INIT_SILL * s / (1 - s) + _JITTER) * np.eye(4)
        big[:4, 4], big[4, :4], big[:4, 5], big[5, :4] = 1.0, 1.0, d, d
        w = np.linalg.solve(big, np.concatenate([cov(target, pts)[0], [1.0, dt[0, i, 0].item()]]))[:4]
        assert np.isclose(mean[0, i, 0].item(), w @ ys, atol=2e-3)
        net = INIT_SILL + INIT_NUGGET - 2 * w @ cov(target, pts)[0] + w @ (cov(pts, pts) + INIT_NUGGET * np.eye(4)) @ w
        assert np.isclose(logvar[0, i, 0].exp().item(), net, rtol=1e-2)


def test_the_model_splits_the_nugget_off_its_drift_and_refuses_it_without_covariates():
    kwargs = dict(preset="tiny", local_attention={"neighbours": 4})
    model = build("te-pt-tnp", dim_x=5, dim_y=1, kriging={"neighbours": 4, "covariates": 2, "nugget_input": True},
                  **kwargs).eval()
    g = torch.Generator().manual_seed(0)
    xc, yc, xt = torch.rand(1, 12, 5, generator=g), torch.randn(1, 12, 1, generator=g), torch.rand(1, 3, 5, generator=g)
    mask_c, mask_t = torch.ones(1, 12, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool)
    low, high = xt.clone(), xt.clone()
    low[..., -1], high[..., -1] = 0.0, 0.6
    with torch.no_grad():
        m_low = model(xc, yc, low, mask_c, mask_t).loc
        m_high = model(xc, yc, high, mask_c, mask_t).loc
    assert not torch.allclose(m_low, m_high)  # the share reaches the head: its weights, so its mean, move
    with pytest.raises(ValueError, match="kriging nugget_input needs"):
        build("te-pt-tnp", dim_x=3, dim_y=1, kriging={"neighbours": 4, "nugget_input": True}, **kwargs)


def test_infill_and_fine_tuning_take_the_nugget_covariate(tmp_path):
    import xarray as xr

    from geonp.fill.engine import infill
    from geonp.fill.predictor import bundled_checkpoint
    from pipelines.checkpoint_variants import variant_checkpoint

    checkpoint = variant_checkpoint(bundled_checkpoint("te-pt-tnp"), tmp_path / "nugget.safetensors",
                                    covariates=["dineof", "spread", "nugget"],
                                    model_args={"kriging": {"nugget_input": True}})
    values = np.concatenate([rough_and_smooth(), rough_and_smooth(1)])[:, :32, :32]
    values[2, 8:20, 8:20] = np.nan
    ds = xr.Dataset({"v": (("time", "lat", "lon"), values)},
                    coords={"time": np.arange(4), "lat": np.arange(32) * 0.1, "lon": np.arange(32) * 0.1})
    out = infill(ds, "v", "te-pt-tnp", checkpoint=str(checkpoint), fit_steps=2)
    gap = np.isnan(values[2])
    assert np.isfinite(out["v"].values[2][gap]).all() and (out["v_std"].values[2][gap] > 0).all()


def test_the_nugget_is_that_of_what_the_drift_leaves():
    from geonp.variogram import drift_residuals

    smooth = rough_and_smooth()[:1]
    rng = np.random.default_rng(3)
    noise = rng.standard_normal(smooth.shape)
    drift = np.stack([noise])  # a covariate that explains a rough part of the field exactly
    values = smooth + 2.0 * noise
    observed = np.ones(values.shape, bool)
    left = drift_residuals(values, observed, drift)
    assert np.corrcoef(left.ravel(), smooth.ravel())[0, 1] > 0.99  # the drift's part is gone
    assert step_nugget_shares(values)[0] > 0.3 > 0.05 > step_nugget_shares(left)[0]
    assert np.allclose(drift_residuals(values, observed, drift[:0]), values - values.mean())


def _agree_with_scipy(values: np.ndarray) -> None:
    """step_variograms of ``values [T, R, C]`` against SciPy's fit of each step alone."""
    from geonp.variogram import fit_grid_variogram, grid_semivariance, step_variograms

    fits = step_variograms(values)
    assert sum(f is not None for f in fits) >= len(values) - 1  # all but a step too sparse to fit
    lag, gam, cnt = grid_semivariance(values, 64)
    for t, fit in enumerate(fits):
        if fit is None:
            continue
        step = values[t]
        seen = np.isfinite(step)
        one_lag, one_gam, one_cnt = grid_semivariance(step, 64)
        with_pairs = cnt[t] > 0
        np.testing.assert_array_equal(lag[with_pairs], one_lag)
        np.testing.assert_allclose(gam[t, with_pairs], one_gam, rtol=1e-12)
        np.testing.assert_array_equal(cnt[t, with_pairs], one_cnt)
        scipy = fit_grid_variogram((step - step[seen].mean()) / step[seen].std(), "exponential")
        share = lambda p: p[2] / (p[0] + p[2])  # noqa: E731
        assert fit[0] == seen.sum() and np.isclose(fit[1], step[seen].std())
        assert abs(share(fit[2]) - share(scipy)) < 1e-4, (t, fit[2], scipy)
        assert abs(fit[2][1] - scipy[1]) < 1e-2 * scipy[1], (t, fit[2], scipy)


def test_all_steps_fitted_at_once_agree_with_scipys_fit_of_each_step():
    """step_variograms fits every step together (geonp.variogram.fit_exponential_many): the same
    exponential fit as SciPy's least squares of each step alone (fit_grid_variogram), on steps from
    smooth to pure noise, with gaps and without; a stack's semivariances are each step's."""
    from geonp.variogram import MIN_SCENE_POINTS, step_variograms

    rng = np.random.default_rng(3)
    r, c = np.meshgrid(np.arange(40), np.arange(50), indexing="ij")
    steps = []
    for t in range(24):
        smooth = np.sin(r / rng.uniform(3, 15) + t) + np.cos(c / rng.uniform(3, 15))
        step = smooth + (t / 12) * smooth.std() * rng.standard_normal(smooth.shape)  # nugget share 0 to ~0.8
        step[rng.random(step.shape) < rng.uniform(0, 0.8)] = np.nan
        steps.append(step)
    values = np.stack(steps)
    values[5, :, :] = np.nan
    values[5, 0, :MIN_SCENE_POINTS - 1] = 1.0  # too few cells: None, as before
    assert step_variograms(values)[5] is None
    _agree_with_scipy(values)


def test_a_stack_in_several_passes_fits_as_in_one_and_the_start_is_the_documented_one(monkeypatch):
    """STACK_CELLS cuts a long stack's semivariance pass into several: the same fits; and the fits
    start where fit_binned always started: the largest semivariance less the smallest as the sill,
    half the largest lag as the range, the smallest semivariance as the nugget, within the bounds."""
    from geonp import variogram

    values = rough_and_smooth()
    values = np.concatenate([values, values[::-1] * 2.0, values + 1.0])  # six steps
    values[:, 10:20, 10:30] = np.nan
    whole = variogram.step_variograms(values)
    monkeypatch.setattr(variogram, "STACK_CELLS", 2 * 60 * 60 + 1)  # two steps a pass, three passes
    assert variogram.step_variograms(values) == whole
    lag, gam, cnt = np.array([1.0, 2.0, 5.0]), np.array([0.2, 0.5, 0.9]), np.array([10.0, 8.0, 3.0])
    start, lower, upper = variogram._start(lag[None], gam[None], cnt[None], 60.0)
    np.testing.assert_allclose(start[0], [0.9 - 0.2, 5.0 / 2, 0.2])
    np.testing.assert_allclose(lower[0], [0.0, 5e-6, variogram.MIN_NUGGET])
    np.testing.assert_allclose(upper[0], [9.0, 240.0, 0.9])


@pytest.mark.skipif(data_dir() is None, reason="shared data folder absent (set GEONP_DATA)")
def test_real_hourly_steps_under_wide_clouds_keep_scipys_fit():
    """The hourly ERA5 month under 85% smooth clouds (fill_speed's cube), every step: without the
    bound on how far a step moves the range, the joint fit leaps to other minima on some of them
    (nugget shares up to 1.0 from SciPy's, ranges 11 times theirs)."""
    from geonp.data import open_cube
    from geonp.tasks.clouds import random_clouds

    values = open_cube(data_dir() / "era5/era5_t2m_uk_2019-03_hourly.nc")["t2m"].values.astype(np.float64)
    rng = np.random.default_rng(0)
    clouds = np.stack([random_clouds(values.shape[1:], 0.85, rng, 6.0) for _ in range(len(values))])
    _agree_with_scipy(np.where(clouds, np.nan, values))
