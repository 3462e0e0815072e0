"""Training: the loss goes down, resume is exact, checkpoints are atomic, configs are checked."""

from __future__ import annotations

import csv
import dataclasses

import pytest
import torch
import yaml

from geonp.checkpoint import read_checkpoint
from geonp.device import resolve_device
from geonp.models import load
from geonp.tasks.synthetic import fixed_tasks, make_generator
from geonp.train import TrainConfig, evaluate_nll, train


def config(tmp_path, **kw) -> TrainConfig:
    base = dict(model="cnp", out_dir=str(tmp_path / "run"), preset="tiny", data={"name": "gp-se", "max_context": 32},
                steps=20, batch_size=8, checkpoint_every=10, val_every=10, log_every=5, val_tasks=16, seed=3)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("name, steps", [("cnp", 300), ("te-pt-tnp", 150)])
def test_training_lowers_held_out_loss(tmp_path, name, steps):
    cfg = config(tmp_path, model=name, steps=steps, val_every=steps, checkpoint_every=steps)
    held_out = fixed_tasks(make_generator("gp-se", max_context=32), 64, 16, seed=99)
    torch.manual_seed(cfg.seed)
    from geonp.models import build

    before = evaluate_nll(build(name, 1, 1, preset="tiny"), held_out, torch.device("cpu"))
    result = train(cfg, progress=False)
    after = evaluate_nll(result.model, held_out, torch.device("cpu"))
    assert after < before - 0.1, (before, after)
    assert (result.out_dir / "model.safetensors").exists()
    torch.testing.assert_close(evaluate_nll(load(result.out_dir / "model.safetensors"), held_out,
                                            torch.device("cpu")), after)


def test_resume_continues_the_same_run_exactly(tmp_path):
    straight = train(config(tmp_path / "a"), progress=False).model
    train(config(tmp_path / "b", steps=10), progress=False)  # "killed" after step 10
    with open(tmp_path / "b" / "run" / "log.csv", "a") as f:  # a row logged after the last checkpoint
        f.write("15,9.9,,1.0,1.0\n")
    resumed = train(config(tmp_path / "b"), resume=True, progress=False).model
    for (k, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), k
    rows = list(csv.DictReader(open(tmp_path / "b" / "run" / "log.csv")))
    assert [int(r["step"]) for r in rows] == [5, 10, 15, 20]


def test_a_resumed_run_keeps_its_earlier_log_rows_on_disk_from_the_start(tmp_path):
    # A run killed as it resumes, before its first new log row, must not lose the rows it had.
    train(config(tmp_path, steps=10), progress=False)
    on_disk = []

    def read_log(step, model, loss):
        if not on_disk:
            on_disk.extend(int(r["step"]) for r in csv.DictReader(open(tmp_path / "run" / "log.csv")))

    train(config(tmp_path), resume=True, progress=False, on_step=read_log)
    assert on_disk == [5, 10]


def test_existing_run_is_not_overwritten_and_resume_needs_a_run(tmp_path):
    train(config(tmp_path, steps=5), progress=False)
    with pytest.raises(ValueError, match="already holds a run"):
        train(config(tmp_path, steps=5), progress=False)
    with pytest.raises(ValueError, match="does not exist"):
        train(config(tmp_path / "fresh"), resume=True, progress=False)


def test_a_crash_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import geonp.checkpoint as ckpt

    train(config(tmp_path, steps=10), progress=False)
    state = tmp_path / "run" / "state.safetensors"
    good = state.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_file", crash)
    with pytest.raises(OSError):
        train(config(tmp_path, steps=20), resume=True, progress=False)
    assert state.read_bytes() == good
    assert not [p for p in state.parent.iterdir() if p.name.endswith(".tmp")]


def test_the_checkpoint_records_what_inputs_it_was_trained_on(tmp_path):
    out = train(config(tmp_path, steps=2), progress=False).out_dir
    assert read_checkpoint(out / "model.safetensors")[1]["inputs"] == {"kind": "synthetic", "generator": "gp-se"}


