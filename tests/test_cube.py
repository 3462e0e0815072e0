"""open_cube: every real file opens lazily in one convention, and every bad input is named."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from conftest import data_dir

from geonp.data import open_cube

DATA = data_dir()
needs_data = pytest.mark.skipif(DATA is None, reason="shared data folder absent (set GEONP_DATA)")

REAL_FILES = [
    "era5/era5_t2m_europe_2017-01-01T12.nc",
    "era5/era5_t2m_uk_2019-03_hourly.nc",
    "era5/era5_usa_1995-07-14T12.nc",
    "elevation/era5_orography_0p25.nc",
    "elevation/etopo20.nc",
    "reanalysis/wfde5_tair_uk_2017-01_hourly_0p5.nc",
    "reanalysis/era5land_iberia_monthly_1991-1992.nc",
    "reanalysis/ersstv5_monthly_2010-2020.nc",
    "satellite/alboran_sst_avhrr_2017-05.nc",
    "satellite/olci_chl_north_sea_2017-01.zarr",
    "satellite/modis_lst_brazil_2019-11-01.nc",
]


@needs_data
@pytest.mark.parametrize("name", REAL_FILES)
def test_real_files_open_lazily_in_the_convention(name):
    ds = open_cube(DATA / name)
    assert {"lat", "lon"} <= set(ds.coords)
    assert float(ds["lon"].min()) >= -180.0 and float(ds["lon"].max()) < 180.0
    for v in ds.data_vars:
        assert ds[v].chunks is not None, f"{v} was loaded eagerly"
    if "lat" in ds.dims:
        assert np.all(np.diff(ds["lat"].values) > 0) and np.all(np.diff(ds["lon"].values) > 0)
    if "time" in ds.dims:
        assert np.all(np.diff(ds["time"].values) > np.timedelta64(0, "s"))


@needs_data
@pytest.mark.parametrize("stem", ["era5_t2m_europe_2017-01-01T12", "era5_t2m_uk_2019-03_hourly"])
def test_grib_and_its_netcdf_twin_agree(stem):
    grib = open_cube(DATA / "era5" / f"{stem}.grib")
    nc = open_cube(DATA / "era5" / f"{stem}.nc")
    assert list(grib.data_vars) == list(nc.data_vars) == ["t2m"]
    xr.testing.assert_allclose(grib["t2m"].reset_coords(drop=True), nc["t2m"].reset_coords(drop=True))
    np.testing.assert_array_equal(grib["time"].values, nc["time"].values)


@needs_data
def test_wrapped_longitudes_come_out_once_in_range():
    ds = open_cube(DATA / "elevation" / "etopo20.nc")
    lon = ds["lon"].values
    assert lon.min() >= -180 and lon.max() < 180 and len(np.unique(lon)) == lon.size == 1080
    raw = xr.open_dataset(DATA / "elevation" / "etopo20.nc")
    # 20.17 E stays 20.17 E; 200.17 E becomes -159.83 E with the same values.
    np.testing.assert_array_equal(ds["elevation"].sel(lon=20.1667, method="nearest").values,
                                  raw["elevation"].isel(lon=0).values)
    np.testing.assert_array_equal(ds["elevation"].sel(lon=-159.8333, method="nearest").values,
                                  raw["elevation"].sel(lon=200.1667, method="nearest").values)


@needs_data
def test_era5_orography_lon_0_360_and_latitude_flipped():
    ds = open_cube(DATA / "elevation" / "era5_orography_0p25.nc")
    raw = xr.open_dataset(DATA / "elevation" / "era5_orography_0p25.nc")
    assert ds["lat"].values[0] == -90 and ds["lon"].values[0] == -180
    np.testing.assert_allclose(float(ds["z"].sel(lat=47.0, lon=-120.0).squeeze()),
                               float(raw["z"].sel(latitude=47.0, longitude=240.0).squeeze()))


@needs_data
def test_modis_sinusoidal_keeps_2d_lat_lon():
    ds = open_cube(DATA / "satellite" / "modis_lst_brazil_2019-11-01.nc", "LST_Day_1km")
    assert ds["LST_Day_1km"].dims == ("y", "x")
    assert ds["lat"].dims == ("y", "x") and ds["lon"].dims == ("y", "x")
    assert -41 < float(ds["lon"].min()) < float(ds["lon"].max()) < -29


@needs_data
def test_product_validity_expression_and_fill_values_become_nan():
    ds = open_cube(DATA / "satellite" / "olci_chl_north_sea_2017-01.zarr", "conc_chl")
    raw = xr.open_zarr(DATA / "satellite" / "olci_chl_north_sea_2017-01.zarr")
    scene = dict(time=0, lat=slice(0, 250), lon=slice(0, 250))
    masked = np.isnan(ds["conc_chl"].isel(scene).values)
    flags = raw["c2rcc_flags"].sortby("lat").isel(scene).fillna(0).values.astype(np.int64)
    valid_bit = (flags & (1 << 31)) != 0  # Valid_PE is bit 31, stored as the mask -2**31
    assert (~valid_bit).any() and masked[~valid_bit].all()
    assert "c2rcc_flags" in ds  # flags travel with the field for the satellite readers
    sst = open_cube(DATA / "satellite" / "alboran_sst_avhrr_2017-05.nc", "SST")
    assert float(sst["SST"].max()) < 40  # the 99999 fill value is gone


def _cube(tmp_path, name="cube.nc", **changes):
    lat = np.linspace(40, 45, 6)
    lon = np.linspace(5, 12, 8)
    time = pd.date_range("2020-01-01", periods=4, freq="6h")
    values = np.random.default_rng(0).normal(280, 5, (4, 6, 8)).astype(np.float32)
    ds = xr.Dataset({"t2m": (("time", "latitude", "longitude"), values)},
                    coords={"time": time, "latitude": lat, "longitude": lon})
    for key, value in changes.items():
        ds = value(ds) if callable(value) else ds.assign_coords({key: value})
    path = tmp_path / name
    if name.endswith(".zarr"):
        ds.to_zarr(path, zarr_format=3 if "v3" in name else 2, consolidated=True)
    else:
        ds.to_netcdf(path)
    return path


def test_zarr_v2_v3_netcdf_and_url_agree(tmp_path):
    nc = open_cube(_cube(tmp_path, "a.nc"))
    for other in (_cube(tmp_path, "b_v2.zarr"), _cube(tmp_path, "c_v3.zarr")):
        xr.testing.assert_identical(open_cube(other)["t2m"], nc["t2m"])
    url = open_cube("file://" + str(tmp_path / "a.nc"))
    xr.testing.assert_identical(url["t2m"], nc["t2m"])


def test_valid_time_is_the_time_axis_and_expver_is_merged(tmp_path):
    lat, lon = np.arange(3.0), np.arange(4.0)
    vt = pd.date_range("2024-01-31", periods=3, freq="D")
    final = np.array([1.0, 2.0, np.nan])[:, None, None] * np.ones((3, 3, 4))
    prelim = np.array([np.nan, np.nan, 3.0])[:, None, None] * np.ones((3, 3, 4))
    ds = xr.Dataset({"t2m": (("expver", "valid_time", "latitude", "longitude"), np.stack([final, prelim]))},
                    coords={"valid_time": vt, "latitude": lat, "longitude": lon, "expver": ["0001", "0005"],
                            "number": 0})
    ds.to_netcdf(tmp_path / "new_cds.nc")
    out = open_cube(tmp_path / "new_cds.nc")
    assert "expver" not in out.variables and "number" not in out.variables
    np.testing.assert_array_equal(out["time"].values, vt.values)
    np.testing.assert_array_equal(out["t2m"].values[:, 0, 0], [1.0, 2.0, 3.0])


def test_scale_factor_and_valid_range_applied(tmp_path):
    packed = xr.Dataset({"sst": (("lat", "lon"), np.array([[100, 200], [32767, 5000]], np.int16))},
                        coords={"lat": [1.0, 2.0], "lon": [3.0, 4.0]})
    packed["sst"].attrs.update(scale_factor=0.01, add_offset=0.0, _FillValue=np.int16(32767), valid_max=np.int16(4000))
    packed.to_netcdf(tmp_path / "packed.nc")
    out = open_cube(tmp_path / "packed.nc")["sst"].values
    np.testing.assert_allclose(out[0], [1.0, 2.0])
    assert np.isnan(out[1]).all()  # fill value and above valid_max


def test_geotiff_geographic_and_projected(tmp_path):
    import rioxarray  # noqa: F401 - the test extra: the suite reads GeoTIFF
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    geo = xr.DataArray(values, dims=("y", "x"), coords={"y": [46.0, 45.5, 45.0], "x": [6.0, 6.5, 7.0, 7.5]})
    geo.rio.write_crs("EPSG:4326", inplace=True).rio.to_raster(tmp_path / "geo.tif")
    ds = open_cube(tmp_path / "geo.tif")
    assert ds["geo"].dims == ("lat", "lon") and ds["lat"].values[0] == 45.0
    np.testing.assert_array_equal(ds["geo"].values, values[::-1])
    proj = xr.DataArray(values, dims=("y", "x"), coords={"y": [2.6e6, 2.599e6, 2.598e6],
                                                         "x": [4.0e6, 4.001e6, 4.002e6, 4.003e6]})
    proj.rio.write_crs("EPSG:3035", inplace=True).rio.to_raster(tmp_path / "laea.tif")
    ds = open_cube(tmp_path / "laea.tif")
    assert ds["lat"].dims == ("y", "x")
    assert 45 < float(ds["lat"].mean()) < 56 and 5 < float(ds["lon"].mean()) < 15  # EPSG:3035 near (52N, 10E)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"latitude": np.array([40, 41, 43, 42, 44, 45.0])}, "lat is not monotonic"),
        ({"time": pd.to_datetime(["2020-01-01"] * 2 + ["2020-01-02", "2020-01-03"])}, "duplicate times"),
        ({"time": pd.to_datetime(["2020-01-02", "2020-01-01", "2020-01-03", "2020-01-04"])}, "time is not monotonic"),
        ({"nan": lambda ds: ds.assign(t2m=ds["t2m"] * np.nan)}, "holds no finite value"),
        ({"nolat": lambda ds: ds.rename(latitude="row").drop_vars("row")}, "no latitude coordinate"),
    ],
)
def test_bad_cubes_raise_a_value_error_naming_the_file(tmp_path, change, message):
    path = _cube(tmp_path, **change)
    with pytest.raises(ValueError, match=message) as err:
        open_cube(path)
    assert str(path) in str(err.value)


def test_unknown_variable_and_missing_or_unreadable_file(tmp_path):
    path = _cube(tmp_path)
    with pytest.raises(ValueError, match="unknown variable 'sst'; the file has t2m"):
        open_cube(path, ["sst"])
    with pytest.raises(FileNotFoundError, match="nope.nc"):
        open_cube(tmp_path / "nope.nc")
    (tmp_path / "junk.nc").write_text("not a netcdf file")
    with pytest.raises(ValueError, match="junk.nc: cannot read it"):
        open_cube(tmp_path / "junk.nc")


def test_fsspec_memory_zarr_and_vertical_levels(tmp_path):
    lat, lon = np.arange(3.0), np.arange(4.0)
    ds = xr.Dataset({"t": (("time", "pressure_level", "latitude", "longitude"), np.ones((2, 3, 3, 4)))},
                    coords={"time": pd.date_range("2020", periods=2), "pressure_level": [1000.0, 850.0, 500.0],
                            "latitude": lat, "longitude": lon})
    ds["pressure_level"].attrs.update(units="hPa", standard_name="air_pressure")
    ds.to_zarr("memory://levels.zarr", consolidated=True)
    out = open_cube("memory://levels.zarr")
    assert out["t"].dims == ("time", "level", "lat", "lon")
    np.testing.assert_array_equal(out["level"].values, [1000.0, 850.0, 500.0])
    assert out.attrs["geonp_source"] == "memory://levels.zarr"
