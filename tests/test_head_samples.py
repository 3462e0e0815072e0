"""te-pt-tnp's kriging head as the samples' error correlation (pipelines.experiments.head_samples):
the recorder reads what the head predicted for the fill's own windows and where they lie, and the
per-window sampler draws each window with its own correlation, continuing its neighbours' draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from geonp.fill.output import FLAG_INFILLED, FLAG_OBSERVED
from geonp.fill.samples import unconditional
from pipelines.experiments import head_samples


def test_the_samples_check_reads_the_kriging_heads_covariance_from_the_fill_alone():
    """``--variants head``: the covariance te-pt-tnp's kriging head predicted for the real targets
    of the fill's own windows, not fine-tuning's (as many records with 2 fit steps as with 0; the
    checks before the fill run outside it the same way), with the plan's window scaling."""
    from conftest import smooth_cube

    import geonp
    ds = smooth_cube(t=3, r=24, c=30)
    counts = []
    for steps in (0, 2):
        with head_samples.recording_head_covariance() as record:
            geonp.infill(ds, "sst", "te-pt-tnp", fit_steps=steps, seed=0)
        counts.append(sum(len(r) for r in record["params"]))
    assert counts[0] == counts[1] > 0 and record["cells_per_unit"] == 8.0
    filled = int(np.isnan(ds["sst"].values).sum())  # every gap is a real target of some window
    assert filled <= sum(len(r) for r in record["params"]) < 4 * filled  # padding left out
    range_cells, share = head_samples.head_correlation(record)
    assert range_cells > 0 and 0 < share < 1
    assert head_samples.head_correlation({"params": [], "cells_per_unit": 8.0}) is None
    # One record per window with a real target (padding windows none), each a [windows, 2] of medians.
    assert sum(len(w) for w in record["windows"]) > 1 and all(w.shape[1] == 2 for w in record["windows"])
    assert head_samples.head_window_spread({"windows": [], "cells_per_unit": 8.0}) == {}


def test_the_head_window_spread_is_in_cells_and_skips_fills_of_few_windows():
    """Window medians of lengthscale 1..11 (input units) at 8 cells a unit: practical ranges 24..264
    cells, percentiles over the windows; head_lines counts only fills of MIN_WINDOWS windows or more."""
    ell = torch.arange(1.0, 12.0, dtype=torch.float64)  # 11 windows
    record = {"windows": [torch.stack([ell, torch.full_like(ell, 0.01)], 1)], "cells_per_unit": 8.0}
    spread = head_samples.head_window_spread(record)
    assert spread["windows"] == 11 and spread["window_range_p50"] == pytest.approx(3 * 6.0 * 8)
    assert spread["window_range_p10"] == pytest.approx(3 * 2.0 * 8)
    assert spread["window_share_p90"] == pytest.approx(0.01)
    row = {"scene": "a", "variant": "head", "range_cells": 3 * 6.0 * 8, **spread}
    few = {**row, "scene": "b", "windows": 3, "window_range_p90": 1e6}
    (line,) = head_samples.head_lines([row, few])
    assert "the 1 of 2 scenes with 10 windows or more" in line and "10th percentile x0.33" in line
    assert "90th x1.67 (widest a" in line and "x1.00 the whole fill's median target's" in line


def test_the_recorder_knows_the_cells_of_every_window():
    """Each window with a real target comes with its targets' cells in the cube: gap cells only, every
    gap cell of the cube among them, one array per row of the windows' medians; on a cube read in
    chunks, so that blocks' slabs start away from row and column 0 (the recorder refuses a forward
    whose rows do not match the windows collated for it)."""
    from conftest import smooth_cube

    import geonp

    ds = smooth_cube(t=3, r=24, c=30).chunk({"lat": 12, "lon": 15})
    with head_samples.recording_head_covariance() as record:
        geonp.infill(ds, "sst", "te-pt-tnp", fit_steps=0, seed=0)
    assert {tuple(c[:, 1:].min(0) >= (12, 15)) for c in record["cells"]} >= {(True, True)}  # a slab away from 0
    assert len(record["cells"]) == sum(len(w) for w in record["windows"]) > 1
    every = np.concatenate(record["cells"])
    gaps = np.isnan(ds["sst"].values) & ds["valid"].values  # outside the valid area nothing is filled
    assert gaps[tuple(every.T)].all()
    covered = np.zeros(gaps.shape, bool)
    covered[tuple(every.T)] = True
    assert np.array_equal(covered, gaps)
    windows = head_samples.head_windows(record)
    assert len(windows) == len(record["cells"]) and all(r > 0 and 0 <= s < 1 for _, r, s in windows)
    assert [len(a) for a in record["axes"]] == [24, 30]


def two_windows(range_cells: float = 12.0, share: float = 0.01, seed: int = 0):
    """A field with a wide cloud split between two windows at column 28, and its kriged fill."""
    from geonp.models.field_kriging import krige_scene

    rng = np.random.default_rng(seed)
    truth = 2.0 * unconditional((40, 56), 1, range_cells, share, rng)[0]
    values = truth.copy()
    values[10:30, 12:44] = np.nan
    gaps = np.isnan(values)
    mean, std, _ = krige_scene(values, np.ones(values.shape, bool))
    cells = np.argwhere(gaps)
    windows = [(cells[cells[:, 1] < 28], range_cells, share), (cells[cells[:, 1] >= 28], range_cells, share)]
    return values, mean, std, gaps, windows


