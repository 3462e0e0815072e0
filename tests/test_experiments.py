"""The experiment pipelines (pipelines/experiments, checkpoint variants, validation NLL) on tiny budgets: what they
change, what they refuse, the tables they write."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_sigma_scale_rescales_only_sigma_and_fills_once(monkeypatch):
    import xarray as xr

    import pipelines.experiments.sigma_scale as module

    calls = []

    def once(ds, variable, **options):  # stands in for geonp.infill: counts its calls
        calls.append(variable)
        return ds

    monkeypatch.setattr(module, "infill", once)
    ds = xr.Dataset({"v": ("x", np.array([1.0, 2.0])), "v_std": ("x", np.array([0.5, 1.0]))})
    cache: dict = {}
    a = module.scaled_infill(cache, ds, "v", scale=1.0)
    b = module.scaled_infill(cache, ds, "v", scale=1.2)
    assert calls == ["v"]
    np.testing.assert_array_equal(a["v"], b["v"])
    np.testing.assert_allclose(b["v_std"], [0.6, 1.2])
    np.testing.assert_allclose(ds["v_std"], [0.5, 1.0])  # the cached fill is not changed in place


def test_sigma_scale_window_distances_count_cells_on_the_target_step_only():
    from geonp.tasks.batch import Batch
    from pipelines.experiments.sigma_scale import _nearest_on_step

    # Inputs (time, row, col) in units of 8 cells: context on step 0 at (0, 0) and (0, 3 cells), on
    # step 1 right at the target; a padded context point (mask False) at the target too.
    xc = torch.tensor([[[0, 0, 0], [0, 0, 3 / 8], [1, 0, 5 / 8], [0, 0, 5 / 8]]], dtype=torch.float32)
    xt = torch.tensor([[[0, 0, 5 / 8], [1, 0, 0]]], dtype=torch.float32)
    mask_c = torch.tensor([[True, True, True, False]])
    b = Batch(xc, torch.zeros(1, 4, 1), xt, torch.zeros(1, 2, 1), mask_c, torch.ones(1, 2, dtype=torch.bool))
    assert _nearest_on_step(b, 8.0).tolist() == [[2.0, 5.0]]


def test_more_crops_refuses_a_crop_over_the_test_cells_and_malformed_ones():

    from pipelines.experiments.more_crops import crop_boxes

    test = {"y": slice(800, 1000), "x": slice(0, 300)}
    assert crop_boxes(["400:0", "600:300", "800:300"], test) == [(400, 0), (600, 300), (800, 300)]
    with pytest.raises(SystemExit, match="overlaps satellite_cv's test crop"):
        crop_boxes(["700:100"], test)  # rows 700-900 and cols 100-400 reach into the test crop
    with pytest.raises(SystemExit, match="not ROW:COL"):
        crop_boxes(["400"], test)


def test_bundled_variants_change_only_the_header_and_refuse_what_they_cannot_read(tmp_path):

    from geonp.checkpoint import read_checkpoint
    from geonp.fill.predictor import bundled_checkpoint
    from pipelines.checkpoint_variants import bundled_variants

    spec = '{"covariates": ["dineof", "mean"], "model_args": {"kriging": {"slope_prior": "none"}}}'
    made = bundled_variants([f"eb={spec}"], tmp_path)
    tensors, meta = read_checkpoint(made["eb"])
    bundled, old = read_checkpoint(bundled_checkpoint("te-pt-tnp"))
    assert tensors.keys() == bundled.keys() and all((tensors[k] == bundled[k]).all() for k in tensors)
    assert meta["infill"]["covariates"] == ["dineof", "mean"]
    assert meta["model"]["dim_x"] == old["model"]["dim_x"] - len(old["infill"]["covariates"]) + 2
    head, old_head = meta["model"]["kwargs"]["kriging"], old["model"]["kwargs"]["kriging"]
    assert head["slope_prior"] == "none" and head["neighbours"] == old_head["neighbours"]  # one setting changed
    assert old_head["nugget_input"] and not head["nugget_input"]
    _, none = read_checkpoint(bundled_variants(['none={"covariates": []}'], tmp_path)["none"])
    assert none["infill"]["covariates"] == [] and none["model"]["kwargs"]["kriging"]["covariates"] == 0
    assert none["model"]["dim_x"] == old["model"]["dim_x"] - len(old["infill"]["covariates"]) == 3
    with pytest.raises(SystemExit, match="--variant odd: covariates: a JSON list"):
        bundled_variants(['odd={"covariates": "dineof"}'], tmp_path)
    with pytest.raises(SystemExit, match="--variant odd: covariates: unknown \\['eofs'\\]"):
        bundled_variants(['odd={"covariates": ["eofs"]}'], tmp_path)
    mismatch = '{"covariates": ["dineof"], "model_args": {"kriging": {"nugget_input": true}}}'
    with pytest.raises(SystemExit, match="--variant mix: variant: covariates .* lack the nugget share"):
        bundled_variants([f"mix={mismatch}"], tmp_path)
    with pytest.raises(SystemExit, match="--variant bad: not JSON"):
        bundled_variants(["bad={covariates"], tmp_path)
    with pytest.raises(SystemExit, match="a JSON object is needed"):
        bundled_variants(['odd=["dineof"]'], tmp_path)
    with pytest.raises(SystemExit, match="unknown key.*weights"):
        bundled_variants(['odd={"weights": 1}'], tmp_path)


def test_a_window_variant_reaches_the_windows_infill_reads(tmp_path):

    from geonp.checkpoint import read_checkpoint
    from geonp.fill.plan import _window_spec
    from pipelines.checkpoint_variants import bundled_variants

    made = bundled_variants(['wide={"window": {"halo": [1, 24, 24]}}'], tmp_path)
    _, meta = read_checkpoint(made["wide"])
    assert meta["infill"]["window"]["halo"] == [1, 24, 24]
    assert meta["infill"]["window"]["max_context"] == 512  # the rest of the training windows kept
    assert _window_spec(None, (1, 300, 500), meta["infill"]).halo == (1, 24, 24)
    with pytest.raises(SystemExit, match="--variant odd: window: only halo and time_cells.*core"):
        bundled_variants(['odd={"window": {"core": [1, 8, 8]}}'], tmp_path)
    for bad in ('{"window": {"halo": 5}}', '{"window": [1]}', '{"window": {"halo": [1, -2, 2]}}',
                '{"model_args": {"kriging_neighbors": 8}}'):
        with pytest.raises(SystemExit, match="^--variant odd: "):
            bundled_variants([f"odd={bad}"], tmp_path)
    assert not (tmp_path / "odd.safetensors").exists()


def test_a_run_that_cannot_be_exported_is_refused_in_one_line(tmp_path):

    from pipelines.checkpoint_variants import state_checkpoint

    (tmp_path / "state.safetensors").write_bytes(b"not a checkpoint")
    (tmp_path / "config.yaml").write_text("")
    with pytest.raises(SystemExit, match="not a windows run"):
        state_checkpoint(tmp_path, tmp_path / "out.safetensors")
    (tmp_path / "config.yaml").write_text("data: {name: windows}\n")
    with pytest.raises(SystemExit, match="must be a JSON object"):
        state_checkpoint(tmp_path, tmp_path / "out.safetensors", [1])
    with pytest.raises(SystemExit, match=f"^{tmp_path}: "):  # the unreadable state, named
        state_checkpoint(tmp_path, tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()


def test_a_checkpoint_can_be_given_another_drift_in_place(tmp_path):
    """``checkpoint_variants --covariates`` rewrites the exported file itself: same tensors, new header."""
    import shutil

    from geonp.checkpoint import read_checkpoint
    from geonp.fill.predictor import bundled_checkpoint
    from pipelines.checkpoint_variants import variant_checkpoint

    path = tmp_path / "te.safetensors"
    shutil.copy(bundled_checkpoint("te-pt-tnp"), path)
    before = read_checkpoint(path)[0]
    tensors, meta = read_checkpoint(variant_checkpoint(path, path, covariates=["dineof"]))
    assert meta["infill"]["covariates"] == ["dineof"] and meta["model"]["kwargs"]["kriging"]["covariates"] == 1
    assert tensors.keys() == before.keys() and all(torch.equal(tensors[k], before[k]) for k in before)


def test_sigma_shape_finds_the_scale_and_the_tail():

    from pipelines.experiments.sigma_shape import crps_scale, kurtosis, score

    rng = np.random.default_rng(0)
    z = 2.0 * rng.standard_normal(20000)
    assert abs(crps_scale(z) - 2.0) < 0.05  # a normal's CRPS is lowest at its own scale
    assert abs(kurtosis(z) - 3.0) < 0.2 and kurtosis(rng.standard_t(5, 20000)) > 5.0
    # Truths twice as far from the mean as sigma says, all one distance bin: the best normal
    # doubles sigma and covers 90%; the shipped sigma covers about 59%.
    y = 2.0 * rng.standard_normal(5000)
    cells = {"y": y, "mean": np.zeros_like(y), "sigma": np.ones_like(y), "bins": np.zeros(y.size, int),
             "z": y, "zbins": np.zeros(y.size, int), "again_z": y[:0], "again_bins": np.zeros(0, int)}
    ways = score(cells)
    assert abs(ways["shipped"][1][0] - 0.59) < 0.03 and abs(ways["best normal"][1][0] - 0.90) < 0.02
    assert ways["best normal"][0] < ways["shipped"][0] and ways["windows, coverage"][1][0] > 0.87
    assert ways["filled days, CRPS"][0] == ways["shipped"][0]  # no re-hidden cells: sigma as shipped


def test_sigma_shape_leaves_calibration_as_it_was():

    import geonp.fill.calibrate as calibration
    from pipelines.experiments.sigma_shape import calibration_errors

    original = calibration.fit_scales
    with calibration_errors({}) as seen:
        assert calibration.fit_scales(np.array([3.0, -1.0]), np.array([0, 1])).tolist() == [1.0] * 5
        assert seen["z"].tolist() == [3.0, -1.0]
    assert calibration.fit_scales is original


def test_kriging_lead_changes_the_head_only_while_open_and_fills_in_log_space(monkeypatch):
    import math

    import xarray as xr

    import pipelines.experiments.kriging_lead as lead
    from geonp.models.local_kriging import LocalKriging

    head = LocalKriging(dim_model=4, dim_x=2, kernel="exponential")
    zt, xt = torch.zeros(1, 1, 4), torch.zeros(1, 1, 2)
    xc, yc = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]]), torch.tensor([[[1.0], [2.0], [3.0]]])
    index, valid = torch.arange(3).view(1, 1, 3), torch.ones(1, 1, 3, dtype=torch.bool)
    before = head(zt, xt, xc, yc, index, valid)
    used = []
    with lead.head_covariance(nugget_share=0.3, lengthscale=2.0, record=used):
        during = head(zt, xt, xc, yc, index, valid)
    ell, sill, nugget = used[0][0, :2], used[0][0, 2], used[0][0, 3]
    assert np.allclose(ell, 2 * 2.0) and math.isclose(nugget / (sill + nugget), 0.3, rel_tol=1e-4)
    assert during[1].item() > before[1].item()  # a larger nugget: a larger kriging variance
    after = head(zt, xt, xc, yc, index, valid)
    assert torch.equal(after[0], before[0]) and "covariance" not in head.__dict__
    used.clear()  # the scene's variogram: share and spatial lengthscales set, time and sill kept
    with lead.head_covariance(set_share=0.25, set_space=3.0, record=used):
        head(zt, xt, xc, yc, index, valid)
    ell, sill, nugget = used[0][0, :2], used[0][0, 2], used[0][0, 3]
    assert np.isclose(ell[0], 2.0) and np.isclose(ell[1], 3.0) and math.isclose(nugget / (sill + nugget), 0.25,
                                                                                  rel_tol=1e-4)
    # Per-step scores pool as one fill of all their cells would score.
    part = [{"n": 1, "rmse": 1.0, "crps": 1.0, "coverage_90": 1.0, "rmse_by_distance": {"1": {"n": 1, "rmse": 1.0}}},
            {"n": 3, "rmse": 3.0, "crps": 2.0, "coverage_90": 0.0, "rmse_by_distance": {"1": {"n": 3, "rmse": 3.0}}}]
    both = lead.pooled(part)
    assert math.isclose(both["rmse"], math.sqrt(7.0)) and math.isclose(both["crps"], 1.75)
    assert math.isclose(both["coverage_90"], 0.25)
    assert math.isclose(both["rmse_by_distance"]["1"]["rmse"], math.sqrt(7.0))

    # Log space: a fill of log(y) with mean mu, s.d. s comes back as the lognormal's moments.
    def fake_infill(ds, variable, model, **options):
        assert float(ds[variable].min()) == 0.0  # log(1)
        return xr.Dataset({variable: ds[variable].fillna(0.0), f"{variable}_std": xr.full_like(ds[variable], 0.5)})

    monkeypatch.setattr(lead, "infill", fake_infill)
    ds = xr.Dataset({"chl": ("x", np.array([1.0, np.e, -1.0]))})
    out = lead.log_space_infill(ds, "chl", "linear")
    mean = np.exp(np.array([0.0, 1.0, 0.0]) + 0.125)
    assert np.allclose(out["chl"], mean) and np.allclose(out["chl_std"], mean * math.sqrt(math.expm1(0.25)))


def test_validation_nll_scores_a_checkpoint_as_trained_whatever_its_inference_header(tmp_path):
    import math

    import yaml

    from geonp.fill.predictor import bundled_checkpoint
    from pipelines.checkpoint_variants import variant_checkpoint
    from pipelines.release.validation_nll import validation_nll

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": "te-pt-tnp", "preset": "small", "out_dir": str(tmp_path / "r"),
                                   "data": {"name": "windows", "covariates": ["dineof"]},
                                   "val_tasks": 4, "batch_size": 2, "val_seed": 7}))
    bundled = bundled_checkpoint("te-pt-tnp")
    other = variant_checkpoint(bundled, tmp_path / "other.safetensors", covariates=["dineof", "mean", "spread"],
                               model_args={"kriging": {"slope_prior": 1.0}})
    scores = validation_nll(cfg, [bundled, other])
    assert math.isfinite(scores[str(bundled)]) and scores[str(bundled)] == scores[str(other)]