def test_validation_set_is_not_the_training_stream(tmp_path):
    with pytest.raises(ValueError, match="val_seed"):
        config(tmp_path, seed=5, val_seed=5)


def test_config_file_errors_name_the_problem(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": "cnp", "out_dir": "x", "stepz": 3}))
    with pytest.raises(ValueError, match=r"unknown key\(s\) stepz"):
        TrainConfig.from_yaml(path)
    path.write_text("model: [unclosed")
    with pytest.raises(ValueError, match="not valid YAML"):
        TrainConfig.from_yaml(path)
    with pytest.raises(ValueError, match="no such file"):
        TrainConfig.from_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="no trainable weights"):
        train(config(tmp_path, model="gp"), progress=False)


def test_device_resolution():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        resolve_device("tpu")


def test_training_on_windows_of_a_cube_resumes_exactly_and_records_the_infill_inputs(tmp_path):
    """A run on a real file's windows stopped at step 5 and resumed ends with the weights of an
    uninterrupted run: the window source draws only from the trainer's saved random state."""
    import numpy as np
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(0)
    lat, lon = np.arange(40.0, 50.0, 0.5), np.arange(0.0, 12.0, 0.5)
    t2m = 280 + rng.normal(size=(12, lat.size, lon.size))
    t2m[rng.random(t2m.shape) < 0.2] = np.nan
    xr.Dataset({"t2m": (("time", "lat", "lon"), t2m)},
               coords={"time": pd.date_range("2020", periods=12, freq="6h"), "lat": lat, "lon": lon}
               ).to_zarr(tmp_path / "cube.zarr")
    files = [{"path": str(tmp_path / "cube.zarr"), "variable": "t2m", "region": [40, 45, 0, 12]}]
    data = {"name": "windows", "files": files, "synthetic": 0.3, "real_clouds": 0.5,
            "val_files": [{**files[0], "region": [45.5, 50, 0, 12]}], "window": {"max_context": 128}}

    def windows_config(out, steps):
        return config(out, model="te-pt-tnp", data=data, steps=steps, batch_size=4, checkpoint_every=5,
                      val_every=5, val_tasks=8)

    straight = train(windows_config(tmp_path / "a", 10), progress=False)
    train(windows_config(tmp_path / "b", 5), progress=False)
    resumed = train(windows_config(tmp_path / "b", 10), resume=True, progress=False)
    for (k, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), k
    meta = read_checkpoint(straight.out_dir / "model.safetensors")[1]
    assert meta["inputs"] == {"kind": "windows"} and meta["infill"]["window"]["max_context"] == 128
    assert not list(straight.out_dir.glob("*.json.tmp"))
    assert np.isfinite(straight.val_nll)
    # A run's state read as a checkpoint before it finishes: the finished run's weights and header.
    from pipelines.checkpoint_variants import state_checkpoint

    tensors, exported = read_checkpoint(state_checkpoint(straight.out_dir, tmp_path / "now.safetensors",
                                                         {"max_block_elems": 2**20}))
    final = read_checkpoint(straight.out_dir / "model.safetensors")[0]
    assert tensors.keys() == final.keys() and all(torch.equal(tensors[k], final[k]) for k in final)
    assert {k: exported[k] for k in ("inputs", "infill", "step")} == {k: meta[k] for k in ("inputs", "infill", "step")}
    assert exported["model"]["kwargs"]["max_block_elems"] == 2**20
    with pytest.raises(SystemExit, match="no config.yaml"):
        state_checkpoint(tmp_path, tmp_path / "none.safetensors")
    # From the command line with another drift, refused for a model without the kriging head that
    # takes it, and then no file is left that looks like the checkpoint asked for.
    import sys

    from pipelines.checkpoint_variants import main as export

    argv = sys.argv
    try:
        sys.argv = ["checkpoint_variants", str(straight.out_dir), str(tmp_path / "drift.safetensors"),
                    "--covariates", '["dineof", "spread"]']
        with pytest.raises(SystemExit, match="--covariates: covariates: the model has no kriging head to take them"):
            export()
        assert not (tmp_path / "drift.safetensors").exists()
    finally:
        sys.argv = argv


