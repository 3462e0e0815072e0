"""The output is the input, filled (issue #16 §6): same dimensions, coordinates and attributes.

A property test draws inputs in the layouts users bring (ERA5's north-to-south latitude and
``valid_time``, 0..360 longitudes, a single scene without a time axis, projected grids with 2-D
lat/lon and a grid mapping) and checks that ``geonp infill``'s finished store lines up with the
input in xarray, holds the observed values unchanged and no resume bookkeeping.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from conftest import real_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geonp
from geonp.fill.engine import infill_file
from geonp.fill.output import PROGRESS, WITHOUT_CONTEXT, WORK, InfillStore, is_complete, output_template


def _input(lat_descending: bool, lon_0_360: bool, time: str, names: str, projected: bool, seed: int) -> xr.Dataset:
    """A small field with a square gap, in the layout described by the arguments."""
    rng = np.random.default_rng(seed)
    ny, nx = 9, 11
    lat = np.linspace(40.0, 48.0, ny)[::-1 if lat_descending else 1]
    lon = np.linspace(-6.0, 4.0, nx)
    lon = np.where(lon < 0, lon + 360.0, lon) if lon_0_360 else lon  # crosses 0/360 unsorted otherwise
    if lon_0_360:
        lon = np.sort(lon)  # 0..4 then 354..359: the file's own (ascending) order
    steps = 3 if time == "axis" else 1
    values = (rng.normal(280.0, 3.0, (steps, ny, nx))).astype(np.float32)
    values[:, 3:6, 4:8] = np.nan
    y, x = ("y", "x") if projected else (("latitude", "longitude") if names == "era5" else ("lat", "lon"))
    tname = "valid_time" if names == "era5" else "time"
    times = pd.date_range("2021-06-01T12", periods=steps, freq="6h")
    attrs = {"units": "K", "long_name": "2 metre temperature", "grid_mapping": "crs"} if projected else \
        {"units": "K", "long_name": "2 metre temperature"}
    dims = (y, x) if time != "axis" else (tname, y, x)
    data = values[0] if time != "axis" else values
    ds = xr.Dataset({"t2m": (dims, data, attrs)},
                    attrs={"Conventions": "CF-1.7", "institution": "test", "history": "made by a test"})
    if projected:
        lon2, lat2 = np.meshgrid(lon, lat)
        ds = ds.assign_coords(y=(y, np.arange(ny) * 1000.0), x=(x, np.arange(nx) * 1000.0),
                              lat=((y, x), lat2 + 0.01 * np.arange(nx), {"units": "degrees_north"}),
                              lon=((y, x), lon2, {"units": "degrees_east"}))
        ds["crs"] = xr.DataArray(np.int32(0), attrs={"grid_mapping_name": "latitude_longitude"})
    else:
        ds = ds.assign_coords({y: (y, lat, {"units": "degrees_north"}), x: (x, lon, {"units": "degrees_east"})})
    if time == "axis":
        ds = ds.assign_coords({tname: times})
    elif time == "scalar":
        ds = ds.assign_coords({tname: times[0]})
    return ds


def _check_same_layout(given: xr.Dataset, out: xr.Dataset) -> None:
    assert out["t2m"].dims == given["t2m"].dims
    for layer in ("t2m_std", "t2m_flag"):
        assert out[layer].dims == given["t2m"].dims
    assert set(given.coords) == set(out.coords)
    for name in given.coords:
        xr.testing.assert_identical(out[name].reset_coords(drop=True).load(), given[name].reset_coords(drop=True))
    for key, value in given.attrs.items():
        if key not in ("history", "Conventions"):
            assert out.attrs[key] == value
    # The output names the CF version geonp writes; the input's is kept beside it.
    assert out.attrs["Conventions"] == "CF-1.11"
    assert out.attrs.get("geonp_input_conventions") == given.attrs.get("Conventions")
    assert out.attrs["history"].endswith("made by a test")
    assert PROGRESS not in out.variables and WITHOUT_CONTEXT not in out.variables
    # Aligns with the input exactly, observed cells unchanged, every gap filled.
    xr.align(given, out, join="exact")
    observed = np.isfinite(given["t2m"].values)
    np.testing.assert_array_equal(out["t2m"].values[observed], given["t2m"].values[observed])
    assert np.isfinite(out["t2m"].values).all()
    assert (out["t2m_flag"].values[~observed] == 1).all() and (out["t2m_flag"].values[observed] == 0).all()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lat_descending=st.booleans(), lon_0_360=st.booleans(), time=st.sampled_from(["none", "scalar", "axis"]),
       names=st.sampled_from(["era5", "short"]), projected=st.booleans(), seed=st.integers(0, 3),
       suffix=st.sampled_from([".nc", ".zarr"]))
def test_the_finished_store_has_the_inputs_layout(tmp_path_factory, lat_descending, lon_0_360, time, names,
                                                   projected, seed, suffix) -> None:
    folder = tmp_path_factory.mktemp("layout")
    given_ds = _input(lat_descending, lon_0_360, time, names, projected, seed)
    path = folder / f"in{suffix}"
    given_ds.to_netcdf(path) if suffix == ".nc" else given_ds.to_zarr(path)
    reread = xr.open_zarr(path) if suffix == ".zarr" else xr.open_dataset(path)
    infill_file(str(path), folder / "out.zarr", model="linear", progress=False, fit_steps=0)
    out = xr.open_zarr(folder / "out.zarr")
    assert is_complete(folder / "out.zarr")
    _check_same_layout(reread.load(), out)
    assert not any(p.name.startswith("out.zarr.") for p in folder.iterdir())  # no temporary stores left


@pytest.mark.parametrize("time, names", [("scalar", "era5"), ("none", "short"), ("axis", "short")])
def test_the_accessor_returns_the_inputs_layout(time: str, names: str) -> None:
    # In memory (no store between): the working cube keeps a north-to-south latitude as given.
    given_ds = _input(True, True, time, names, False, 0)
    out = given_ds.geonp.infill(model="linear", fit_steps=0)
    _check_same_layout(given_ds, out)


def test_a_swap_cut_short_is_put_back_and_resumed(tmp_path: Path) -> None:
    """Killed between finish's two renames: the next run finds the work store and finishes it."""
    given_ds = _input(False, False, "axis", "short", False, 0)
    given_ds.to_zarr(tmp_path / "in.zarr")
    from geonp.data import open_cube

    cube = open_cube(tmp_path / "in.zarr").chunk({"time": 1})
    request = {"input": "in.zarr"}
    store = InfillStore(tmp_path / "out.zarr", output_template(cube, ["t2m"]), request)
    for index, region in store.blocks():
        obs = cube["t2m"].isel(region).values
        store.write_block(index, region, {"t2m": np.nan_to_num(obs, nan=1.0), "t2m_std": np.zeros_like(obs),
                                          "t2m_flag": np.isnan(obs).astype(np.int8)})
    os.replace(tmp_path / "out.zarr", tmp_path / f"out.zarr{WORK}")  # the first rename, then "killed"
    again = InfillStore(tmp_path / "out.zarr", output_template(cube, ["t2m"]), request)
    assert again.resumed and again.done().all()
    again.finish()
    assert is_complete(tmp_path / "out.zarr") and not (tmp_path / f"out.zarr{WORK}").exists()
    out = xr.open_zarr(tmp_path / "out.zarr")
    assert out["t2m"].dims == ("time", "lat", "lon") and PROGRESS not in out