def test_per_window_samples_are_exact_where_observed_spread_as_sigma_and_seamless():
    """Observed cells exact; each gap cell's spread the fill's sigma; errors of neighbouring cells as
    alike across the two windows' border as beside it within one window (no seam)."""
    values, mean, std, gaps, windows = two_windows()
    n = 400
    drawn = head_samples.draw_by_windows(values, mean, std, gaps, windows, n, np.random.default_rng(1))
    seen = ~gaps
    assert np.array_equal(drawn[:, seen], np.broadcast_to(values[seen], (n, seen.sum())))
    ratio = drawn[:, gaps].std(0) / std[gaps]
    assert 0.9 < np.median(ratio) < 1.1 and np.all((ratio > 0.7) & (ratio < 1.3))
    err = (drawn - mean) / np.where(gaps, std, 1.0)

    def neighbours(col: int) -> float:  # correlation of columns col and col + 1 inside the cloud
        a, b = err[:, 12:28, col], err[:, 12:28, col + 1]
        return float(np.mean(a * b) / np.sqrt(np.mean(a**2) * np.mean(b**2)))

    across, within = neighbours(27), np.mean([neighbours(25), neighbours(29)])
    assert within > 0.5 and abs(across - within) < 0.1
    # Drawn as independent windows (nothing conditioning the second on the first), the border is a seam.
    alone = [head_samples.draw_by_windows(values, mean, std, gaps & (np.arange(56) < 28) if w == 0 else
                                          gaps & (np.arange(56) >= 28), [windows[w]], n, np.random.default_rng(w))
             for w in (0, 1)]
    joined = np.where(np.arange(56) < 28, alone[0], alone[1])
    err = (joined - mean) / np.where(gaps, std, 1.0)
    assert neighbours(27) < within - 0.3


def test_each_window_draws_with_its_own_range():
    """A window with a short range gives rougher errors than one with a long range."""
    values, mean, std, gaps, windows = two_windows()
    (left, _, _), (right, _, _) = windows
    drawn = head_samples.draw_by_windows(values, mean, std, gaps, [(left, 4.0, 0.0), (right, 40.0, 0.0)], 300,
                                         np.random.default_rng(2))
    err = (drawn - mean) / np.where(gaps, std, 1.0)
    lag = lambda c: np.mean(err[:, 14:26, c] * err[:, 14:26, c + 2])  # noqa: E731
    assert lag(18) < lag(36) - 0.3


def test_the_recorded_cells_are_turned_to_the_fills_orientation():
    """The working cube's rows may be the output's reversed (a descending latitude): the cells are
    flipped where the coordinates say so; coordinates that match neither way, and cells off the
    fill's gaps, are refused."""
    gaps = np.zeros((1, 6, 5), bool)
    gaps[0, 0, 1] = gaps[0, 1, 1] = True
    layer = xr.DataArray(np.zeros(gaps.shape), dims=("time", "lat", "lon"),
                         coords={"lat": np.arange(6.0)[::-1], "lon": np.arange(5.0)})
    working = [np.array([[0, 5, 1], [0, 4, 1]])]  # rows ascending in the working cube
    axes = [np.arange(6.0), np.arange(5.0)]
    (cells,) = head_samples._as_output_cells(working, axes, layer, gaps)
    assert sorted(map(tuple, cells)) == [(0, 0, 1), (0, 1, 1)]
    with pytest.raises(ValueError, match="neither as it is nor reversed"):
        head_samples._as_output_cells(working, [np.arange(6.0) + 0.5, axes[1]], layer, gaps)
    with pytest.raises(ValueError, match="do not lie on the fill's gaps"):
        head_samples._as_output_cells([np.array([[0, 2, 2]])], axes, layer, gaps)


def test_the_window_sampler_writes_a_sample_layer_from_the_recorded_windows():
    """Observed cells as observed, the draws those of draw_by_windows from the step's own stream; a
    scene no window predicted falls back on geonp's rule; a fill without a head is refused."""
    values, mean, std, gaps, windows = two_windows()
    flag = np.where(gaps, FLAG_INFILLED, FLAG_OBSERVED).astype(np.int8)
    dims = ("time", "lat", "lon")
    fill = xr.Dataset({"v": (dims, np.where(gaps, mean, values)[None]), "v_std": (dims, np.where(gaps, std, 0.0)[None]),
                       "v_flag": (dims, flag[None])}, coords={"lat": np.arange(40.0), "lon": np.arange(56.0)})
    at_step0 = [(np.c_[np.zeros(len(c), int), c], r, s) for c, r, s in windows]
    fill.attrs[head_samples.WINDOWS_ATTR] = {"windows": at_step0, "axes": [np.arange(40.0), np.arange(56.0)]}
    out = head_samples.window_sampler(fill, fill, "v", "te-pt-tnp", 3, 0, {})["v_sample"].values
    assert out.shape == (3, 1, 40, 56) and np.isfinite(out).all()
    seen = values[~gaps].astype(np.float32)  # the sample layer is float32
    np.testing.assert_array_equal(out[:, 0][:, ~gaps], np.broadcast_to(seen, (3, seen.size)))
    direct = head_samples.draw_by_windows(values, mean, std, gaps, windows, 3, np.random.default_rng([0, 15333, 0]))
    np.testing.assert_allclose(out[:, 0], direct.astype(np.float32))
    alone = head_samples.draw_by_windows(values, mean, std, gaps, [], 3, np.random.default_rng(0))
    assert np.isfinite(alone).all()  # geonp's rule where no window predicted
    fill.attrs.pop(head_samples.WINDOWS_ATTR)
    with pytest.raises(ValueError, match="has no kriging head"):
        head_samples.window_sampler(fill, fill, "v", "linear", 3, 0, {})
