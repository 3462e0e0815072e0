"""Evaluation on artificially hidden cells: cloud masks, donor gap patterns, scoring, tables."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import xarray as xr
from conftest import real_file
from scipy import ndimage
from scipy.stats import norm

from geonp.evaluate import DONOR_CLOUDS, DONOR_GIVEN, DONOR_NONE, evaluate, run_evaluate, write_table
from geonp.fill.options import FitOptions
from geonp.metrics import DISTANCE_BINS, WIDE_DISTANCE_BINS
from geonp.skill_table import markdown
from geonp.tasks.clouds import random_clouds
from geonp.tasks.hidden import hide_cells

ALBORAN = "satellite/alboran_sst_avhrr_2017-05.nc"


# -- random_clouds -----------------------------------------------------------------------------

@pytest.mark.parametrize("cover", [0.1, 0.3, 0.7])
def test_random_clouds_cover_and_blobs(cover):
    rng = np.random.default_rng(1)
    clouds = random_clouds((120, 150), cover, rng)
    assert clouds.dtype == bool and clouds.shape == (120, 150)
    assert abs(clouds.mean() - cover) <= 0.02
    # Blobs, not salt and pepper: far fewer connected pieces than i.i.d. noise at the same cover.
    iid = rng.random((120, 150)) < cover
    assert ndimage.label(clouds)[1] * 10 < ndimage.label(iid)[1]


def test_random_clouds_anisotropic_and_deterministic():
    a = random_clouds((64, 64), 0.4, np.random.default_rng(3), scale=(2.0, 12.0))
    b = random_clouds((64, 64), 0.4, np.random.default_rng(3), scale=(2.0, 12.0))
    np.testing.assert_array_equal(a, b)
    # Streaks along columns: neighbours along a row agree more often than along a column.
    assert (a[:, 1:] == a[:, :-1]).mean() > (a[1:, :] == a[:-1, :]).mean()


@pytest.mark.parametrize("shape, cover, scale", [((10,), 0.3, 8.0), ((0, 5), 0.3, 8.0), ((5.5, 5), 0.3, 8.0),
                                                 ((8, 8), 0.0, 8.0), ((8, 8), 1.0, 8.0), ((8, 8), 0.3, 0.0)])
def test_random_clouds_rejects_bad_arguments(shape, cover, scale):
    with pytest.raises(ValueError):
        random_clouds(shape, cover, np.random.default_rng(0), scale=scale)


# -- hide_cells ----------------------------------------------------------------------------------

def cube(steps: int = 3, ny: int = 30, nx: int = 40) -> xr.Dataset:
    """A smooth field; column 0-4 land (not valid, but holding values: they must never be hidden).

    Step 0 is fully observed, step 1 has a rectangle of cloud over ~25% of the sea, step 2 is 80%
    cloudy (too many to copy), step 3+ (if any) are clear.
    """
    y, x = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    field = np.stack([np.sin(y / 5 + t) + np.cos(x / 7) for t in range(steps)]).astype(np.float32)
    valid = np.ones((ny, nx), bool)
    valid[:, :5] = False
    if steps > 1:
        field[1, 5:20, 10:30] = np.nan  # 15 x 20 = 300 of 1050 sea cells
    if steps > 2:
        field[2, :, 5:33] = np.nan  # 840 of 1050
    coords = {"time": np.arange(steps), "lat": np.linspace(40, 43, ny), "lon": np.linspace(0, 4, nx)}
    return xr.Dataset({"sst": (("time", "lat", "lon"), field, {"units": "degC"}),
                       "valid": (("lat", "lon"), valid)}, coords=coords, attrs={"geonp_source": "cube.nc"})


def test_hide_cells_copies_a_donor_pattern_and_leaves_input_alone():
    ds = cube()
    before = ds["sst"].values.copy()
    da = ds["sst"].chunk({"time": 1})  # dask-backed input
    masked, hidden = hide_cells(da, ds["valid"], np.random.default_rng(0))
    np.testing.assert_array_equal(ds["sst"].values, before)
    assert hidden.dims == da.dims and masked.dims == da.dims and hidden.dtype == bool
    observed = np.isfinite(before) & ds["valid"].values
    h = hidden.values
    assert not (h & ~observed).any()  # only observed, valid cells (land holds values but stays)
    assert np.isnan(masked.values[h]).all()
    np.testing.assert_array_equal(masked.values[~h], before[~h])
    # Step 0's only acceptable donor is step 1 (25%); step 2 would hide 80% > max_hidden.
    assert hidden.attrs["geonp_donor"][0] == 1
    pattern = np.isnan(before[1]) & ds["valid"].values
    np.testing.assert_array_equal(h[0], pattern & observed[0])


def test_hide_cells_deterministic_and_respects_max_hidden():
    ds = cube(steps=6)
    runs = [hide_cells(ds["sst"], ds["valid"], np.random.default_rng(7)) for _ in range(2)]
    np.testing.assert_array_equal(runs[0][1].values, runs[1][1].values)
    np.testing.assert_array_equal(runs[0][0].values, runs[1][0].values)
    observed = np.isfinite(ds["sst"].values) & ds["valid"].values
    share = runs[0][1].values.sum((1, 2)) / observed.sum((1, 2))
    assert ((share >= 0.1) & (share <= 0.5)).all()


def test_hide_cells_one_scene_falls_back_to_clouds():
    ds = cube(steps=1).isel(time=0)
    masked, hidden = hide_cells(ds["sst"], ds["valid"], np.random.default_rng(0), cover=0.3)
    assert hidden.dims == ("lat", "lon")
    assert list(hidden.attrs["geonp_donor"]) == [DONOR_CLOUDS]
    share = hidden.values.sum() / ds["valid"].values.sum()
    assert 0.1 <= share <= 0.5
    assert not (hidden.values & ~ds["valid"].values).any()


def test_hide_cells_leaves_sparse_steps_untouched():
    ds = cube(steps=3)
    ds["sst"][0, :, 5:] = np.nan
    ds["sst"][0, 0, 5:45] = 1.0  # 35 observed sea cells < 50
    _, hidden = hide_cells(ds["sst"], ds["valid"], np.random.default_rng(0))
    assert hidden.attrs["geonp_donor"][0] == DONOR_NONE and not hidden.values[0].any()


def test_hide_cells_only_in_the_steps_asked_the_others_stay_whole_and_lend_gaps():
    ds = cube(steps=4)
    masked, hidden = hide_cells(ds["sst"], ds["valid"], np.random.default_rng(0), steps=[0])
    donors = hidden.attrs["geonp_donor"]
    assert hidden.values[0].any() and not hidden.values[1:].any()
    assert list(donors) == [1, DONOR_NONE, DONOR_NONE, DONOR_NONE]  # step 2's gaps would hide 80%
    # The hidden cells are the donor's gaps over the step's observed cells, and nothing else moved.
    gaps = ~np.isfinite(ds["sst"].values[1]) & ds["valid"].values
    np.testing.assert_array_equal(hidden.values[0], gaps & np.isfinite(ds["sst"].values[0]))
    np.testing.assert_array_equal(np.isnan(masked.values[1:]), np.isnan(ds["sst"].values[1:]))


# -- evaluate with a fake infill engine ----------------------------------------------------------

class Oracle:
    """A fake ``infill``: the truth plus ``error`` (random sign) with std ``std``, per model."""

    def __init__(self, truth: xr.DataArray, settings: dict[str, tuple[float, float]]):
        self.truth, self.settings, self.calls = truth.values, settings, []

    def __call__(self, ds, variable, model, *, checkpoint=None, valid_mask=None, fit_steps=0, seed=0, **options):
        if model not in self.settings:
            raise ValueError(f"unknown model {model!r}")
        self.calls.append({"model": model, "masked": ds[variable].values.copy(), "checkpoint": checkpoint,
                           "valid": valid_mask, "fit_steps": fit_steps, "seed": seed, "options": options})
        error, std = self.settings[model]
        sign = np.where(np.random.default_rng(seed).random(self.truth.shape) < 0.5, -1.0, 1.0)
        observed = np.isfinite(ds[variable].values)
        mean = np.where(observed, ds[variable].values, self.truth + sign * error)
        out = xr.Dataset({variable: (ds[variable].dims, mean),
                          f"{variable}_std": (ds[variable].dims, np.where(observed, 0.0, std))})
        time.sleep(0.01)
        return out


def test_evaluate_exact_scores_same_cells_and_timing():
    ds = cube(steps=4)
    # model a: |error| 0.5, std 0.3 -> |z| = 1.67: outside the 90% interval, inside the 95% one
    fake = Oracle(ds["sst"], {"a": (0.5, 0.3), "b": (1.0, 1.0)})
    res = evaluate(ds, "sst", ["a", "b"], infill_fn=fake, checkpoints={"a": "a.safetensors"},
                   fit_steps={"b": 5}, seed=3, options={"device": "cpu"})
    a, b = res["rows"]
    assert a["model"] == "a" and b["model"] == "b"
    assert a["n"] == b["n"] == res["hidden_cells"] > 0
    assert a["rmse"] == pytest.approx(0.5, rel=1e-6) and a["mae"] == pytest.approx(0.5, rel=1e-6)
    assert (a["coverage_90"], a["coverage_95"]) == (0.0, 1.0)
    assert a["nll"] == pytest.approx(0.5 * math.log(2 * math.pi * 0.09) + 0.5 * (0.5 / 0.3) ** 2, rel=1e-6)
    z = norm.ppf(0.95)
    assert a["interval_score_90"] == pytest.approx(2 * z * 0.3 + 2 / 0.1 * (0.5 - z * 0.3), rel=1e-5)
    assert b["rmse"] == pytest.approx(1.0, rel=1e-6) and b["coverage_90"] == 1.0
    assert a["wall_s"] >= 0.01 and b["wall_s"] >= 0.01
    # Like for like: both models saw the very same masked cube, and the options reached them.
    np.testing.assert_array_equal(np.isnan(fake.calls[0]["masked"]), np.isnan(fake.calls[1]["masked"]))
    assert [c["checkpoint"] for c in fake.calls] == ["a.safetensors", None]
    assert [c["fit_steps"] for c in fake.calls] == [FitOptions().steps, 5]  # a model not named: infill's default
    assert all(c["seed"] == 3 and c["options"] == {"device": "cpu"} for c in fake.calls)
    assert isinstance(fake.calls[0]["valid"], xr.DataArray) and fake.calls[0]["valid"].dtype == bool
    hidden = np.isnan(fake.calls[0]["masked"]) & np.isfinite(ds["sst"].values)
    assert hidden.sum() == res["hidden_cells"]
    observed = int((np.isfinite(ds["sst"].values) & ds["valid"].values).sum())
    assert res["hidden_fraction"] == pytest.approx(res["hidden_cells"] / observed)


def test_evaluate_errors_name_the_problem():
    ds = cube()
    fake = Oracle(ds["sst"], {"a": (0.5, 0.3)})
    with pytest.raises(ValueError, match="unknown variable 'chl'"):
        evaluate(ds, "chl", ["a"], infill_fn=fake)
    with pytest.raises(ValueError, match="model 'nope'") as info:
        evaluate(ds, "sst", ["a", "nope"], infill_fn=fake)
    assert "\n" not in str(info.value)
    empty = ds.assign(sst=ds["sst"].where(~ds["valid"]))
    with pytest.raises(ValueError, match="no observed cell"):
        evaluate(empty, "sst", ["a"], infill_fn=fake)


def test_evaluate_gives_elevation_only_to_models_whose_weights_take_it(tmp_path):
    from geonp.models import build, save

    ds = cube(steps=3)
    takes = tmp_path / "elev.safetensors"
    save(build("te-pt-tnp", 4, 1, preset="tiny"), takes, extra={"inputs": {"kind": "windows"}, "infill": {}})
    plain = tmp_path / "plain.safetensors"
    save(build("te-pt-tnp", 3, 1, preset="tiny"), plain, extra={"inputs": {"kind": "windows"}, "infill": {}})
    fake = Oracle(ds["sst"], {"a": (0.5, 0.3), "linear": (1.0, 1.0)})
    evaluate(ds, "sst", ["a", "linear"], infill_fn=fake, checkpoints={"a": str(takes)}, elevation="dem.nc")
    assert fake.calls[0]["options"] == {"elevation": "dem.nc"} and fake.calls[1]["options"] == {}
    with pytest.raises(ValueError, match="--elevation dem.nc: none of the models .* takes elevation"):
        evaluate(ds, "sst", ["a", "linear"], infill_fn=fake, checkpoints={"a": str(plain)}, elevation="dem.nc")
    # kriging takes the DEM as an external drift
    fake = Oracle(ds["sst"], {"kriging": (0.5, 0.3), "linear": (1.0, 1.0)})
    evaluate(ds, "sst", ["kriging", "linear"], infill_fn=fake, elevation="dem.nc")
    assert fake.calls[0]["options"] == {"elevation": "dem.nc"} and fake.calls[1]["options"] == {}


def brute_distance(masked: np.ndarray, valid: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """Distance of every hidden cell to the nearest finite, valid cell of its step, pair by pair."""
    out = []
    for t in range(len(masked)):
        seen = np.argwhere(np.isfinite(masked[t]) & valid)
        for cell in np.argwhere(hidden[t]):
            out.append(np.sqrt(((seen - cell) ** 2).sum(1)).min() if len(seen) else np.inf)
    return np.array(out)


def test_evaluate_diagnostics_by_distance_and_pit():
    ds = cube(steps=4)
    fake = Oracle(ds["sst"], {"a": (0.5, 0.3), "b": (1.0, 1.0)})
    res = evaluate(ds, "sst", ["a", "b"], infill_fn=fake, seed=3)
    masked = fake.calls[0]["masked"]
    hidden = np.isnan(masked) & np.isfinite(ds["sst"].values)
    # Distances against the cells a model saw (finite and valid: land holds values but is not context).
    distance = brute_distance(masked, ds["valid"].values, hidden)
    edges = [0.0] + [edge for _, edge in DISTANCE_BINS]
    expected = {label: int(((distance > lo) & (distance <= hi)).sum())
                for (label, _), lo, hi in zip(DISTANCE_BINS, edges, edges[1:])}
    assert res["hidden_by_distance"] == expected and expected["1"] > 0 and expected["4-6"] > 0
    a, b = res["rows"]
    for row, error in ((a, 0.5), (b, 1.0)):
        bins = row["rmse_by_distance"]
        assert {k: v["n"] for k, v in bins.items()} == expected
        for v in bins.values():  # every error is +-error, whatever the distance
            assert (v["rmse"] == pytest.approx(error) and v["mae"] == pytest.approx(error)) if v["n"] else \
                math.isnan(v["rmse"])
        assert len(row["pit"]) == 10 and sum(row["pit"]) == row["n"]
    # |z| = 1.67 for a: PIT 0.048 or 0.952, the two end bins only; |z| = 1 for b: PIT 0.16 or 0.84.
    assert a["pit"][0] + a["pit"][9] == a["n"] and min(a["pit"][0], a["pit"][9]) > 0
    assert b["pit"][1] + b["pit"][8] == b["n"]
    assert a["coverage_50"] == b["coverage_50"] == 0.0
    # 90% coverage by distance: |z| = 1.67 is outside the interval (1.645 sigma) everywhere, |z| = 1 inside.
    for row, inside in ((a, 0.0), (b, 1.0)):
        assert all(v == inside if expected[k] else math.isnan(v) for k, v in row["coverage_90_by_distance"].items())
    # Distances are taken on the horizontal grid whatever the dims' order.
    turned = ds.transpose("lat", "lon", "time")
    again = evaluate(turned, "sst", ["a"], infill_fn=Oracle(turned["sst"], {"a": (0.5, 0.3)}), seed=3)
    assert again["hidden_by_distance"] == expected


def test_evaluate_hides_exactly_the_observed_valid_cells_under_a_given_mask_in_wide_bins(tmp_path):
    ds = cube(steps=3)
    under = np.zeros((30, 40), bool)
    under[2:28, 0:36] = True  # one wide cloud over land and sea, every step
    turned = ds.transpose("lat", "time", "lon")  # the mask goes by dimension name
    fake = Oracle(turned["sst"], {"a": (0.5, 0.3)})
    res = evaluate(turned, "sst", ["a"], infill_fn=fake, seed=3,
                   hide_under=xr.DataArray(under, dims=("lat", "lon")), distance_bins=WIDE_DISTANCE_BINS)
    truth = ds["sst"].values
    expected = np.isfinite(truth) & ds["valid"].values & under  # land (not valid) is never hidden
    masked = fake.calls[0]["masked"].transpose(1, 0, 2)  # [lat, time, lon] -> [time, lat, lon]
    np.testing.assert_array_equal(np.isnan(masked) & np.isfinite(truth), expected)
    assert res["hidden_cells"] == int(expected.sum()) and res["donors"] == [DONOR_GIVEN] * 3
    assert list(res["hidden_by_distance"]) == [label for label, _ in WIDE_DISTANCE_BINS]
    assert res["hidden_by_distance"]["13-25"] > 0  # the cloud's middle is far from its rim
    assert list(res["rows"][0]["rmse_by_distance"]) == list(res["hidden_by_distance"])
    write_table([res], tmp_path / "t.md")
    text = (tmp_path / "t.md").read_text()
    assert "under a given cloud mask" in text and "| >25" in text and "13-25 (n=" in text
    np.testing.assert_array_equal(ds["sst"].values, truth)  # the input is never modified


def test_evaluate_refuses_a_mask_that_does_not_fit_or_hides_nothing():
    ds = cube(steps=2)
    fake = Oracle(ds["sst"], {"a": (0.5, 0.3)})
    with pytest.raises(ValueError, match=r"hide-under mask of shape \(3, 3\) does not fit 'sst'"):
        evaluate(ds, "sst", ["a"], infill_fn=fake, hide_under=np.ones((3, 3), bool))
    with pytest.raises(ValueError, match="must be boolean"):
        evaluate(ds, "sst", ["a"], infill_fn=fake, hide_under=np.full((30, 40), np.nan))
    with pytest.raises(ValueError, match="increasing upper edges ending at inf"):
        evaluate(ds, "sst", ["a"], infill_fn=fake, distance_bins=(("1", 1.0), ("2-3", 3.0)))
    with pytest.raises(ValueError, match="covers no observed cell"):
        evaluate(ds, "sst", ["a"], infill_fn=fake, hide_under=np.zeros((30, 40), bool))
    with pytest.raises(ValueError, match=r"dims \['depth'\]"):
        evaluate(ds, "sst", ["a"], infill_fn=fake,
                 hide_under=xr.DataArray(np.ones((2, 30), bool), dims=("depth", "lat")))


def test_evaluate_diagnostics_count_only_scored_cells():
    ds = cube(steps=4)
    oracle = Oracle(ds["sst"], {"a": (0.5, 0.3)})

    def patchy(masked_ds, variable, model, **kwargs):  # no usable std on the first 12 rows
        out = oracle(masked_ds, variable, model, **kwargs)
        out[f"{variable}_std"][:, :12] = np.nan
        return out

    res = evaluate(ds, "sst", ["a"], infill_fn=patchy, seed=3)
    row = res["rows"][0]
    assert 0 < row["n"] < res["hidden_cells"]
    assert sum(v["n"] for v in row["rmse_by_distance"].values()) == sum(row["pit"]) == row["n"]
    assert sum(res["hidden_by_distance"].values()) == res["hidden_cells"]


# -- tables and the command behind ``geonp evaluate`` ---------------------------------------------

def test_write_table_round_trips(tmp_path):
    ds = cube(steps=4)
    res = evaluate(ds, "sst", ["a", "b"], infill_fn=Oracle(ds["sst"], {"a": (0.5, 0.3), "b": (1.0, 1.0)}))
    md, js = write_table([res], tmp_path / "t.md", header="# Title\n\n- device: test")
    assert js == tmp_path / "t.json"
    text = md.read_text()
    assert text.startswith("# Title") and "| model | fit steps | RMSE |" in text
    # Strict JSON: an empty distance bin's NaN RMSE is written as null.
    assert json.loads(js.read_text())["results"][0] == json.loads(json.dumps(res), parse_constant=lambda _: None)
    table = [line for line in text.splitlines() if line.startswith("| a ") or line.startswith("| b ")]
    for line, row in zip(table, res["rows"]):
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        assert int(cells[1]) == row["fit_steps"]
        assert float(cells[2]) == pytest.approx(row["rmse"], rel=1e-3)
        assert float(cells[5]) == pytest.approx(row["crps"], rel=1e-3)
        assert int(cells[-1]) == row["n"]
    assert "**0.5**" in table[0]  # the best RMSE is bold


def test_write_table_has_distance_and_calibration_tables_and_renders_old_rows(tmp_path):
    ds = cube(steps=4)
    res = evaluate(ds, "sst", ["a", "b"], infill_fn=Oracle(ds["sst"], {"a": (0.5, 0.3), "b": (1.0, 1.0)}),
                   fit_steps=0)
    for key in ("rmse_by_distance", "pit", "coverage_50", "coverage_90_by_distance"):  # b as written before
        # the diagnostics existed
        del res["rows"][1][key]
    res["rows"][1]["commit"] = "abc1234"
    text = write_table([res], tmp_path / "t.md")[0].read_text()
    assert "| model | fit steps | RMSE | MAE | NLL | CRPS | cov50 | cov90 | cov95 |" in text
    assert "RMSE in degC by distance to the nearest observed cell (cells)" in text and "Calibration" in text
    n = res["hidden_by_distance"]
    assert f"| model | fit steps | 1 (n={n['1']}) | 2-3 (n={n['2-3']}) | 4-6 (n={n['4-6']}) |" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if "(n=" in line)
    a_row, b_row = lines[header + 2:header + 4]  # after the header and the separator
    assert a_row.startswith("| a | 0 | 0.5 |") and b_row == "| b | 0 | – | – | – | – | – |"
    pit = " ".join(map(str, res["rows"][0]["pit"]))
    assert f"| a | 0 | 0 | 0 | 1 | {pit} |" in text and "| b | 0 | – | 1 | 1 | – |" in text
    assert "| commit |" in text and "abc1234" in text
    assert "90% interval coverage by distance" in text and text.count("| b | 0 | – | – | – | – | – |") == 2


    for row in res["rows"]:  # a whole table from before the diagnostics: the main table only
        for key in ("rmse_by_distance", "pit", "coverage_50", "coverage_90_by_distance"):
            row.pop(key, None)
    del res["hidden_by_distance"]
    text = write_table([res], tmp_path / "old.md")[0].read_text()
    assert "| b | 0 |" in text and "(n=" not in text and "Calibration" not in text
    assert "coverage by distance" not in text


def test_run_evaluate_tiny_netcdf(tmp_path):
    path = tmp_path / "tiny.nc"
    ds = cube(steps=4)
    ds.assign(valid=ds["valid"].astype(np.int8)).rename(valid="mask").to_netcdf(path)
    with pytest.raises(ValueError) as info:
        run_evaluate(str(path), ["chl"], ["a"], str(tmp_path / "out.md"))
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "'chl'" in message

    fake = Oracle(ds["sst"], {"a": (0.5, 0.3)})
    results = run_evaluate(str(path), ["sst"], ["a"], str(tmp_path / "out.md"), valid_mask="mask", infill_fn=fake)
    assert results[0]["rows"][0]["rmse"] == pytest.approx(0.5, rel=1e-6)
    assert (tmp_path / "out.md").exists() and (tmp_path / "out.json").exists()
    with pytest.raises(ValueError, match=r"tiny\.nc.*model 'nope'"):
        run_evaluate(str(path), ["sst"], ["nope"], str(tmp_path / "out.md"), valid_mask="mask", infill_fn=fake)


# -- real clouds --------------------------------------------------------------------------------

def test_hide_cells_on_real_alboran_sst():
    from geonp.data.satellite import open_satellite

    ds = open_satellite(real_file(ALBORAN), "SST", valid_mask="mask")
    da, valid = ds["SST"].compute(), ds["valid"].compute()
    masked, hidden = hide_cells(da, valid, np.random.default_rng(0))
    sea = valid.values
    observed = np.isfinite(da.transpose("time", "lat", "lon").values) & sea
    h = hidden.transpose("time", "lat", "lon").values
    assert not (h & ~sea).any() and not (h & ~observed).any()
    donors = hidden.attrs["geonp_donor"]
    for t in range(len(donors)):
        if observed[t].sum() >= 50:
            share = h[t].sum() / observed[t].sum()
            assert 0.1 <= share <= 0.5, (t, share, donors[t])
    assert (donors >= 0).sum() >= 8  # real gap patterns, not synthetic clouds, on nearly every day


def test_evaluate_with_the_real_engine():
    scene = cube(steps=1).isel(time=0)  # the engine adds a time axis to a single scene: scored all the same
    res = evaluate(scene, "sst", ["linear"], options={"device": "cpu"})
    row = res["rows"][0]
    assert row["n"] > 0.9 * res["hidden_cells"] and row["wall_s"] > 0
    # Skill, not just a number: better than the field's spread overall (one wide synthetic cloud over a
    # smooth scene: 0.72 against 0.99), and most accurate next to observations (0.19 at one cell).
    by_distance = row["rmse_by_distance"]
    assert row["rmse"] < 0.8 * float(scene["sst"].std())
    assert by_distance["1"]["rmse"] < 0.4 * row["rmse"] < by_distance["7-12"]["rmse"]
    with pytest.raises(ValueError, match="unknown model 'nope'"):  # checked before any model runs
        evaluate(scene, "sst", ["linear", "nope"])


def test_a_model_with_nothing_to_fine_tune_reports_no_fit_steps(tiny_checkpoint):
    """Asked for infill's 30 steps, linear takes none: the fill's provenance says 0, and so does the
    evaluate table, while the row keeps the steps asked as the key pipelines merge runs by; a neural
    process says the steps it took, calibrated or not, and none on an input without gaps."""
    from conftest import smooth_cube

    import geonp

    ds = smooth_cube(t=2, r=20, c=24)
    assert geonp.infill(ds, "sst", "linear").attrs["geonp_fit_steps"] == 0
    assert geonp.infill(ds, "sst", checkpoint=tiny_checkpoint, fit_steps=2).attrs["geonp_fit_steps"] == 2
    # Calibrating sigma wraps the tuned model in one that does not learn: still the 2 steps it took.
    calibrated = geonp.infill(ds, "sst", checkpoint=tiny_checkpoint, fit_steps=2, calibrate_sigma=True)
    assert calibrated.attrs["geonp_fit_steps"] == 2
    full = ds.assign(sst=ds["sst"].fillna(0.0))  # nothing to fill: nothing fine-tuned
    assert geonp.infill(full, "sst", checkpoint=tiny_checkpoint, fit_steps=2).attrs["geonp_fit_steps"] == 0
    res = evaluate(ds, "sst", ["linear"], seed=0)
    row = res["rows"][0]
    assert row["fit_steps"] == FitOptions().steps and row["fit_steps_taken"] == 0  # asked (the row's key), taken
    assert "| linear | 0 |" in markdown(res)
