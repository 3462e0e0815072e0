"""``ds.geonp``: the accessor returns what the command line writes, and leaves its input alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from conftest import smooth_cube

import geonp  # noqa: F401  (registers the accessor)
from geonp.cli import main


@pytest.fixture
def era5_style(tmp_path: Path) -> tuple[xr.Dataset, Path]:
    """The smooth cube as an ERA5 NetCDF names it: (valid_time, latitude, longitude)."""
    ds = smooth_cube().rename(time="valid_time", lat="latitude", lon="longitude")
    path = tmp_path / "cube.nc"
    ds.to_netcdf(path)
    return xr.open_dataset(path), path


def test_infill_equals_the_cli(era5_style, tmp_path):
    ds, path = era5_style
    before = ds.copy(deep=True)
    out = ds.geonp.infill("sst", model="kriging", valid_mask="valid", fit_steps=0)
    assert main(["infill", str(path), "-o", str(tmp_path / "out.zarr"), "--var", "sst", "--model", "kriging",
                 "--valid-mask", "valid", "--fit-steps", "0", "-q"]) == 0
    cli = xr.open_zarr(tmp_path / "out.zarr")
    for name in ("sst", "sst_std", "sst_flag"):
        np.testing.assert_array_equal(out[name].values, cli[name].values)
    assert int((out["sst_flag"] == 1).sum()) > 0
    xr.testing.assert_identical(ds, before)  # the input is untouched


def test_evaluate_and_plot(era5_style, tmp_path):
    ds, _ = era5_style
    result = ds.geonp.evaluate("sst", "linear", valid_mask="valid")
    assert [row["model"] for row in result["rows"]] == ["linear"]
    assert result["hidden_cells"] > 0 and all(np.isfinite(row["rmse"]) for row in result["rows"])
    out = ds.geonp.infill("sst", model="linear", valid_mask="valid")
    fig = out.geonp.plot(time=1)
    assert [ax.get_label() for ax in fig.axes if ax.get_label().startswith("panel:")] == [
        "panel:value", "panel:value", "panel:std", "panel:flag"]
    png = out.geonp.plot("sst", path=tmp_path / "map.png", dpi=40)
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="holds 0 filled variables"):
        ds.geonp.plot()
    with pytest.raises(ValueError, match="--var nope: no such variable"):
        ds.geonp.infill("nope", model="linear")


def test_import_geonp_leaves_torch_unloaded():
    root = Path(__file__).resolve().parents[1]
    code = ("import sys, xarray as xr, geonp; assert hasattr(xr.Dataset(), 'geonp'); "
            "heavy = [m for m in ('torch', 'matplotlib', 'cartopy') if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)
