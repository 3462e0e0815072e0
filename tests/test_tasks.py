"""Task sampler, regions and normalisation: properties that could fail."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
from conftest import data_dir
from torch.distributions import Normal
from torch.utils.data import DataLoader

from geonp.data import open_cube
from geonp.data.normalise import Normaliser, beside, fit_normaliser
from geonp.data.regions import REGIONS, Region, crop_to_region, get_region
from geonp.data.tasks import TaskSampler, sample_tasks

DATA = data_dir()


@pytest.fixture(scope="module")
def cube(tmp_path_factory):
    """A 0.5-degree, 6-hourly cube over central Europe with a moving NaN square (cloud)."""
    rng = np.random.default_rng(1)
    lat, lon = np.arange(40.0, 56.0, 0.5), np.arange(4.0, 30.0, 0.5)
    time = pd.date_range("2019-01-01", periods=40, freq="6h")
    t2m = 280 + rng.normal(size=(40, lat.size, lon.size)).astype(np.float32)
    for k in range(40):  # a different 6x6 cloud per time step
        i, j = (3 * k) % 26, (5 * k) % 46
        t2m[k, i:i + 6, j:j + 6] = np.nan
    elevation = rng.uniform(0, 2000, (lat.size, lon.size)).astype(np.float32)
    # Elevation as a coordinate, the way attach_elevation adds it: lazy when read back from Zarr.
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), t2m)},
                    coords={"time": time, "lat": lat, "lon": lon, "elevation": (("lat", "lon"), elevation)})
    path = tmp_path_factory.mktemp("cube") / "cube.zarr"
    ds.chunk({"time": 8, "lat": 16, "lon": 16}).to_zarr(path, consolidated=True)
    return open_cube(path, "t2m")


def _cells(sampler: TaskSampler, x: torch.Tensor) -> np.ndarray:
    """Denormalised (lat, lon, hours) of input rows ``[N, 3+]``."""
    norm = sampler.normaliser
    cols = [norm.denormalise_input(n, x[:, k].double().numpy()) for k, n in enumerate(sampler.inputs[:3])]
    hours = (cols[2] - np.datetime64("1970-01-01T00:00:00", "s")).astype(np.float64) / 3600
    return np.stack([cols[0], cols[1], hours], axis=1)


def test_tasks_hold_only_observed_cells_inside_the_region_and_never_overlap(cube):
    sampler = TaskSampler(cube, "t2m", window=(3, 9, 9), region="central_europe",
                          inputs=("lat", "lon", "time", "elevation"), batch_size=8, gap_fill=0.5)
    reg = REGIONS["central_europe"]
    truth = cube["t2m"].compute()  # .load() would load the shared fixture in place
    for batch in sample_tasks(sampler, 6):
        assert batch.xc.shape[-1] == 4 and batch.yc.shape[-1] == 1
        for tensor in (batch.xc, batch.yc, batch.xt, batch.yt):
            assert torch.isfinite(tensor).all()
        for b in range(len(batch)):
            ctx = _cells(sampler, batch.xc[b, batch.mask_c[b]])
            tgt = _cells(sampler, batch.xt[b, batch.mask_t[b]])
            both = np.concatenate([ctx, tgt])
            assert len(ctx) >= 1 and len(tgt) >= 1
            assert reg.lat[0] - 1e-3 <= both[:, 0].min() and both[:, 0].max() <= reg.lat[1] + 1e-3
            assert reg.lon[0] - 1e-3 <= both[:, 1].min() and both[:, 1].max() <= reg.lon[1] + 1e-3
            # One window: at most 9 cells of 0.5 degrees and 3 steps of 6 h.
            assert np.ptp(both[:, 0]) <= 4.0 + 1e-3 and np.ptp(both[:, 1]) <= 4.0 + 1e-3
            assert np.ptp(both[:, 2]) <= 12.0 + 1e-3
            keys = {tuple(np.round(c, 3)) for c in ctx}
            assert not keys & {tuple(np.round(c, 3)) for c in tgt}, "context and targets share a cell"
            assert len(keys) == len(ctx)
            times = np.datetime64("1970-01-01", "s") + (both[:, 2] * 3600).round().astype("timedelta64[s]")
            values = truth.sel(lat=xr.DataArray(both[:, 0]), lon=xr.DataArray(both[:, 1]),
                               time=xr.DataArray(times), method="nearest").values
            assert np.isfinite(values).all(), "a NaN cell became context or target"
            y = sampler.normaliser.denormalise_values("t2m", torch.cat([batch.yc[b, batch.mask_c[b], 0],
                                                                       batch.yt[b, batch.mask_t[b], 0]]).numpy())
            np.testing.assert_allclose(y, values, rtol=1e-5)


def test_random_split_follows_the_context_fraction(cube):
    sampler = TaskSampler(cube, "t2m", window=(2, 10, 10), batch_size=64, context_fraction=(0.1, 0.3))
    batch = next(iter(sampler))
    nc, nt = batch.mask_c.sum(1).numpy(), batch.mask_t.sum(1).numpy()
    frac = nc / (nc + nt)
    assert frac.min() >= 0.1 - 1 / 200 and frac.max() <= 0.3 and frac.std() > 0.03


def test_gap_fill_targets_are_another_time_steps_cloud(tmp_path):
    rng = np.random.default_rng(3)
    values = np.where(rng.random((6, 20, 20)) < 0.3, np.nan, rng.normal(size=(6, 20, 20)))
    ds = xr.Dataset({"sst": (("time", "lat", "lon"), values)},
                    coords={"time": pd.date_range("2020", periods=6), "lat": np.arange(20.0), "lon": np.arange(20.0)})
    ds.to_netcdf(tmp_path / "clouds.nc")
    sampler = TaskSampler(open_cube(tmp_path / "clouds.nc"), "sst", window=(1, 12, 12), batch_size=16, gap_fill=1.0)
    gaps = ds["sst"].isnull()
    for batch in sample_tasks(sampler, 3):
        for k in range(len(batch)):
            tgt = _cells(sampler, batch.xt[k, batch.mask_t[k]])
            ctx = _cells(sampler, batch.xc[k, batch.mask_c[k]])
            cells = np.concatenate([ctx, tgt])
            is_target = np.arange(len(cells)) >= len(ctx)
            own = np.datetime64("1970-01-01", "s") + np.timedelta64(int(round(cells[0, 2] * 3600)), "s")
            pattern = gaps.sel(lat=xr.DataArray(cells[:, 0]), lon=xr.DataArray(cells[:, 1]), method="nearest")
            # Some other time step's cloud covers exactly the targets and none of the context.
            donors = [t for t in range(gaps.sizes["time"])
                      if gaps["time"].values[t] != own and (pattern.isel(time=t).values == is_target).all()]
            assert donors, "targets are not the cloud of another time step"


def test_same_seed_same_tasks_and_shards_differ(cube, monkeypatch):
    def first(seed):
        return next(iter(TaskSampler(cube, "t2m", window=(2, 8, 8), seed=seed, batch_size=4)))

    a, b, c = first(0), first(0), first(1)
    assert torch.equal(a.xc, b.xc) and torch.equal(a.yt, b.yt)
    assert not torch.equal(a.xc, c.xc)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    r0 = first(0)
    monkeypatch.setenv("RANK", "1")
    r1 = first(0)
    assert not torch.equal(r0.xc, r1.xc)


def test_dataloader_workers_draw_different_tasks(cube):
    sampler = TaskSampler(cube, "t2m", window=(2, 8, 8), batch_size=4, windows_per_tile=8,
                          inputs=("lat", "lon", "time", "elevation"))
    assert cube["elevation"].chunks is not None  # read lazily inside the workers
    # Forked workers (Linux's default) once deadlocked on the parent's dask thread pool: keep them working.
    loader = DataLoader(sampler, batch_size=None, num_workers=2, timeout=120)  # fail, never hang
    stream = iter(loader)
    first, second = next(stream), next(stream)  # one from each worker
    assert not torch.equal(first.xc, second.xc)


def test_tiles_are_chunk_aligned_and_own_every_window_start_once(cube):
    sampler = TaskSampler(cube, "t2m", window=(3, 9, 9))
    chunks = cube["t2m"].chunksizes
    for tile in sampler.tiles:
        for s, dim in zip(tile, ("time", "lat", "lon")):
            assert s.start % chunks[dim][0] == 0
    # Each window start is owned by exactly one tile (its core), so windows are uniform.
    owned = np.zeros((40 - 2, 32 - 8, 52 - 8), int)
    for tile in sampler.tiles:
        core = [slice(s.start, s.stop - w + 1) for s, w in zip(tile, sampler.window)]
        owned[tuple(core)] += 1
    assert (owned == 1).all()


def test_reads_each_tile_once_per_windows_per_tile(cube):
    class Counting(TaskSampler):
        reads = 0

        def _read_tile(self, tile):
            Counting.reads += 1
            return super()._read_tile(tile)

    sampler = Counting(cube, "t2m", window=(2, 8, 8), batch_size=8, windows_per_tile=64)
    assert len(sampler.tiles) == 1
    sample_tasks(sampler, 16)  # 128 windows from the one tile: read once, kept
    assert Counting.reads == 1
    Counting.reads = 0
    small = Counting(cube, "t2m", window=(2, 8, 8), batch_size=8, windows_per_tile=64, tile_cells=4000)
    assert len(small.tiles) > 4
    sample_tasks(small, 16)
    assert 1 <= Counting.reads <= 2


def test_bad_sampler_arguments_are_named(cube):
    with pytest.raises(ValueError, match="larger than the cube"):
        TaskSampler(cube, "t2m", window=(3, 200, 9))
    with pytest.raises(ValueError, match="unknown variable 'sst'"):
        TaskSampler(cube, "sst")
    with pytest.raises(ValueError, match="context_fraction"):
        TaskSampler(cube, "t2m", context_fraction=(0.5, 0.2))
    with pytest.raises(ValueError, match="unknown input 'height'"):
        TaskSampler(cube, "t2m", inputs=("lat", "height"))
    with pytest.raises(ValueError, match="unknown region 'atlantis'"):
        TaskSampler(cube, "t2m", region="atlantis")
    with pytest.raises(ValueError, match="holds no grid cell"):
        TaskSampler(cube, "t2m", region=(-10, -5, 0, 5))


def test_all_nan_windows_end_the_stream_with_a_clear_error(tmp_path):
    ds = xr.Dataset({"v": (("time", "lat", "lon"), np.full((2, 8, 8), np.nan))},
                    coords={"time": pd.date_range("2020", periods=2), "lat": np.arange(8.0), "lon": np.arange(8.0)})
    ds["v"][0, 0, 0] = 1.0  # open_cube accepts it; no window has 2 observed cells
    ds.to_netcdf(tmp_path / "sparse.nc")
    sampler = TaskSampler(open_cube(tmp_path / "sparse.nc"), "v", window=(1, 4, 4), batch_size=2)
    with pytest.raises(ValueError, match="observed cells"):
        next(iter(sampler))


def test_regions_registry_and_custom_bounds():
    assert get_region("central_europe") == Region("central_europe", (42.0, 53.0), (8.0, 28.0))
    assert get_region("western_europe").lon == (-4.0, 8.0) and get_region("northern_europe").lat == (53.0, 62.0)
    assert get_region((10, 20, -5, 5)).lat == (10.0, 20.0)
    assert get_region({"lat": [1, 2], "lon": [3, 4]}).lon == (3, 4)
    with pytest.raises(ValueError, match="south < north"):
        Region("bad", (50, 40), (0, 1))


@pytest.mark.skipif(DATA is None, reason="shared data folder absent (set GEONP_DATA)")
def test_projected_grid_crop_and_tasks():
    modis = open_cube(DATA / "satellite" / "modis_lst_brazil_2019-11-01.nc", "LST_Day_1km")
    part = crop_to_region(modis, get_region((-9, -8, -40, -39)))
    inside = (part["lat"] >= -9) & (part["lat"] <= -8) & (part["lon"] >= -40) & (part["lon"] <= -39)
    assert 0.5 < float(inside.mean()) <= 1.0 and part.sizes["y"] < 200
    sampler = TaskSampler(part, "LST_Day_1km", window=(16, 16), inputs=("lat", "lon"), batch_size=4)
    batch = next(iter(sampler))
    assert batch.xc.shape[-1] == 2 and torch.isfinite(batch.yt).all()


def test_normaliser_is_fitted_on_the_region_only_and_round_trips(cube, tmp_path):
    norm = fit_normaliser(cube, ["t2m"], ["lat", "lon", "time", "elevation"], region="western_europe")
    west = crop_to_region(cube, get_region("western_europe"))
    np.testing.assert_allclose(norm.values["t2m"], [float(west["t2m"].mean()), float(west["t2m"].std())], rtol=1e-5)
    np.testing.assert_allclose(norm.inputs["lon"][0], float(west["lon"].mean()))
    assert norm.inputs["time"][1] == 24.0 and norm.region == {"lat": [42.0, 53.0], "lon": [-4.0, 8.0]}
    path = norm.save(tmp_path / "model.safetensors")
    assert path == beside(tmp_path / "model.safetensors") == tmp_path / "model.normalisation.json"
    assert Normaliser.load(tmp_path / "model.safetensors") == norm
    times = cube["time"].values[:3]
    back = norm.denormalise_input("time", norm.normalise_input("time", times))
    np.testing.assert_array_equal(back, times.astype("datetime64[s]"))
    mean, std = norm.values["t2m"]
    pred = norm.denormalise_prediction(Normal(torch.tensor([[0.0], [1.0]]), torch.tensor([[1.0], [2.0]])), ["t2m"])
    np.testing.assert_allclose(pred.mean.squeeze().numpy(), [mean, mean + std], rtol=1e-6)
    np.testing.assert_allclose(pred.stddev.squeeze().numpy(), [std, 2 * std], rtol=1e-6)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a geonp normalisation file"):
        Normaliser.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="no normalisation for variable 'sst'"):
        norm.normalise_values("sst", np.zeros(2))
