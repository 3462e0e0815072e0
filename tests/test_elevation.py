"""Elevation as an input channel: ERA5 orography and ETOPO onto regular and projected cubes."""

from __future__ import annotations

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from conftest import real_file as real

from geonp.data.cube import field_variables, open_cube
from geonp.data.elevation import G0, attach_elevation

OROGRAPHY = "elevation/era5_orography_0p25.nc"
ETOPO = "elevation/etopo20.nc"
EUROPE = "era5/era5_t2m_europe_2017-01-01T12.nc"
MODIS = "satellite/modis_lst_brazil_2019-11-01.nc"


def grid(lat: np.ndarray, lon: np.ndarray) -> xr.Dataset:
    return xr.Dataset({"t": (("lat", "lon"), np.zeros((lat.size, lon.size)))}, coords={"lat": lat, "lon": lon})


# -- synthetic ---------------------------------------------------------------------------------

def test_geopotential_with_time_and_descending_lat():
    lat, lon = np.arange(10.0, 0.0, -1.0), np.arange(0.0, 10.0)
    z = xr.DataArray((100.0 * lat[:, None] + lon[None, :])[None] * G0, dims=("time", "lat", "lon"),
                     coords={"time": [0], "lat": lat, "lon": lon}, name="z", attrs={"units": "m**2 s**-2"})
    out = attach_elevation(grid(np.array([2.5, 3.0]), np.array([4.0, 4.5])), z)
    np.testing.assert_allclose(out["elevation"].values, [[254, 254.5], [304, 304.5]], rtol=1e-6)
    assert out["elevation"].attrs["units"] == "m" and out["elevation"].attrs["standard_name"] == "surface_altitude"
    assert "elevation" in out.coords and field_variables(out) == ["t"]
    with pytest.raises(ValueError, match="2 steps along 'time'"):
        attach_elevation(grid(np.array([2.5]), np.array([4.0])), xr.concat([z, z], "time"))


def test_nan_cells_left_out_and_floor():
    lat, lon = np.arange(0.0, 4.0, 0.5), np.arange(0.0, 4.0, 0.5)
    h = np.full((8, 8), 200.0)
    h[:, :4] = np.nan  # a land-only DEM: the western half is sea
    dem = xr.DataArray(h, dims=("lat", "lon"), coords={"lat": lat, "lon": lon}, name="elevation",
                       attrs={"units": "m"})
    out = attach_elevation(grid(np.array([1.0, 2.0]), np.array([0.5, 1.9, 3.0])), dem)["elevation"].values
    assert np.isnan(out[:, 0]).all() and np.allclose(out[:, 1:], 200.0)
    relief = dem.fillna(-3000.0)
    floored = attach_elevation(grid(np.array([1.0]), np.array([0.5, 3.0])), relief, floor=0.0)["elevation"]
    np.testing.assert_allclose(floored.values, [[0.0, 200.0]])


# -- real DEMs -----------------------------------------------------------------------------------

def test_era5_orography_on_its_own_grid_is_a_lookup():
    cube = open_cube(real(EUROPE))
    out = attach_elevation(cube, real(OROGRAPHY))
    z = open_cube(real(OROGRAPHY))["z"].isel(time=0)
    expected = (z.sel(lat=cube["lat"], lon=cube["lon"]) / 9.80665).values
    got = out["elevation"]
    assert got.dims == ("lat", "lon") and got.attrs["source"] == real(OROGRAPHY)
    np.testing.assert_allclose(got.values, expected, rtol=1e-6, atol=1e-3)
    assert got.attrs["geonp_regrid"] == "lat: linear; lon: linear"
    assert isinstance(out["t2m"].data, dsa.Array)  # the cube's data stay lazy


