"""pipelines/benchmarks/region_transfer_windows: the protocol on infill windows end to end on a small synthetic cube."""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from geonp.checkpoint import read_checkpoint
from geonp.fill.predictor import STACK_METHODS, takes_elevation
from pipelines.benchmarks import region_transfer_windows


def _cube_and_dem(tmp_path) -> None:
    lat, lon = np.arange(40.0, 46.0, 0.25), np.arange(0.0, 12.0, 0.25)
    la, lo = np.meshgrid(lat, lon, indexing="ij")
    height = 400 * (1 + np.sin(lo / 2) * np.cos(la / 3))
    steps = pd.date_range("2020-01-01", periods=6, freq="h")
    t2m = np.stack([290 - 0.8 * (la - 40) - 0.0065 * height + 0.3 * k for k in range(6)])
    xr.Dataset({"t2m": (("time", "lat", "lon"), t2m, {"units": "K"})},
               coords={"time": steps, "lat": lat, "lon": lon}).to_netcdf(tmp_path / "cube.nc")
    xr.Dataset({"elevation": (("lat", "lon"), height, {"units": "m"})},
               coords={"lat": lat, "lon": lon}).to_netcdf(tmp_path / "dem.nc")


def test_the_windows_protocol_trains_scores_every_split_and_keeps_earlier_rows(tmp_path, monkeypatch):
    _cube_and_dem(tmp_path)
    cfg = {"name": "tiny", "description": "synthetic", "runs": str(tmp_path / "runs"),
           "data": {"path": str(tmp_path / "cube.nc"), "variable": "t2m", "units": "K",
                    "elevation": str(tmp_path / "dem.nc")},
           "train": {"region": {"name": "west", "lat": [40, 45.75], "lon": [0, 5.75]},
                     "time": ["2020-01-01T00", "2020-01-01T03"]},
           "test": [{"region": {"name": "east", "lat": [40, 45.75], "lon": [6, 11.75]},
                     "time": ["2020-01-01T04", "2020-01-01T05"]}],
           "training": {"steps": 2, "batch_size": 2, "val_tasks": 2, "checkpoint_every": 2, "val_every": 2,
                        "synthetic": 0.0, "window": {"max_context": 128}},
           "models": {"cnp": {"preset": "tiny"}, "linear": {}},
           "evaluation": {"seed": 1}, "out": str(tmp_path / "out" / "rt.md"), "figures": "cnp"}
    config = tmp_path / "rt.yaml"
    config.write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr(sys, "argv", ["region_transfer_windows", str(config)])
    region_transfer_windows.main()
    text = (tmp_path / "out" / "rt.md").read_text()
    assert "| model | west (train) | east | commit |" in text and "| cnp |" in text and "| linear |" in text
    # The figures model's fill of every split, drawn beside the table.
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == ["rt_east.png", "rt_west.png"]
    # The trained model is an infill checkpoint that takes elevation, trained on the west's first hours.
    model = tmp_path / "runs" / "cnp" / "model.safetensors"
    assert takes_elevation("cnp", model) and read_checkpoint(model)[1]["inputs"] == {"kind": "windows"}
    run = yaml.safe_load((tmp_path / "runs" / "cnp" / "config.yaml").read_text())
    assert run["data"]["files"][0]["region"] == [40, 45.75, 0, 5.75]
    assert run["data"]["files"][0]["time"] == ["2020-01-01T00", "2020-01-01T03"]
    rows = json.loads((tmp_path / "out" / "rt.json").read_text())["rows"]
    assert rows["cnp"]["east"]["hidden_cells"] == rows["linear"]["east"]["hidden_cells"] > 0
    # A run of one model keeps the other's rows.
    monkeypatch.setattr(sys, "argv", ["region_transfer_windows", str(config), "--models", "linear"])
    region_transfer_windows.main()
    assert "| cnp |" in (tmp_path / "out" / "rt.md").read_text()


PROTOCOLS = sorted((region_transfer_windows.REPO / "pipelines/configs/region_transfer").glob("*.yaml"))


@pytest.mark.parametrize("path", PROTOCOLS, ids=lambda p: p.stem)
def test_every_committed_protocol_builds_its_models_and_training_runs(path):
    """A config that would fail an hour into a run (a model argument misspelt, a split's region
    unknown) fails here: every model builds with the protocol's inputs and every trained one gets
    a valid training config."""
    from geonp.data.regions import get_region
    from geonp.models import build

    cfg = region_transfer_windows.load_config(path)
    for split in [cfg["train"], *cfg["test"]]:
        get_region(split["region"])
    dim_x = 4 if cfg["data"].get("elevation") else 3
    for name, spec in cfg["models"].items():
        spec = spec or {}
        if spec.get("model", name) in STACK_METHODS:  # kriging, dineof: fitted on the field itself
            continue
        model = build(spec.get("model", name), dim_x, 1, preset=spec.get("preset", "tiny"), **spec.get("args", {}))
        if model.trainable and not spec.get("weights"):
            config = region_transfer_windows.train_config(cfg, name, None)
            assert config.data["name"] == "windows" and config.data["val_files"]
        elif spec.get("weights"):
            assert (region_transfer_windows.REPO / spec["weights"]).is_file(), spec["weights"]
