"""Satellite L3 readers: flags to gaps, cloud gaps vs never-valid area, on real products and synthetic data."""

from __future__ import annotations

import dask
import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from conftest import real_file as real

from geonp.data.satellite import gap_fraction, gaps, modis_lst_preset, modis_lst_qc, open_satellite, quality_screen

ALBORAN = "satellite/alboran_sst_avhrr_2017-05.nc"
OLCI = "satellite/olci_chl_north_sea_2017-01.zarr"
MODIS = "satellite/modis_lst_brazil_2019-11-01.nc"


# -- synthetic: the product-agnostic core, runs without the data folder -----------------------

def synthetic() -> xr.Dataset:
    """4 steps on a 3x4 grid; column 0 is land (never a value), bit 1 = cloud, bit 2 = glint."""
    rng = np.random.default_rng(0)
    sst = rng.normal(15, 1, (4, 3, 4))
    sst[:, :, 0] = np.nan
    flags = np.zeros((4, 3, 4))
    flags[0, 1, 1] = 1  # cloud
    flags[1, 2, 2] = 2  # glint
    flags[:, 0, 3] = 1  # cloudy every time: gap in a user's mask, never valid when derived
    flags[2, 1, 1] = np.nan  # flags missing: keep the value
    coords = {"time": np.arange(4), "lat": [10.0, 10.5, 11.0], "lon": [0.0, 0.5, 1.0, 1.5]}
    return xr.Dataset({
        "sst": (("time", "lat", "lon"), sst, {"units": "degC"}),
        "flags": (("time", "lat", "lon"), flags, {"flag_masks": [1, 2], "flag_meanings": "cloud glint"}),
    }, coords=coords, attrs={"geonp_source": "synthetic.nc"})


def test_reject_flags_and_derived_valid_area():
    ds = synthetic()
    out = quality_screen(ds, "sst", reject_flags={"flags": "cloud"})
    sst = out["sst"].values
    assert np.isnan(sst[0, 1, 1]) and np.isfinite(sst[1, 2, 2]) and np.isfinite(sst[2, 1, 1])
    valid = out["valid"].values
    assert valid.dtype == bool and valid.shape == (3, 4)
    assert not valid[:, 0].any() and not valid[0, 3]  # land, and the always-cloudy cell
    assert valid.sum() == 12 - 3 - 1
    assert gaps(out).values.sum() == 1  # the one cloudy pixel inside the valid area
    both = quality_screen(ds, "sst", reject_flags={"flags": ["cloud", "glint"]})
    assert np.isnan(both["sst"].values[1, 2, 2])
    assert "flags: cloud glint" in both["sst"].attrs["geonp_rejected_flags"]


def test_user_mask_dataarray_keeps_cloudy_cells_valid():
    ds = synthetic()
    mask = xr.DataArray(np.ones((3, 4)), coords={"lat": ds["lat"], "lon": ds["lon"]}, dims=("lat", "lon"))
    mask[:, 0] = 0
    out = quality_screen(ds, "sst", reject_flags={"flags": ["cloud"]}, valid_mask=mask.isel(lat=slice(None, None, -1)))
    assert out["valid"].values.sum() == 9 and out["valid"].values[0, 3]
    assert np.allclose(gap_fraction(out).values, [2 / 9, 1 / 9, 1 / 9, 1 / 9])


def test_errors_name_the_file_and_the_problem():
    ds = synthetic()
    with pytest.raises(ValueError, match=r"synthetic\.nc.*no flag 'snow'"):
        quality_screen(ds, "sst", reject_flags={"flags": ["snow"]})
    with pytest.raises(ValueError, match=r"synthetic\.nc.*no flag variable 'qa'"):
        quality_screen(ds, "sst", reject_flags={"qa": ["cloud"]})
    with pytest.raises(ValueError, match=r"synthetic\.nc.*unknown variable 'chl'"):
        quality_screen(ds, "chl")
    shifted = xr.DataArray(np.ones((3, 4)), coords={"lat": [10.1, 10.6, 11.1], "lon": ds["lon"].values},
                           dims=("lat", "lon"))
    with pytest.raises(ValueError, match="not on the same grid"):
        quality_screen(ds, "sst", valid_mask=shifted)
    with pytest.raises(ValueError, match="neither a variable nor an existing file"):
        quality_screen(ds, "sst", valid_mask="no_such_mask")
    with pytest.raises(ValueError, match="'modis_lst' preset does not apply"):
        quality_screen(ds, "sst", preset="modis_lst")


def test_modis_qc_bits():
    # mandatory QA bits 0-1, LST error bits 6-7 (0: <=1 K, 1: <=2 K, 2: <=3 K, 3: >3 K)
    qc = xr.DataArray(np.array([0, 65, 17, 1 | 2 << 6, 2, 3, 1 | 3 << 6, np.nan], dtype=np.float32))
    assert modis_lst_qc(qc).values.tolist() == [True, True, True, False, False, False, False, False]
    assert modis_lst_qc(qc, max_error_k=3).values.tolist() == [True, True, True, True, False, False, False, False]


# -- real products ----------------------------------------------------------------------------

