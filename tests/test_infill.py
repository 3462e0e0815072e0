"""The infill engine: window grid, blending, block independence, output contents, fine-tuning."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import smooth_cube

import geonp
from geonp.fill.output import FLAG_INFILLED, FLAG_OBSERVED, FLAG_OUTSIDE
from geonp.tasks.windows import Axis, WindowSpec, canonical, default_chunks


@pytest.mark.parametrize("n, core, overlap", [(50, 16, 6), (16, 16, 0), (37, 8, 7), (5, 3, 2)])
def test_axis_weights_partition_unity_and_touching(n: int, core: int, overlap: int) -> None:
    axis = Axis(n, core, overlap, halo=4)
    total = np.zeros(n)
    for k in range(axis.count):
        s, e = axis.predicted(k)
        total[s:e] += axis.weights(k)
        assert 0 <= axis.seen(k)[0] <= s and e <= axis.seen(k)[1] <= n
    np.testing.assert_allclose(total, 1.0)
    for start in range(n):
        for stop in range(start + 1, n + 1):
            brute = [k for k in range(axis.count) if axis.predicted(k)[0] < stop and axis.predicted(k)[1] > start]
            assert list(axis.touching(start, stop)) == brute


def test_output_keeps_observed_flags_and_uncertainty(tiny_checkpoint: str) -> None:
    ds = smooth_cube()
    out = geonp.infill(ds, "sst", model="te-pt-tnp", checkpoint=tiny_checkpoint, fit_steps=0)
    obs = np.isfinite(ds.sst.values) & ds.valid.values
    flag, value, std = out.sst_flag.values, out.sst.values, out.sst_std.values
    assert (flag[obs] == FLAG_OBSERVED).all() and (value[obs] == ds.sst.values[obs]).all() and (std[obs] == 0).all()
    gaps = ~np.isfinite(ds.sst.values) & ds.valid.values
    assert (flag[gaps] == FLAG_INFILLED).all() and np.isfinite(value[gaps]).all() and (std[gaps] > 0).all()
    assert (flag[:, :5, :5] == FLAG_OUTSIDE).all() and np.isnan(value[:, :5, :5]).all()
    assert np.isnan(std[:, :5, :5]).all()
    assert out.sst_std.attrs["standard_name"] == "sea_surface_temperature standard_error"
    assert out.sst.attrs["ancillary_variables"] == "sst_std sst_flag"
    assert out.attrs["Conventions"] == "CF-1.11" and len(out.attrs["geonp_checkpoint_sha256"]) == 64


def test_blocks_do_not_change_the_answer(tiny_checkpoint: str) -> None:
    """The window grid is global: chunking the input differently gives the same output (no seams)."""
    ds = smooth_cube(t=2, r=24, c=30)
    whole = geonp.infill(ds.chunk({"time": 2, "lat": 24, "lon": 30}), "sst", checkpoint=tiny_checkpoint, fit_steps=0)
    pieces = geonp.infill(ds.chunk({"time": 1, "lat": 7, "lon": 13}), "sst", checkpoint=tiny_checkpoint, fit_steps=0)
    np.testing.assert_allclose(whole.sst.values, pieces.sst.values, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(whole.sst_std.values, pieces.sst_std.values, rtol=1e-4, atol=1e-5)


def test_in_memory_steps_of_a_small_grid_share_a_block() -> None:
    """An input in memory is cut into 256 x 256 tiles and as many steps as keep a block within
    65,536 cells: a small grid's steps are batched together, a large grid's one at a time."""
    small = canonical(smooth_cube(t=60, r=20, c=24), "sst", "cube.nc")
    assert small.chunks == ((60,), (20,), (24,))  # 60 x 480 cells fit in one block
    assert default_chunks((744, 33, 49)) == (40, 33, 49)  # 40 x 1617 = 64,680 cells
    assert default_chunks((10, 201, 301)) == (1, 201, 256)
    assert default_chunks((3, 600, 900)) == (1, 256, 256)


@pytest.mark.parametrize("model, tolerance", [("linear", 1e-3), ("kriging", 0.05)])
def test_linear_field_is_recovered_by_baselines(model: str, tolerance: float) -> None:
    # Linear interpolation is exact on a plane; kriging (a fitted variogram, constant mean) is close
    # (0.05 on a plane spanning 2.6, as in test_interpolation).
    ds = smooth_cube(t=1)
    _, rr, cc = np.meshgrid(np.arange(1), np.arange(30), np.arange(40), indexing="ij")
    plane = (10 + 0.05 * rr - 0.03 * cc).astype(np.float32)
    ds["sst"] = ds.sst.copy(data=np.where(np.isfinite(ds.sst.values), plane, np.nan))
    out = geonp.infill(ds, "sst", model=model)
    gaps = (out.sst_flag.values == FLAG_INFILLED)
    assert gaps.sum() > 100 and np.abs(out.sst.values[gaps] - plane[gaps]).max() < tolerance


def test_mixture_blending_spreads_between_disagreeing_windows(monkeypatch) -> None:
    """Where windows overlap the variance is the mixture's: never below the blended member variances,
    above them where the members disagree, equal to them where one window predicts alone."""
    from geonp.fill import blocks

    sigma = 0.5

    def disagreeing(model, tasks, *args, **kwargs):  # window i says mean i, every window the same sigma
        return [(np.full(t.targets.size, float(i)), np.full(t.targets.size, sigma)) for i, t in enumerate(tasks)]

    monkeypatch.setattr(blocks, "predict_windows", disagreeing)
    ds = smooth_cube(t=1, r=40, c=40)
    spec = WindowSpec(core=(1, 8, 8), overlap=(0, 6, 6), halo=(0, 4, 4))
    out = geonp.infill(ds, "sst", model="linear", window=spec, fit_steps=0)
    gaps = out.sst_flag.values[0] == FLAG_INFILLED
    std = out.sst_std.values[0]

    def windows_per_cell(axis: Axis) -> np.ndarray:
        count = np.zeros(axis.n, int)
        for k in range(axis.count):
            start, stop = axis.predicted(k)
            count[start:stop] += 1
        return count

    alone = np.outer(windows_per_cell(Axis(40, 8, 6, 4)) == 1, windows_per_cell(Axis(40, 8, 6, 4)) == 1)
    assert (gaps & alone).sum() > 20 and (gaps & ~alone).sum() > 20
    # The mixture's variance, sum w (sigma^2 + mu^2) - mean^2: the window's own where it predicts alone,
    # never below the members' sigma^2, and wider where windows that disagree meet.
    np.testing.assert_allclose(std[gaps & alone], sigma, atol=1e-5)
    assert (std[gaps] >= sigma - 1e-5).all()
    assert (std[gaps & ~alone] > sigma + 0.1).mean() > 0.9


def test_no_gaps_gives_the_input_with_flags_and_a_note(tiny_checkpoint: str) -> None:
    ds = smooth_cube().fillna(1.0)
    with pytest.warns(UserWarning, match="no gaps"):
        out = geonp.infill(ds, "sst", checkpoint=tiny_checkpoint, fit_steps=0)
    assert "no gaps" in out.attrs["geonp_notes"]
    np.testing.assert_array_equal(out.sst.values[:, 5:, 5:], ds.sst.values[:, 5:, 5:])
    assert (out.sst_flag.values[:, 5:, 5:] == FLAG_OBSERVED).all()


def test_fit_steps_change_the_model_deterministically(tiny_checkpoint: str) -> None:
    ds = smooth_cube(t=2, r=20, c=24)
    base = geonp.infill(ds, "sst", checkpoint=tiny_checkpoint, fit_steps=0)
    a = geonp.infill(ds, "sst", checkpoint=tiny_checkpoint, fit_steps=2, seed=1)
    b = geonp.infill(ds, "sst", checkpoint=tiny_checkpoint, fit_steps=2, seed=1)
    np.testing.assert_array_equal(a.sst.values, b.sst.values)
    assert not np.allclose(a.sst.values, base.sst.values)
    assert a.attrs["geonp_fit_steps"] == 2


def test_single_scene_and_projected_grid(tiny_checkpoint: str) -> None:
    ds = smooth_cube(t=1).isel(time=0, drop=True).rename({"lat": "y", "lon": "x"})
    y, x = np.meshgrid(np.arange(30), np.arange(40), indexing="ij")
    ds = ds.assign_coords(lat=(("y", "x"), 40 + 0.1 * y + 0.01 * x), lon=(("y", "x"), 0.1 * x - 0.01 * y))
    out = geonp.infill(ds, "sst", checkpoint=tiny_checkpoint, fit_steps=0)
    assert out.sst.dims == ("y", "x") and "time" not in out.dims  # the input's layout: no time axis added
    assert "lat" in out.coords and out.lat.dims == ("y", "x")
    value, std, flag = out.sst.values, out.sst_std.values, out.sst_flag.values
    sst = ds.sst.values
    obs, gaps = np.isfinite(sst) & ds.valid.values, ~np.isfinite(sst) & ds.valid.values
    assert (flag[obs] == FLAG_OBSERVED).all() and (value[obs] == sst[obs]).all() and (std[obs] == 0).all()
    assert (flag[gaps] == FLAG_INFILLED).all() and np.isfinite(value[gaps]).all() and (std[gaps] > 0).all()
    assert (flag[:5, :5] == FLAG_OUTSIDE).all() and np.isnan(value[:5, :5]).all()  # land stays out