def test_the_readme_era5_config_writes_a_checkpoint_that_fills_another_regions_gaps(tmp_path):
    """The README's training example (issue: one task world): its checkpoint goes straight into infill."""
    from pathlib import Path

    import numpy as np
    from conftest import real_file

    import geonp
    from geonp.data import open_cube

    path = Path(real_file("era5/era5_t2m_uk_2019-03_hourly.nc"))
    dem = real_file("elevation/era5_orography_0p25.nc")
    cfg = TrainConfig.from_yaml(Path(__file__).parents[1] / "pipelines/configs/te_pt_tnp_era5_uk.yaml")
    cfg.out_dir, cfg.steps, cfg.val_tasks, cfg.val_every, cfg.batch_size = str(tmp_path / "run"), 2, 4, 2, 4
    cfg.device = "cpu"
    out = train(cfg, progress=False).out_dir
    meta = read_checkpoint(out / "model.safetensors")[1]
    assert meta["inputs"] == {"kind": "windows"} and meta["infill"]["elevation"] is True
    south = open_cube(path, ["t2m"]).isel(time=slice(600, 603)).sel(lat=slice(50.0, 52.0)).compute()
    gappy = south.copy()
    gappy["t2m"] = south["t2m"].where(~((south["lat"] > 50.6) & (south["lon"] > -4) & (south["lon"] < -1)))
    filled = geonp.infill(gappy, "t2m", model="te-pt-tnp", checkpoint=str(out / "model.safetensors"),
                          elevation=dem, fit_steps=0)
    hole = np.isnan(gappy["t2m"].values)
    assert hole.sum() > 0 and np.isfinite(filled["t2m"].values[hole]).all()
    with pytest.raises(ValueError, match="takes elevation as an input; pass --elevation"):
        geonp.infill(gappy, "t2m", model="te-pt-tnp", checkpoint=str(out / "model.safetensors"), fit_steps=0)


def test_the_learning_rate_decays_over_the_last_steps_and_resumes_with_them(tmp_path):
    cfg = config(tmp_path, steps=20, lr=1e-3, lr_decay_steps=8, checkpoint_every=5)
    rates = [cfg.learning_rate(done) for done in range(20)]
    assert rates[:12] == [1e-3] * 12 and rates[12] == pytest.approx(1e-3) and rates[19] == pytest.approx(1e-3 / 8)
    assert all(a > b for a, b in zip(rates[12:], rates[13:]))  # falls linearly, never to zero
    assert config(tmp_path).learning_rate(19) == config(tmp_path).lr  # no decay by default
    with pytest.raises(ValueError, match="lr_decay_steps must be between 0 and steps"):
        config(tmp_path, lr_decay_steps=21)
    straight = train(cfg, progress=False).model

    class Killed(Exception):
        pass

    def kill_at_17(step, model, loss):
        if step == 17:
            raise Killed

    cut = config(tmp_path / "b", steps=20, lr=1e-3, lr_decay_steps=8, checkpoint_every=5)
    with pytest.raises(Killed):
        train(cut, progress=False, on_step=kill_at_17)
    meta = read_checkpoint(tmp_path / "b" / "run" / "state.safetensors")[1]
    assert int(meta["step"]) == 15  # mid-decay; its 15th step took the rate after 14 done
    assert meta["optimizer"]["param_groups"][0]["lr"] == pytest.approx(cut.learning_rate(14))
    resumed = train(cut, resume=True, progress=False).model
    for (k, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), k
    flat = train(config(tmp_path / "c", steps=20, lr=1e-3, checkpoint_every=5), progress=False).model
    assert not all(torch.equal(a, b) for a, b in zip(straight.state_dict().values(), flat.state_dict().values()))


def test_steps_given_on_the_command_line_are_checked_against_the_decay(tmp_path):
    from geonp.train import train_file

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**dataclasses.asdict(config(tmp_path)), "lr_decay_steps": 15}))
    with pytest.raises(ValueError, match=r"lr_decay_steps must be between 0 and steps \(10\), got 15"):
        train_file(path, steps=10, progress=False)
