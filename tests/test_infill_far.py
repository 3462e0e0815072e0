"""Far context: windows reach across gaps wider than their halo, and gaps still left without
context are counted honestly in every infill summary."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

import geonp
import geonp.fill.blocks as blocks
from geonp.cli import main
from geonp.fill.output import FLAG_INFILLED, WITHOUT_CONTEXT, InfillStore, output_template
from geonp.tasks.far_context import FAR_SHARE, Slab, _items, build_pyramid, far_points, slab_margin
from geonp.tasks.windows import WindowSpec


def _cube(t: int = 1, r: int = 120, c: int = 120, gap=(slice(25, 95), slice(25, 95)),
          ) -> tuple[xr.Dataset, np.ndarray]:
    """A smooth field with a rectangular gap on every step, and the truth."""
    tt, rr, cc = np.meshgrid(np.arange(t), np.arange(r), np.arange(c), indexing="ij")
    truth = 15 + 2 * np.sin(rr / 23.0) + 1.5 * np.cos(cc / 31.0) + 0.01 * rr + 0.1 * tt
    values = truth.copy()
    values[:, gap[0], gap[1]] = np.nan
    ds = xr.Dataset({"sst": (("time", "lat", "lon"), values.astype(np.float32), {"units": "degC"})},
                    coords={"time": pd.date_range("2020-01-01", periods=t), "lat": 40 + 0.01 * np.arange(r),
                            "lon": 0.01 * np.arange(c)})
    return ds, truth


@pytest.mark.parametrize("model", ["linear", "window-kriging"])
@pytest.mark.parametrize("where", ["middle", "corner"])
def test_wide_gaps_are_filled_from_context_around_them(model: str, where: str) -> None:
    """A 70 x 70 gap (the halo is 10): no cell falls back to the global mean, values stay in the
    observed range, and the gap's centre is nearer the truth than the global mean is."""
    gap = (slice(25, 95), slice(25, 95)) if where == "middle" else (slice(0, 70), slice(0, 70))
    ds, truth = _cube(gap=gap)
    out = geonp.infill(ds, "sst", model=model)
    assert out.attrs[f"{WITHOUT_CONTEXT}_sst"] == 0
    gaps = np.isnan(ds.sst.values)
    filled = out.sst.values[gaps]
    assert (out.sst_flag.values[gaps] == FLAG_INFILLED).all() and np.isfinite(filled).all()
    observed = ds.sst.values[~gaps]
    lo, hi = observed.min(), observed.max()
    if model == "window-kriging" and where == "corner":
        # Kriging extrapolates into a corner (negative weights): the truth there does leave the
        # observed range (by 1.5), so hold it to the range widened by a tenth of its span.
        lo, hi = lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo)
    assert lo <= filled.min() and filled.max() <= hi
    centre = (0, (gap[0].start + gap[0].stop) // 2, (gap[1].start + gap[1].stop) // 2)
    assert abs(out.sst.values[centre] - truth[centre]) < abs(observed.mean() - truth[centre])


def test_far_points_are_whole_cells_within_the_context_cap(monkeypatch) -> None:
    """Every window's inputs stay on the lattice (whole cells), far points included, and a
    window's context never exceeds max_context, with far points within their share."""
    tasks = []
    predict = blocks.predict_windows

    def record(model, batch, *args, **kwargs):
        tasks.extend(batch)
        return predict(model, batch, *args, **kwargs)

    monkeypatch.setattr(blocks, "predict_windows", record)
    ds, _ = _cube(t=2, r=80, c=90, gap=(slice(10, 70), slice(15, 80)))
    spec = WindowSpec(max_context=48)
    geonp.infill(ds, "sst", model="linear", window=spec)
    view = np.array(spec.view[1:]) / spec.cells_per_unit  # extent of a window's own cells, input units
    reaching = 0
    for task in tasks:
        scaled = task.xc * np.array([spec.steps_per_unit, spec.cells_per_unit, spec.cells_per_unit])
        np.testing.assert_allclose(scaled, np.rint(scaled), atol=1e-4)
        assert 0 < task.yc.size <= spec.max_context
        far = (np.abs(task.xc[:, 1:]) > view).any(1)  # beyond any cell of the window's view
        assert far.sum() <= spec.max_context // FAR_SHARE
        reaching += far.any()
    assert reaching > 0, "no window reached beyond its view: the test does not exercise far context"


def test_quadtree_counts_every_cell_outside_the_view_once() -> None:
    """Near cells plus the far blocks (before any reach limit) hold every observed and every gap
    cell of the window's time range exactly once; far points sit on observed cells outside the view."""
    rng = np.random.default_rng(3)
    t, r, c = 3, 67, 53
    values = rng.normal(size=(t, r, c))
    values[rng.random((t, r, c)) < 0.4] = np.nan
    values[:, 12:62, 4:50] = np.nan  # the first window's view lies inside: it can only reach
    valid = rng.random((r, c)) > 0.05
    finite = np.isfinite(values)
    observed, missing = finite & valid, ~finite & valid
    pyramid = build_pyramid(xr.DataArray(values).chunk({"dim_0": 1}), valid, finest=2)
    slab = Slab(values, observed, missing, (0, 0, 0), (t, r, c))
    halo = (10, 10)
    for predicted, seen in [([(1, 2), (25, 47), (15, 37)], (0, 3)), ([(0, 1), (0, 16), (40, 53)], (0, 2)),
                            ([(2, 3), (50, 67), (0, 9)], (1, 3))]:
        (r0, r1), (c0, c1) = predicted[1:]
        view = np.zeros((r, c), bool)
        view[max(r0 - halo[0], 0):r1 + halo[0], max(c0 - halo[1], 0):c1 + halo[1]] = True
        items = _items(pyramid, slab, predicted, seen, halo, opening=2.0)
        steps = slice(*seen)
        assert items.count.sum() + observed[steps][:, view].sum() == observed[steps].sum()
        assert items.gaps.sum() + missing[steps][:, view].sum() == missing[steps].sum()
        cells, vals = far_points(lambda: pyramid, slab, predicted, seen, halo, max_points=10_000)
        assert np.isfinite(vals).all() and (cells.shape[0] > 0 or predicted[1][0] != 25)
        assert observed[tuple(cells.T)].all() and not view[cells[:, 1], cells[:, 2]].any()
        assert ((seen[0] <= cells[:, 0]) & (cells[:, 0] < seen[1])).all()


def test_pyramid_matches_brute_force_and_reading_in_bands() -> None:
    """Block counts and means are exact at every level, each representative cell is an observed
    cell of its block, and reading the cube in bands of rows changes nothing."""
    rng = np.random.default_rng(1)
    values = rng.normal(size=(2, 37, 29))
    values[rng.random(values.shape) < 0.5] = np.nan
    valid = np.ones((37, 29), bool)
    data = xr.DataArray(values).chunk({"dim_0": 1})
    whole = build_pyramid(data, valid, finest=1)
    banded = build_pyramid(data, valid, finest=1, read_cells=29 * 5)  # bands of 4 rows (whole 2-cell blocks)
    for name in ("count", "mean", "row", "col", "gaps"):
        for a, b in zip(getattr(whole, name), getattr(banded, name)):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    for level, j in enumerate(range(whole.finest, whole.top + 1)):
        s = 1 << j
        for t, i, k in zip(*np.nonzero(whole.count[level] >= 0)):
            block = values[t, i * s:(i + 1) * s, k * s:(k + 1) * s]
            n = np.isfinite(block).sum()
            assert whole.count[level][t, i, k] == n and whole.gaps[level][t, i, k] == block.size - n
            if n:
                assert np.isclose(whole.mean[level][t, i, k], np.nanmean(block))
                r, c = whole.row[level][t, i, k], whole.col[level][t, i, k]
                assert i * s <= r < (i + 1) * s and k * s <= c < (k + 1) * s and np.isfinite(values[t, r, c])


def test_slab_margin_holds_the_straddling_blocks() -> None:
    assert slab_margin((10, 10)) == (3, 3)  # blocks of 4 cells: up to 3 cells beyond the view
    assert all(m >= 1 for m in slab_margin((0, 4)))


def test_blocks_do_not_change_the_answer_with_a_wide_gap(tmp_path) -> None:
    """Far context comes from the whole cube, not the block's slab: chunking changes nothing,
    for an interpolator and for a (random, tiny) neural process batched with padding."""
    from geonp.models import build, save

    torch.manual_seed(0)
    save(build("cnp", 3, 1, preset="tiny"), tmp_path / "cnp.safetensors", extra={"infill": {"cells_per_unit": 8.0}})
    ds, _ = _cube(t=2, r=36, c=40, gap=(slice(6, 30), slice(8, 34)))
    # Windows of 8 (+2) cells with a halo of 3 inside a 24 x 26 gap: only far points reach them,
    # and max_context 64 makes the far share (16) coarsen the quadtree.
    spec = WindowSpec(core=(1, 8, 8), overlap=(0, 2, 2), halo=(1, 3, 3), max_context=64)
    for model, options in [("linear", {}), ("cnp", {"checkpoint": str(tmp_path / "cnp.safetensors")})]:
        whole = geonp.infill(ds.chunk({"time": 2, "lat": 36, "lon": 40}), "sst", model=model, window=spec, **options)
        pieces = geonp.infill(ds.chunk({"time": 1, "lat": 7, "lon": 13}), "sst", model=model, window=spec, **options)
        assert whole.attrs[f"{WITHOUT_CONTEXT}_sst"] == pieces.attrs[f"{WITHOUT_CONTEXT}_sst"] == 0
        np.testing.assert_allclose(whole.sst.values, pieces.sst.values, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(whole.sst_std.values, pieces.sst_std.values, rtol=1e-4, atol=1e-5)


def _lonely_cube() -> xr.Dataset:
    """Five steps, observed on the first only: steps 2-4 are beyond every window's time range."""
    ds, _ = _cube(t=5, r=20, c=24, gap=(slice(0, 0), slice(0, 0)))
    ds["sst"][1:] = np.nan
    return ds


def test_gaps_out_of_reach_are_counted_not_hidden() -> None:
    """Cells whose windows (time halo 1) see no observation get the global mean, and say so."""
    with pytest.warns(UserWarning, match="filled with the global mean: sst 1440"):
        out = geonp.infill(_lonely_cube(), "sst", model="linear")
    assert out.attrs[f"{WITHOUT_CONTEXT}_sst"] == 3 * 20 * 24
    assert np.isfinite(out.sst.values).all()


def test_zarr_attrs_and_cli_message_count_gaps_without_context(tmp_path, capsys) -> None:
    path = tmp_path / "in.nc"
    _lonely_cube().to_netcdf(path, encoding={"sst": {"chunksizes": (1, 20, 24)}})
    assert main(["infill", str(path), "-o", str(tmp_path / "out.zarr"), "--model", "linear", "-q"]) == 0
    assert "global mean (no observation in reach): sst 1440" in capsys.readouterr().err
    assert xr.open_zarr(tmp_path / "out.zarr").attrs[f"{WITHOUT_CONTEXT}_sst"] == 1440


def test_a_resumed_store_reports_the_whole_total(tmp_path) -> None:
    """Per-block counts live in the store, so blocks written before a kill still count."""
    ds, _ = _cube(t=3, r=10, c=12)
    template = output_template(ds.chunk({"time": 1, "lat": 5, "lon": 6}), ["sst"])
    store = InfillStore(tmp_path / "o.zarr", template, {"model": "x"})
    blocks_ = list(store.blocks())

    def write(s: InfillStore, n: int, index, region) -> None:
        shape = tuple(region[d].stop - region[d].start for d in ("time", "lat", "lon"))
        values = {"sst": np.zeros(shape), "sst_std": np.zeros(shape), "sst_flag": np.zeros(shape, np.int8)}
        s.write_block(index, region, values, {"sst": n})

    for n, (index, region) in enumerate(blocks_[:4]):
        write(store, n, index, region)
    again = InfillStore(tmp_path / "o.zarr", template, {"model": "x"})
    assert again.resumed
    for n, (index, region) in enumerate(blocks_[4:], 4):
        write(again, n, index, region)
    assert again.finish() == {"sst": sum(range(len(blocks_)))}
    assert xr.open_zarr(tmp_path / "o.zarr").attrs[f"{WITHOUT_CONTEXT}_sst"] == sum(range(len(blocks_)))


def test_other_sources_ride_on_the_fields_selection() -> None:
    """``others`` (a history covariate summarised over the field's observed cells) gives every far
    point the covariate's mean over the same cells: what a selection run on the covariate itself,
    with the field's observed cells, gives (the same cells, to the bit), in one selection."""
    rng = np.random.default_rng(4)
    t, r, c = 3, 67, 53
    values = rng.normal(size=(t, r, c))
    values[rng.random((t, r, c)) < 0.4] = np.nan
    values[:, 12:62, 4:50] = np.nan
    valid = np.ones((r, c), bool)
    covariate = rng.normal(size=(t, r, c))
    finite = np.isfinite(values)
    observed, missing = finite & valid, ~finite & valid
    masked = np.where(observed, covariate, np.nan)  # the covariate over the field's observed cells
    pyramid = build_pyramid(xr.DataArray(values).chunk({"dim_0": 1}), valid, finest=2)
    cov_pyramid = build_pyramid(xr.DataArray(masked).chunk({"dim_0": 1}), valid, finest=2)
    slab = Slab(values, observed, missing, (0, 0, 0), (t, r, c))
    cov_slab = Slab(masked, observed, missing, (0, 0, 0), (t, r, c))
    inside = [(1, 2), (25, 47), (15, 37)]  # a window inside the wide gap: it reaches far
    for predicted, seen, cap in [(inside, (0, 3), 10_000), (inside, (0, 3), 7),  # 7: coarsened, then cut
                                 ([(2, 3), (50, 67), (0, 9)], (1, 3), 10_000)]:
        cells, both = far_points(lambda: pyramid, slab, predicted, seen, (10, 10), cap,
                                 others=[(lambda: cov_pyramid, cov_slab)])
        alone_cells, alone = far_points(lambda: cov_pyramid, cov_slab, predicted, seen, (10, 10), cap)
        field_cells, field = far_points(lambda: pyramid, slab, predicted, seen, (10, 10), cap)
        assert both.shape == (2, len(cells)) and len(cells) > 0
        np.testing.assert_array_equal(cells, alone_cells)
        np.testing.assert_array_equal(cells, field_cells)
        np.testing.assert_array_equal(both[0], field[0])
        np.testing.assert_array_equal(both[1], alone[0])


def test_other_sources_means_are_over_the_same_cells_in_pyramid_and_band_blocks(monkeypatch) -> None:
    """A source equal to 2 x the field + 1 at its observed cells has far means 2 x the field's + 1
    in every block, the quadtree's and the band's straddling the view's edge (summarised raw)."""
    from geonp.tasks import far_context

    rng = np.random.default_rng(5)
    t, r, c = 2, 70, 61
    values = rng.normal(size=(t, r, c))
    values[rng.random((t, r, c)) < 0.5] = np.nan  # scattered gaps: observed cells in every block
    valid = np.ones((r, c), bool)
    finite = np.isfinite(values)
    affine = np.where(finite, 2 * values + 1, rng.normal(size=values.shape))  # anything off the observed cells
    pyramid = build_pyramid(xr.DataArray(values).chunk({"dim_0": 1}), valid, finest=2)
    other = build_pyramid(xr.DataArray(np.where(finite, affine, np.nan)).chunk({"dim_0": 1}), valid, finest=2)
    slab = Slab(values, finite, ~finite, (0, 0, 0), (t, r, c))
    bands = []
    real_band = far_context._band
    monkeypatch.setattr(far_context, "_band", lambda *a: bands.append(a[-1]) or real_band(*a))
    for predicted in ([(0, 1), (23, 37), (19, 33)], [(1, 2), (5, 14), (41, 58)]):  # edges off the 4-cell blocks
        items = _items(pyramid, slab, predicted, (0, 2), (3, 3), 2.0, [(other, Slab(affine, finite, ~finite,
                                                                                    (0, 0, 0), (t, r, c)))])
        has = items.count > 0
        assert items.mean.shape[0] == 2 and has.any()
        np.testing.assert_allclose(items.mean[1][has], 2 * items.mean[0][has] + 1, rtol=1e-12)
    assert bands and all(len(b) == 1 for b in bands)  # the band's blocks ran, with the other source


def test_far_history_puts_each_covariate_in_its_place() -> None:
    """_far_history: a flat covariate is its one value at every far point, the others take the
    summarised means in order."""
    from geonp.fill.blocks import _far_history

    history = np.stack([np.full((2, 3, 4), 7.0), np.zeros((2, 3, 4)), np.full((2, 3, 4), -1.0)])
    means = np.array([[0.5, 1.5, 2.5]])  # the one covariate summarised, at three far points
    out = _far_history(history, [True, False, True], means)
    np.testing.assert_array_equal(out, [[7.0] * 3, [0.5, 1.5, 2.5], [-1.0] * 3])