def test_alboran_sst_with_sea_mask():
    ds = open_satellite(real(ALBORAN), "SST", valid_mask="mask")
    assert isinstance(ds["SST"].data, dsa.Array) and isinstance(ds["valid"].data, dsa.Array)
    assert ds["SST"].dims == ("time", "lat", "lon") and ds["valid"].dims == ("lat", "lon")
    sea = xr.open_dataset(real(ALBORAN))["mask"].values == 1
    valid = ds["valid"].values
    np.testing.assert_array_equal(valid, sea)
    sst = ds["SST"].values
    assert not np.isfinite(sst[:, ~sea]).any()  # land never valid (the file has 19 stray land values)
    assert 10 < np.nanmin(sst) and np.nanmax(sst) < 30  # degC, Alboran Sea in May
    cloud = gap_fraction(ds).values  # manifest: real clouds 9-90% of the sea per day
    assert cloud.shape == (10,) and 0.08 < cloud.min() < 0.10 and 0.89 < cloud.max() < 0.91
    assert ds["SST"].attrs["geonp_valid_area"] == "valid_mask 'mask'"


def test_alboran_mask_from_another_file_and_never_observed(tmp_path):
    path = real(ALBORAN)
    mask_file = tmp_path / "sea_mask.nc"
    xr.open_dataset(path)[["mask"]].to_netcdf(mask_file)
    from_file = open_satellite(path, "SST", valid_mask=str(mask_file))
    np.testing.assert_array_equal(from_file["valid"].values, open_satellite(path, "SST", valid_mask="mask")["valid"])
    coarse = tmp_path / "coarse_mask.nc"
    xr.open_dataset(path)[["mask"]].isel(lat=slice(None, None, 2), lon=slice(None, None, 2)).to_netcdf(coarse)
    with pytest.raises(ValueError, match="not on the same grid"):
        open_satellite(path, "SST", valid_mask=str(coarse))
    derived = open_satellite(path, "SST")  # no mask: never observed in 10 days = never valid
    sea = xr.open_dataset(path)["mask"].values == 1
    valid = derived["valid"].values
    assert (valid & ~sea).sum() < 20 and (sea & ~valid).sum() < 100  # 19 stray land values, 77 sea cells


def test_olci_flags_only_remove_pixels():
    raw = open_satellite(real(OLCI), "conc_chl", preset=None)
    default = open_satellite(real(OLCI), "conc_chl")
    strict = open_satellite(real(OLCI), "conc_chl", reject_flags={"c2rcc_flags": ["Cloud_risk"]})
    assert default.attrs["geonp_preset"] == "olci" and raw.attrs["geonp_preset"] == ""
    box = {"lat": slice(0, 500), "lon": slice(0, 1000)}  # a quarter keeps the test fast
    finite = [np.isfinite(d["conc_chl"].isel(box).values) for d in (raw, default, strict)]
    assert not (finite[1] & ~finite[0]).any() and not (finite[2] & ~finite[1]).any()
    counts = [int(f.sum()) for f in finite]
    assert counts[0] >= counts[1] > counts[2] and counts[2] < 0.1 * counts[1]  # Cloud_risk is on nearly all


def test_olci_never_observed_marks_land():
    from geonp.data.cube import open_cube
    from geonp.data.flags import has_flag

    ds = open_satellite(real(OLCI), "conc_chl")
    flags = open_cube(real(OLCI), "conc_chl")["quality_flags"]
    land = has_flag(flags, "land")
    valid, some_land, always_land, cloud = dask.compute(
        ds["valid"].data, land.any("time").data, (land | np.isnan(flags)).all("time").data, gap_fraction(ds).data)
    assert not (valid & always_land & some_land).any()
    # Coastal pixels flagged land in one scene and water in another (0.3% of land) stay valid.
    assert (valid & some_land).sum() < 0.01 * some_land.sum()
    assert 0.2 < valid.mean() < 0.4  # 29% of the box seen at least once in 5 scenes
    assert cloud.shape == (5,) and cloud.min() < 0.1 and cloud.max() > 0.9


def test_modis_lst_qc_and_valid_land():
    day = open_satellite(real(MODIS), "LST_Day_1km")
    night = open_satellite(real(MODIS), "LST_Night_1km")
    assert day.attrs["geonp_preset"] == "modis_lst"
    assert day["LST_Day_1km"].dims == ("y", "x") and day["lat"].dims == ("y", "x") and day["lon"].dims == ("y", "x")
    lst = day["LST_Day_1km"].values
    assert 250 < np.nanmin(lst) and np.nanmax(lst) < 350
    valid = day["valid"].values
    np.testing.assert_array_equal(valid, night["valid"].values)  # the sea is the same by day and night
    assert 0.25 < valid.mean() < 0.35  # 71% of the tile is Atlantic
    # manifest: 21% (day) and 47% (night) of land clouded; error > 2 K adds 0.3 and 2.5 points
    assert 0.20 < float(gap_fraction(day)) < 0.23 and 0.46 < float(gap_fraction(night)) < 0.52
    loose = open_satellite(real(MODIS), "LST_Night_1km", preset=modis_lst_preset(max_error_k=3))
    assert float(gap_fraction(loose)) < float(gap_fraction(night))


def test_modis_without_preset_warns():
    with pytest.warns(UserWarning, match="one time step"):
        ds = open_satellite(real(MODIS), "LST_Day_1km", preset=None)
    assert float(gap_fraction(ds)) == 0.0


def test_unknown_variable_names_file():
    with pytest.raises(ValueError, match=r"alboran.*'sst_foo'"):
        open_satellite(real(ALBORAN), "sst_foo")
    with pytest.raises(ValueError, match=r"olci_chl.*no flag 'clouds'"):
        open_satellite(real(OLCI), "conc_chl", reject_flags={"quality_flags": ["clouds"]})
