"""History covariates through infill: windows carry them, the kriging head's drift uses them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
from test_history import low_rank_stack

import geonp
from geonp.models import build, save
from geonp.tasks.cell_history import nearest_steps
from geonp.tasks.history import history_covariates
from geonp.tasks.windows import WindowSpec, window_task


def test_window_task_appends_the_history_standardised_like_the_values():
    rng = np.random.default_rng(0)
    values = rng.normal(10.0, 2.0, (3, 12, 12))
    history = np.stack([values + 0.5, values * 0 + 7.0])  # [2, T, R, C]
    context = np.isfinite(values)
    target = np.zeros_like(context)
    target[1, 4:8, 4:8], context[1, 4:8, 4:8] = True, False
    task = window_task(values, context, target, (1, 5.5, 5.5), WindowSpec(), 2.0, history=history)
    plain = window_task(values, context, target, (1, 5.5, 5.5), WindowSpec(), 2.0)
    assert task.xc.shape[1] == 5 and task.xt.shape[1] == 5
    np.testing.assert_array_equal(task.xc[:, :3], plain.xc)
    ci = np.flatnonzero(context)
    np.testing.assert_allclose(task.xc[:, 3], (history[0].reshape(-1)[ci] - task.offset) / task.scale, rtol=1e-5)
    np.testing.assert_allclose(task.xt[:, 4], (7.0 - task.offset) / task.scale, rtol=1e-5)


def test_nearest_steps_interpolates_from_other_steps_only():
    values = np.full((5, 1, 2), np.nan)
    values[0, 0, 0], values[2, 0, 0], values[4, 0, 0] = 1.0, 3.0, 11.0
    values[3, 0, 1] = 5.0
    pred = nearest_steps(values)
    np.testing.assert_allclose(pred[:, 0, 0], [3.0, 2.0, 6.0, 7.0, 3.0])  # never a cell's own value
    np.testing.assert_allclose(pred[:, 0, 1], [5.0, 5.0, 5.0, np.nan, 5.0])


def test_one_scene_gets_flat_covariates():
    _, given = low_rank_stack(steps=1)
    maps, what = history_covariates(given, None, ["dineof", "nearest_steps"])
    assert maps.shape == (2, *given.shape) and "no history used" in what
    assert np.ptp(maps) == 0
    with pytest.raises(ValueError, match="unknown history covariates"):
        history_covariates(given, None, ["climatology"])


def stack_dataset(truth: np.ndarray, given: np.ndarray) -> xr.Dataset:
    t, r, c = given.shape
    return xr.Dataset({"v": (("time", "lat", "lon"), given.astype(np.float32), {"units": "K"})},
                      coords={"time": pd.date_range("2020-01-01", periods=t), "lat": np.linspace(40, 45, r),
                              "lon": np.linspace(0, 6, c)})


@pytest.fixture(scope="module")
def kriging_checkpoints(tmp_path_factory) -> tuple[str, str]:
    """The same random te-pt-tnp with a local kriging head, without and with the ``dineof`` covariate."""
    folder = tmp_path_factory.mktemp("ckpt")
    args = dict(preset="tiny", local_attention={"neighbours": 8})
    torch.manual_seed(0)
    plain = build("te-pt-tnp", 3, 1, **args, kriging={"neighbours": 32})
    drift = build("te-pt-tnp", 4, 1, **args, kriging={"neighbours": 32, "covariates": 1})
    drift.load_state_dict(plain.state_dict())
    infill = {"cells_per_unit": 8.0}
    save(plain, folder / "plain.safetensors", extra={"infill": infill})
    save(drift, folder / "drift.safetensors", extra={"infill": {**infill, "covariates": ["dineof"]}})
    return str(folder / "plain.safetensors"), str(folder / "drift.safetensors")


def test_the_history_fills_what_one_day_cannot(kriging_checkpoints):
    plain, drift = kriging_checkpoints
    truth, given = low_rank_stack(steps=12, rows=40, cols=44, noise=0.05)
    ds = stack_dataset(truth, given)
    gap = np.isnan(given)
    scores = {}
    for name, ckpt in (("plain", plain), ("drift", drift)):
        out = geonp.infill(ds, "v", model="te-pt-tnp", checkpoint=ckpt, fit_steps=0)
        scores[name] = float(np.sqrt(np.mean((out["v"].values[gap] - truth[gap]) ** 2)))
        if name == "drift":
            assert "dineof" in out.attrs["geonp_history"]
            np.testing.assert_array_equal(out["v"].values[~gap], given[~gap].astype(np.float32))
    assert scores["drift"] < 0.5 * scores["plain"], scores


def test_dineof_fills_through_infill_evaluate_and_the_command_line(tmp_path):
    from geonp.cli import main
    from geonp.evaluate import evaluate

    truth, given = low_rank_stack(steps=12, rows=30, cols=34, noise=0.05)
    ds = stack_dataset(truth, given)
    out = geonp.infill(ds, "v", model="dineof")
    gap = np.isnan(given)
    assert np.sqrt(np.mean((out["v"].values[gap] - truth[gap]) ** 2)) < 0.3  # the field spreads over +-5
    assert (out["v_std"].values[gap] > 0).all() and (out["v_flag"].values[gap] == 1).all()
    assert "DINEOF" in out.attrs["geonp_history"]
    result = evaluate(ds, "v", ["dineof", "linear"], seed=0)
    rows = {r["model"]: r for r in result["rows"]}
    assert rows["dineof"]["rmse"] < 0.75 * rows["linear"]["rmse"]
    ds.to_netcdf(tmp_path / "in.nc")
    assert main(["infill", str(tmp_path / "in.nc"), "-o", str(tmp_path / "out.zarr"), "--model", "dineof",
                 "-q"]) == 0
    assert main(["infill", str(tmp_path / "in.nc"), "-o", str(tmp_path / "x.zarr"), "--model", "dineof",
                 "--checkpoint", str(tmp_path / "in.nc")]) == 2
    one = ds.isel(time=[0])
    with pytest.raises(ValueError, match="dineof: v: dineof needs at least 3 steps"):
        geonp.infill(one, "v", model="dineof")


def test_training_with_history_covariates_gives_weights_infill_feeds_the_same(tmp_path):
    """``data: {name: windows, covariates: [...]}``: windows carry the covariates, the checkpoint
    records them, and infill computes them for the cube it fills."""
    from geonp.train import TrainConfig, train

    cfg = TrainConfig(model="te-pt-tnp", out_dir=str(tmp_path / "run"), preset="tiny", steps=2, batch_size=2,
                      val_tasks=2, val_every=2, checkpoint_every=2, log_every=1, device="cpu",
                      model_args={"local_attention": {"neighbours": 4}, "kriging": {"neighbours": 8, "covariates": 2}},
                      data={"name": "windows", "synthetic": 1.0, "covariates": ["dineof", "nearest_steps"],
                            "window": {"max_context": 128}})
    train(cfg, progress=False)
    truth, given = low_rank_stack(steps=6, rows=20, cols=22)
    out = geonp.infill(stack_dataset(truth, given), "v", model="te-pt-tnp",
                       checkpoint=str(tmp_path / "run" / "model.safetensors"), fit_steps=1)
    assert "dineof" in out.attrs["geonp_history"] and "nearest_steps" in out.attrs["geonp_history"]
    assert np.isfinite(out["v"].values).all()


def test_a_field_too_large_for_its_history_is_filled_as_without_it(kriging_checkpoints):
    plain, drift = kriging_checkpoints
    truth, given = low_rank_stack(steps=5, rows=20, cols=22)
    ds = stack_dataset(truth, given)
    out = geonp.infill(ds, "v", model="te-pt-tnp", checkpoint=drift, fit_steps=0, max_history_cells=100)
    assert "more than" in out.attrs["geonp_history"]
    ref = geonp.infill(ds, "v", model="te-pt-tnp", checkpoint=plain, fit_steps=0)
    np.testing.assert_allclose(out["v"].values, ref["v"].values, atol=1e-4)
    np.testing.assert_allclose(out["v_std"].values, ref["v_std"].values, atol=1e-4)


def test_covariates_the_model_cannot_take_are_refused(tmp_path, kriging_checkpoints):
    from geonp.models.registry import load_with_meta
    from geonp.train import TrainConfig, train

    plain, _ = kriging_checkpoints
    model, meta = load_with_meta(plain)
    bad = tmp_path / "bad.safetensors"
    save(model, bad, extra={"infill": {**meta["infill"], "covariates": ["dineof"]}})  # header says one, model none
    truth, given = low_rank_stack(steps=4, rows=12, cols=12)
    with pytest.raises(ValueError, match="inconsistent"):
        geonp.infill(stack_dataset(truth, given), "v", model="te-pt-tnp", checkpoint=str(bad))
    cfg = TrainConfig(model="te-pt-tnp", out_dir=str(tmp_path / "run"), preset="tiny", steps=1, batch_size=2,
                      val_tasks=0, device="cpu",
                      model_args={"local_attention": {"neighbours": 4}, "kriging": {"neighbours": 4}},
                      data={"name": "windows", "synthetic": 1.0, "covariates": ["dineof"]})
    with pytest.raises(ValueError, match="kriging: {covariates: 1}"):
        train(cfg, progress=False)


def test_far_points_carry_the_covariates_mean_over_their_own_cells(kriging_checkpoints, monkeypatch):
    """A hole wider than the halo brings far points; each gets its covariate averaged over the
    observed cells its value averages (a far point of a field equal to its covariate has the
    covariate's value exactly)."""
    from geonp.fill import blocks

    _, drift = kriging_checkpoints
    truth, given = low_rank_stack(steps=6, rows=60, cols=64, noise=0.0)
    given[1:4, 5:55, 5:58] = np.nan  # far wider than the 10-cell halo, on the window's three steps
    seen = []
    real = blocks._far_history

    def spy(*args):
        out = real(*args)
        seen.append(out)
        return out

    monkeypatch.setattr(blocks, "_far_history", spy)
    out = geonp.infill(stack_dataset(truth, given), "v", model="te-pt-tnp", checkpoint=drift, fit_steps=0)
    assert seen and all(np.isfinite(s).all() for s in seen)
    assert np.isfinite(out["v"].values).all()
    # The covariate's far values are block means: within the range of the covariate itself.
    from geonp.tasks.history import history_covariates

    maps, _ = history_covariates(given, None, ["dineof"])
    assert all(maps.min() - 1e-4 <= s.min() and s.max() <= maps.max() + 1e-4 for s in seen)


def test_fold_fine_tuning_when_asked_runs_and_leaves_no_folds_behind(kriging_checkpoints, monkeypatch):
    """``FitOptions.history_folds`` (0, off, by default) is taken when fine-tuning starts; the
    folds serve fine-tuning only and are dropped before the blocks are filled."""
    import geonp.fill.finetune
    from geonp.fill.options import FillOptions, FitOptions
    from geonp.fill.plan import plan

    _, drift = kriging_checkpoints
    truth, given = low_rank_stack(steps=6, rows=20, cols=22)
    ds = stack_dataset(truth, given)
    seen = []
    real = geonp.fill.finetune.finetune

    def counting(model, fields, *args, **kwargs):
        seen.append(len(fields[0].folds))
        return real(model, fields, *args, **kwargs)

    monkeypatch.setattr(geonp.fill.finetune, "finetune", counting)  # a spy: it fine-tunes as before
    from geonp.fill.prepare import _finetune

    options = FillOptions(fit=FitOptions(steps=2, history_folds=3), device="cpu")
    p = plan(ds, "v", "te-pt-tnp", checkpoint=drift, options=options)
    _finetune(p, None, None)
    assert seen == [3] and all(f.folds == [] for f in p.fields)
    out = geonp.infill(ds, "v", model="te-pt-tnp", checkpoint=drift, options=options)
    assert np.isfinite(out["v"].values).all()