def test_a_real_era5_scene_comes_back_with_its_names(tmp_path: Path) -> None:
    """ERA5 as the CDS delivers it: (latitude, longitude) north to south, scalar time and valid_time."""
    era5 = xr.open_dataset(real_file("era5/era5_t2m_europe_2017-01-01T12.nc")).load()
    era5["t2m"][40:60, 50:90] = np.nan
    era5.to_netcdf(tmp_path / "in.nc")
    infill_file(str(tmp_path / "in.nc"), tmp_path / "out.zarr", model="linear", progress=False)
    out = xr.open_zarr(tmp_path / "out.zarr")
    assert out["t2m"].dims == ("latitude", "longitude")
    assert {"time", "valid_time"} <= set(out.coords)
    assert out.attrs["institution"] == era5.attrs["institution"]
    xr.align(era5, out, join="exact")


def test_an_output_in_era5_names_is_drawn(tmp_path: Path) -> None:
    """geonp plot reads the output in its input's names (latitude, longitude, valid_time)."""
    from geonp.maps import plot_file

    given_ds = _input(True, False, "axis", "era5", False, 1)
    given_ds.to_netcdf(tmp_path / "in.nc")
    infill_file(str(tmp_path / "in.nc"), tmp_path / "out.zarr", model="linear", progress=False, fit_steps=0)
    png = plot_file(tmp_path / "out.zarr", tmp_path / "map.png", time="2021-06-01T18", truth=str(tmp_path / "in.nc"))
    assert png.stat().st_size > 10_000