@pytest.mark.parametrize("step", [0.5, 1.0])
def test_era5_orography_block_mean_on_coarser_grid(step):
    n = int(round(step / 0.25))
    # centres at the middle of n x n blocks of 0.25 degree cells starting at 40N, 0E
    lat = 40.0 + (n - 1) * 0.125 + step * np.arange(int(10 / step))
    lon = 0.0 + (n - 1) * 0.125 + step * np.arange(int(12 / step))
    out = attach_elevation(grid(lat, lon), real(OROGRAPHY))["elevation"]
    z = open_cube(real(OROGRAPHY))["z"].isel(time=0) / 9.80665
    block = z.sel(lat=slice(40.0, 49.9), lon=slice(0.0, 11.9)).coarsen(lat=n, lon=n).mean()
    assert out.attrs["geonp_regrid"] == "lat: area mean; lon: area mean"
    np.testing.assert_allclose(out.values, block.values, rtol=1e-5, atol=1e-2)


def test_etopo_interpolated_onto_finer_grid_is_sane():
    cube = open_cube(real(EUROPE))
    out = attach_elevation(cube, real(ETOPO))["elevation"]
    assert out.attrs["geonp_regrid"] == "lat: linear; lon: linear"
    assert np.isfinite(out.values).all()
    assert float(out.sel(lat=slice(45.5, 47.5), lon=slice(6, 14)).max()) > 2000  # Alps
    assert float(out.sel(lat=40.0, lon=5.0)) < -1000  # Balearic Sea floor
    floored = attach_elevation(cube, real(ETOPO), floor=0.0)["elevation"]
    assert float(floored.min()) == 0.0 and float(floored.sel(lat=slice(45.5, 47.5), lon=slice(6, 14)).max()) > 2000


def test_projected_modis_grid_gets_elevation_at_pixel_lat_lon():
    cube = open_cube(real(MODIS))
    out = attach_elevation(cube, real(OROGRAPHY))
    elev = out["elevation"]
    assert elev.dims == ("y", "x") and isinstance(elev.data, dsa.Array)
    values = elev.values
    assert np.isfinite(values).all() and -50 < values.min() and values.max() < 1500  # NE Brazil, coast to plateaux
    rng = np.random.default_rng(1)
    iy, ix = rng.integers(0, 1200, 50), rng.integers(0, 1200, 50)
    lat = xr.DataArray(cube["lat"].values[iy, ix], dims="p")
    lon = xr.DataArray(cube["lon"].values[iy, ix].astype(float), dims="p")
    z = open_cube(real(OROGRAPHY))["z"].isel(time=0) / 9.80665
    expected = z.interp(lat=lat, lon=lon).values
    np.testing.assert_allclose(values[iy, ix], expected, rtol=1e-5, atol=1e-2)


def test_projected_grid_with_finer_dem_is_about_the_block_mean():
    lat, lon = 40.375 + np.arange(10.0), 0.375 + np.arange(12.0)
    lat2, lon2 = np.meshgrid(lat, lon, indexing="ij")
    projected = xr.Dataset(coords={"y": np.arange(10), "x": np.arange(12),
                                   "lat": (("y", "x"), lat2), "lon": (("y", "x"), lon2)})
    got = attach_elevation(projected, real(OROGRAPHY))["elevation"].values
    block = attach_elevation(grid(lat, lon), real(OROGRAPHY))["elevation"].values
    assert np.corrcoef(got.ravel(), block.ravel())[0, 1] > 0.97 and np.median(np.abs(got - block)) < 50


def test_dem_not_covering_the_cube(tmp_path):
    small = tmp_path / "alps_orography.nc"
    open_cube(real(OROGRAPHY)).sel(lat=slice(44, 48), lon=slice(5, 15)).to_netcdf(small)
    with pytest.raises(ValueError, match=r"alps_orography\.nc does not cover the cube.*uncovered: lat 30\.\.43\.875"):
        attach_elevation(open_cube(real(EUROPE)), small)
    subset = open_cube(real(ETOPO)).sel(lat=slice(0, 20))
    with pytest.raises(ValueError, match=r"etopo20\.nc does not cover"):
        attach_elevation(open_cube(real(EUROPE)), subset)
