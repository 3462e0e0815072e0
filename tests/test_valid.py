"""One valid-area rule (geonp.data.valid) for infill, evaluate and open_satellite."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from geonp.data.satellite import quality_screen
from geonp.data.valid import valid_area
from geonp.evaluate import static_valid_area
from geonp.fill.field import valid_cells as infill_valid_cells
from geonp.tasks.windows import canonical


@pytest.fixture
def cube() -> xr.Dataset:
    rng = np.random.default_rng(0)
    sst = 15 + rng.normal(size=(3, 8, 10))
    sst[:, :3, :3] = np.nan  # land: never observed
    sst[rng.random(sst.shape) < 0.2] = np.nan  # clouds
    sea = np.ones((8, 10))
    sea[:3, :3] = 0.0
    sea[7, 9] = 0.3  # a coastal fraction below one half: not valid
    return xr.Dataset({"sst": (("time", "lat", "lon"), sst), "sea": (("lat", "lon"), sea)},
                      coords={"time": pd.date_range("2020", periods=3), "lat": np.arange(8.0),
                              "lon": np.arange(10.0)}, attrs={"geonp_source": "cube.nc"})


def _three_ways(ds: xr.Dataset, spec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    infill = infill_valid_cells(ds, spec, canonical(ds, "sst", "cube.nc"), "cube.nc")
    evaluate = static_valid_area(ds, ds["sst"], spec, "cube.nc").values
    satellite = quality_screen(ds, "sst", valid_mask=spec, preset=None)["valid"].values
    return infill, evaluate, satellite


@pytest.mark.parametrize("spec", ["sea", "observed", "all", "file", "dataarray"])
def test_infill_evaluate_and_open_satellite_agree_on_a_named_mask(cube, tmp_path, spec):
    word = spec
    if spec == "file":
        cube[["sea"]].to_netcdf(tmp_path / "sea.nc")
        spec = str(tmp_path / "sea.nc")
    elif spec == "dataarray":
        spec = cube["sea"].isel(lat=slice(None, None, -1))  # north to south: matched by coordinates
    infill, evaluate, satellite = _three_ways(cube, spec)
    np.testing.assert_array_equal(infill, evaluate)
    np.testing.assert_array_equal(infill, satellite)
    land = infill[:3, :3]
    assert (not land.any()) if word != "all" else land.all()
    assert infill[4, 5] and (word in ("observed", "all") or not infill[7, 9])  # > 0.5 is valid, 0.3 is not


def test_without_a_mask_a_cube_is_valid_everywhere_and_its_valid_variable_wins(cube):
    plain = cube.drop_vars("sea")
    mask, how = valid_area(plain, plain["sst"])
    assert bool(mask.all()) and how.startswith("every cell")  # a reanalysis's permanent hole gets filled
    screened = quality_screen(plain, "sst", preset=None)  # a satellite product: never observed = never valid
    np.testing.assert_array_equal(screened["valid"].values, np.isfinite(plain["sst"].values).any(0))
    infill, evaluate, _ = _three_ways(screened, None)  # its 'valid' variable is what infill and evaluate use
    np.testing.assert_array_equal(infill, screened["valid"].values)
    np.testing.assert_array_equal(evaluate, screened["valid"].values)


def test_a_mask_that_cannot_be_found_or_is_off_grid_is_one_line(cube, tmp_path):
    with pytest.raises(ValueError, match="'nope' is neither a variable nor an existing file"):
        valid_area(cube, cube["sst"], "nope", "cube.nc")
    other = xr.Dataset({"m": (("lat", "lon"), np.ones((4, 4)))}, coords={"lat": np.arange(4.0) + 50,
                                                                           "lon": np.arange(4.0)})
    other.to_netcdf(tmp_path / "other.nc")
    with pytest.raises(ValueError, match="not on the same grid"):
        valid_area(cube, cube["sst"], str(tmp_path / "other.nc"), "cube.nc")