def test_input_coordinates_with_conflicting_fill_encodings(tmp_path: Path) -> None:
    """A crop of the Alboran scene re-saved by xarray: its time holds missing_value and _FillValue
    both; the output keeps only how the time is stored (units, calendar, dtype)."""
    scene = xr.open_dataset(real_file("satellite/alboran_sst_avhrr_2017-05.nc")).isel(
        time=slice(0, 2), lat=slice(100, 160), lon=slice(150, 230)).load()
    scene.to_netcdf(tmp_path / "crop.nc")
    infill_file(str(tmp_path / "crop.nc"), tmp_path / "out.zarr", ["SST"], "linear", satellite=True,
                valid_mask="mask", progress=False, fit_steps=0)
    out = xr.open_zarr(tmp_path / "out.zarr")
    xr.align(xr.open_dataset(tmp_path / "crop.nc"), out, join="exact")
    assert out["SST"].dims == ("time", "lat", "lon") and is_complete(tmp_path / "out.zarr")


def test_a_north_to_south_scene_without_time_comes_back_as_given() -> None:
    # A single satellite scene in memory, latitude north to south (the case the infill benchmark hit).
    rng = np.random.default_rng(0)
    values = rng.normal(280.0, 1.0, (48, 48)).astype(np.float32)  # the output layers are float32
    values[10:20, 5:30] = np.nan
    given_ds = xr.Dataset({"t2m": (("lat", "lon"), values, {"units": "K"})},
                          coords={"lat": np.linspace(50.0, 45.0, 48), "lon": np.linspace(5.0, 10.0, 48)},
                          attrs={"history": "made by a test"})
    out = geonp.infill(given_ds, "t2m", model="linear", fit_steps=0)
    _check_same_layout(given_ds, out)


def test_a_bounds_attribute_whose_variable_was_left_behind_is_dropped() -> None:
    # HadISST's time names a time_bnds that a one-variable read leaves behind: CF requires the named
    # variable, so the output must not point at nothing; a bounds variable that is there stays.
    given = _input(False, False, "axis", "plain", False, 0)
    given["time"].attrs["bounds"] = "time_bnds"
    given["lat"].attrs["bounds"] = "lat_bnds"
    lat = given["lat"].values
    given["lat_bnds"] = (("lat", "bnds"), np.stack([lat - 0.5, lat + 0.5], axis=1))
    out = geonp.infill(given, "t2m", model="linear", fit_steps=0)
    assert "bounds" not in out["time"].attrs and "bounds" not in out["time"].encoding
    assert out["lat"].attrs["bounds"] == "lat_bnds" and "lat_bnds" in out.variables
