"""pipelines/region_transfer: the protocol end to end on a small synthetic cube (train, score, table, maps)."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from geonp.data.regions import select_time
from pipelines import region_transfer


def _cube(path) -> None:
    lat, lon = np.arange(40.0, 52.0, 0.25), np.arange(0.0, 16.0, 0.25)
    la, lo = np.meshgrid(lat, lon, indexing="ij")
    t2m = 290 - 0.8 * (la - 40) + 2 * np.sin(lo / 2) + 0.5 * np.cos(la)
    xr.Dataset({"t2m": (("time", "lat", "lon"), t2m[None], {"units": "K"})},
               coords={"time": pd.date_range("2020-01-01", periods=1), "lat": lat, "lon": lon}).to_netcdf(path)


def test_the_protocol_runs_end_to_end_and_keeps_earlier_rows(tmp_path, monkeypatch):
    _cube(tmp_path / "cube.nc")
    cfg = {"name": "tiny", "description": "synthetic", "runs": str(tmp_path / "runs"),
           "data": {"path": str(tmp_path / "cube.nc"), "variable": "t2m", "units": "K", "inputs": ["lat", "lon"],
                    "window": [10, 10], "context_fraction": [0.05, 0.3]},
           "train": {"region": {"name": "west", "lat": [40, 51.75], "lon": [0, 7.75]}},
           "test": [{"region": {"name": "east", "lat": [40, 51.75], "lon": [8, 15.75]}}],
           "training": {"steps": 3, "batch_size": 4, "val_tasks": 4, "checkpoint_every": 3, "val_every": 3},
           "models": {"cnp": {"preset": "tiny"}, "te-pt-tnp": {"preset": "tiny"}, "linear": {}},
           "evaluation": {"tasks": 8, "batch_size": 4, "seed": 1}, "out": str(tmp_path / "out" / "rt.md")}
    config = tmp_path / "rt.yaml"
    config.write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr(sys, "argv", ["region_transfer", str(config)])
    region_transfer.main()
    text = (tmp_path / "out" / "rt.md").read_text()
    assert "| model | west (train) | east | commit |" in text
    for model in ("cnp", "te-pt-tnp", "linear"):
        assert text.count(f"| {model} | ") == 2  # a log-likelihood row and a skill row
    assert (tmp_path / "runs" / "cnp" / "model.safetensors").exists()
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == [
        "region_transfer_tiny_east.png", "region_transfer_tiny_west.png"]

    # Scoring again keeps the other models' rows, and a finished run is reused, not retrained.
    trained = (tmp_path / "runs" / "cnp" / "model.safetensors").read_bytes()
    maps = {p.name: p.read_bytes() for p in (tmp_path / "out").glob("*.png")}
    monkeypatch.setattr(sys, "argv", ["region_transfer", str(config), "--models", "linear", "cnp"])
    region_transfer.main()
    again = (tmp_path / "out" / "rt.md").read_text()
    assert again.count("| te-pt-tnp | ") == 2 and again.count("| linear | ") == 2
    assert (tmp_path / "runs" / "cnp" / "model.safetensors").read_bytes() == trained
    # The maps show te-pt-tnp; a run without it leaves them as they were.
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").glob("*.png")} == maps


def test_a_run_in_parts_trains_in_the_given_folder_and_scores_only_when_asked(tmp_path, monkeypatch):
    import json

    _cube(tmp_path / "cube.nc")
    cfg = {"name": "tiny", "description": "synthetic",
           "data": {"path": str(tmp_path / "cube.nc"), "variable": "t2m", "units": "K", "inputs": ["lat", "lon"],
                    "window": [10, 10], "context_fraction": [0.05, 0.3]},
           "train": {"region": {"name": "west", "lat": [40, 51.75], "lon": [0, 7.75]}},
           "test": [{"region": {"name": "east", "lat": [40, 51.75], "lon": [8, 15.75]}}],
           "training": {"steps": 4, "batch_size": 4, "val_tasks": 4, "checkpoint_every": 2, "val_every": 2},
           "models": {"cnp": {"preset": "tiny"}},
           "evaluation": {"tasks": 8, "batch_size": 4, "seed": 1}, "out": str(tmp_path / "out" / "rt.md")}
    config = tmp_path / "rt.yaml"
    config.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "kept"
    monkeypatch.setattr(sys, "argv", ["region_transfer", str(config), "--runs", str(runs), "--steps", "2",
                                      "--train-only"])
    region_transfer.main()
    assert json.loads((runs / "cnp" / "summary.json").read_text())["step"] == 2
    assert not (tmp_path / "out").exists()  # nothing scored yet
    monkeypatch.setattr(sys, "argv", ["region_transfer", str(config), "--runs", str(runs)])
    region_transfer.main()  # resumes to the config's 4 steps, then scores
    assert json.loads((runs / "cnp" / "summary.json").read_text())["step"] == 4
    assert (tmp_path / "out" / "rt.md").read_text().count("| cnp | ") == 2


def test_unknown_keys_are_refused_and_time_slices_select_dates(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"name": "x", "modles": {}}))
    with pytest.raises(SystemExit, match="unknown key\\(s\\) modles"):
        region_transfer.load_config(config)
    cube = xr.Dataset({"t": ("time", np.arange(10.0))}, coords={"time": pd.date_range("2019-03-01", periods=10)})
    assert select_time(cube, ["2019-03-03", "2019-03-05"], "c").sizes["time"] == 3
    with pytest.raises(ValueError, match="no time step between"):
        select_time(cube, ["2020-01-01", "2020-01-02"], "c")
