"""The geonp command: help, version, one-line errors with exit code 2, training from YAML."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from geonp import __version__
from geonp.cli import main


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "geonp", *args], capture_output=True, text=True, timeout=300)


def test_version_and_help():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"geonp {__version__}"
    out = run("--help")
    assert out.returncode == 0 and "demo" in out.stdout and "train" in out.stdout


def test_bad_input_is_one_line_and_exit_code_2(tmp_path):
    out = run("train", str(tmp_path / "missing.yaml"))
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "missing.yaml" in out.stderr and "Traceback" not in out.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": "no-such-model", "out_dir": str(tmp_path / "r")}))
    out = run("train", str(cfg))
    assert out.returncode == 2 and "unknown model name 'no-such-model'" in out.stderr


def test_train_command_writes_a_loadable_model(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": "rcnp", "preset": "tiny", "out_dir": str(tmp_path / "r"), "steps": 6,
                                   "batch_size": 4, "val_tasks": 8, "val_every": 3, "log_every": 3}))
    assert main(["train", str(cfg), "--no-progress", "--device", "cpu"]) == 0
    assert "trained rcnp for 6 steps" in capsys.readouterr().out
    assert main(["train", str(cfg), "--no-progress", "--resume", "--steps", "9"]) == 0
    assert "trained rcnp for 9 steps" in capsys.readouterr().out  # resumed at 6, went on to 9
    from geonp.models import load

    assert load(tmp_path / "r" / "model.safetensors").config["name"] == "rcnp"
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["step"] == 9


def test_models_lists_names_and_only_presets_that_change_something(capsys, monkeypatch):
    import geonp.fill.predictor as predictor

    assert main(["models"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "paper, small, tiny" in lines["te-pt-tnp"]
    assert "none" in lines["linear"] and "small" not in lines["linear"]
    # What infill fills with when no --checkpoint is given: every line says.
    assert "bundled weights" in lines["te-pt-tnp"] and "no weights needed" in lines["linear"]
    assert "no weights needed" in lines["window-kriging"] and "infill: no weights" in lines["kriging"]
    real = predictor.bundled_checkpoint
    monkeypatch.setattr(predictor, "bundled_checkpoint", lambda name: None if name == "tnp" else real(name))
    assert main(["models"]) == 0  # a trained model shipped without weights: the user trains one
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "train one, then --checkpoint" in lines["tnp"] and "bundled weights" in lines["te-tnp"]


def test_every_command_exits_cleanly_with_the_readers_of_the_test_extras(tmp_path):
    """With rasterio (GeoTIFF) and eccodes (GRIB) installed beside netCDF4, as the [test] extras have
    them, opening a NetCDF without naming its engine loaded their own HDF5 libraries too, and the
    process aborted at exit (status 134) after writing its output: the success and the error path."""
    import numpy as np
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(0)
    values = 280 + np.cumsum(rng.normal(size=(2, 12, 14)), 2)
    coords = {"time": pd.date_range("2020-01-01", periods=2), "lat": np.linspace(40, 46, 12),
              "lon": np.linspace(0, 8, 14)}
    truth = xr.Dataset({"t2m": (("time", "lat", "lon"), values, {"units": "K"})}, coords=coords)
    truth.to_netcdf(tmp_path / "truth.nc", engine="netcdf4")
    values = values.copy()
    values[:, 4:8, 5:9] = np.nan
    truth.assign(t2m=(("time", "lat", "lon"), values, {"units": "K"})).to_netcdf(tmp_path / "in.nc", engine="netcdf4")
    f = {name: str(tmp_path / name) for name in ("in.nc", "truth.nc", "out.zarr", "map.png", "e.md")}
    steps = [("infill", f["in.nc"], "-o", f["out.zarr"], "--model", "linear", "-q"),
             ("plot", f["out.zarr"], "-o", f["map.png"], "--truth", f["truth.nc"], "--point", "43,4"),
             ("evaluate", f["truth.nc"], "--var", "t2m", "--model", "linear", "-o", f["e.md"])]
    for args in steps:
        out = run(*args)
        assert out.returncode == 0, (args[0], out.returncode, out.stderr[-500:])
    assert "evaluate t2m: linear" in out.stderr  # evaluate says what it is doing
    out = run("plot", str(tmp_path / "in.nc"), "-o", str(tmp_path / "bad.png"), "--truth", str(tmp_path / "truth.nc"))
    assert out.returncode == 2 and "double free" not in out.stderr and "Traceback" not in out.stderr


def test_a_finished_output_is_refused_before_the_heavy_imports(tmp_path):
    """``geonp infill`` onto a finished output without --overwrite: one line, exit 2, before torch
    loads; an unfinished run, another folder or nothing there are left to the fill's own checks."""
    import zarr

    from geonp.fill.finished import STATUS, is_finished

    (tmp_path / "in.nc").write_bytes(b"")  # only its existence is checked this early
    for name, status in (("done.zarr", "complete"), ("half.zarr", "incomplete")):
        zarr.open_group(str(tmp_path / name), mode="w").attrs[STATUS] = status
    (tmp_path / "photos").mkdir()
    assert is_finished(tmp_path / "done.zarr")
    assert not any(is_finished(tmp_path / n) for n in ("half.zarr", "photos", "nothing.zarr", "in.nc"))
    code = ("import sys, geonp.cli\n"
            "code = geonp.cli.main(['infill', 'in.nc', '-o', 'done.zarr'])\n"
            "print(code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "2 False"
    assert out.stderr.strip() == "geonp: error: done.zarr already exists (a complete infill output); pass " \
                                 "--overwrite to replace it"
    # A finished output that is also the input: refused for that mistake, with the fill's own words.
    from argparse import Namespace

    from geonp.cli import _check_paths
    from geonp.fill.finished import WORK, refused_early

    same = Namespace(command="infill", input=str(tmp_path / "done.zarr"), out=str(tmp_path / "done.zarr"),
                     checkpoint=None, elevation=None, overwrite=False)
    with pytest.raises(ValueError, match="the output would overwrite the input"):
        _check_paths(same)
    with pytest.raises(FileExistsError, match="already exists"):
        _check_paths(Namespace(**{**vars(same), "input": str(tmp_path / "in.nc")}))
    _check_paths(Namespace(**{**vars(same), "input": str(tmp_path / "in.nc"), "overwrite": True}))
    # A swap left behind by a run that died: the fill removes it before it refuses.
    (tmp_path / f"done.zarr{WORK}").mkdir()
    assert is_finished(tmp_path / "done.zarr") and not refused_early(tmp_path / "done.zarr")


def test_a_missing_input_is_refused_before_the_heavy_imports(tmp_path):
    """The path is checked before torch loads: the error comes in about a second, not ten."""
    import time

    for args in (("infill", str(tmp_path / "nope.nc"), "-o", str(tmp_path / "o.zarr")),
                 ("evaluate", str(tmp_path / "nope.nc"), "--var", "v", "--model", "linear"),
                 ("infill", str(tmp_path), "-o", str(tmp_path / "o.zarr"), "--checkpoint", str(tmp_path / "w.st"))):
        start = time.perf_counter()
        out = run(*args)
        assert out.returncode == 2 and "no such file or directory" in out.stderr
        assert out.stderr.strip().count("\n") == 0
    code = ("import sys, geonp.cli\n"
            "try:\n    geonp.cli.main(['infill', 'nope.nc', '-o', 'o.zarr'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert imported.stdout.strip().splitlines()[-1] == "False"
    assert time.perf_counter() - start < 30  # generous on a loaded machine; the point is the import check above
