"""The scene suite (issue 53): its draw keeps the rule, its noise is what resampling says, its rule refuses noise."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import xarray as xr
import yaml

from geonp.evaluate import evaluate
from pipelines import suite_table
from pipelines.benchmarks.suite import BINS, block_stats
from pipelines.suite_rule import compare, coverage_interval, geometric_interval, load_rows, ratio_interval
from tests.conftest import data_dir


def _row(scene: str, model: str, errors: np.ndarray, std: float = 1.0, block: int = 8) -> dict:
    """A suite row for one step of 32 x 32 hidden cells with the given errors (truth 0), all at distance 1."""
    shape = (1, 32, 32)
    cells = {"shape": shape, "index": np.arange(errors.size), "truth": np.zeros(errors.size),
             "distance": np.ones(errors.size)}
    return {"scene": scene, "model": model, "blocks": block_stats(cells, errors, np.full(errors.size, std), block)}


def test_block_sums_give_back_the_scores_evaluate_reports():
    """The block sums of a real evaluation add up to its RMSE and CRPS and its coverage by bin."""
    rng = np.random.default_rng(0)
    field = np.cumsum(np.cumsum(rng.normal(size=(1, 40, 48)), 1), 2) / 10
    ds = xr.Dataset({"v": (("time", "lat", "lon"), field)},
                    coords={"time": [0], "lat": np.linspace(40, 44, 40), "lon": np.linspace(0, 5, 48)})
    under = np.zeros(field.shape, bool)
    under[0, 10:25, 5:30] = True
    res = evaluate(ds, "v", ["linear"], hide_under=under, distance_bins=BINS, keep_cells=True)
    row = res["rows"][0]
    sums = block_stats(res["cells"], row["mean"], row["std"], 16)
    n = sum(sums["n"])
    assert n == row["n"] == res["hidden_cells"]
    assert math.isclose(math.sqrt(sum(sums["sse"]) / n), row["rmse"], rel_tol=1e-5)
    assert math.isclose(sum(sums["crps"]) / n, row["crps"], rel_tol=1e-5)
    by_bin = {i: sum(c for b, c in zip(sums["bin"], sums["in90"]) if b == i) /
              sum(c for b, c in zip(sums["bin"], sums["n"]) if b == i) for i in set(sums["bin"])}
    for i, cover in by_bin.items():
        assert math.isclose(cover, row["coverage_90_by_distance"][BINS[i][0]], rel_tol=1e-9)
    # Blocks are 16 x 16 cells of the step: the 15 x 25 hidden rectangle spans rows 0-1 and columns 0-1 of them.
    assert set(sums["block"]) <= {0, 1, 3, 4}


def test_a_row_against_itself_is_a_ratio_of_one_and_a_doubled_error_is_beyond_noise():
    rng = np.random.default_rng(1)
    err = rng.normal(size=1024)
    a, b = _row("s", "a", err), _row("s", "b", 2 * err)
    assert ratio_interval(a, a, "rmse") == (1.0, 1.0, 1.0)
    ratio, low, high = ratio_interval(b, a, "rmse")
    assert all(math.isclose(x, 2.0, rel_tol=1e-5) for x in (ratio, low, high))  # paired blocks: no noise
    noisy = _row("s", "c", err + rng.normal(scale=0.05, size=1024))
    ratio, low, high = ratio_interval(noisy, a, "rmse")
    assert low < ratio < high and low < 1.0 < high * 1.01  # a small perturbation stays inside its noise


def test_the_suite_interval_resamples_scenes():
    assert geometric_interval([0.9] * 10) == pytest.approx((0.9, 0.9, 0.9))
    mean, low, high = geometric_interval([0.5, 2.0, 0.5, 2.0])
    assert mean == pytest.approx(1.0) and low < 1.0 < high
    assert all(math.isnan(x) for x in geometric_interval([]))


def test_the_rule_adopts_a_clear_gain_and_refuses_one_scene_made_worse():
    rng = np.random.default_rng(2)
    rows = []
    for s in range(8):
        err = rng.normal(size=1024)
        rows += [_row(f"s{s}", "base", err), _row(f"s{s}", "better", 0.8 * err)]
    verdict = compare(rows, "better", "base")
    assert verdict.adopt and not verdict.worse
    assert verdict.suite["rmse"][2] < 1 and verdict.suite["crps"][2] < 1
    rows = [r for r in rows if not (r["scene"] == "s3" and r["model"] == "better")]
    rows.append(_row("s3", "better", 1.5 * rng.normal(size=1024)))
    verdict = compare(rows, "better", "base")
    assert not verdict.adopt and verdict.worse == ["s3"]
    # A gain inside the scenes' spread is not adopted either.
    mixed = []
    for s in range(6):
        err = rng.normal(size=1024)
        mixed += [_row(f"s{s}", "base", err), _row(f"s{s}", "mixed", (0.9 if s % 2 else 1.08) * err)]
    assert not compare(mixed, "mixed", "base").adopt


def test_a_seed_replicate_widens_a_scene_and_a_cut_passes_only_within_its_margin():
    """A move as large as a rerun with another seed gives is no longer beyond noise once the rerun is
    named; a cost cut losing 0.5% everywhere passes the equivalence test, one losing 3% does not."""
    rng = np.random.default_rng(3)
    rows = []
    for s in range(8):
        err = rng.normal(size=1024)
        rows += [_row(f"s{s}", "base", err), _row(f"s{s}", "rerun", err * (1.02 if s % 2 else 1 / 1.02)),
                 _row(f"s{s}", "cand", err * (1.02 if s == 2 else 1.0)),
                 _row(f"s{s}", "cut", err * 1.005), _row(f"s{s}", "costly", err * 1.03)]
    assert compare(rows, "cand", "base").worse == ["s2"]  # blocks alone: 2% on every block is real
    widened = compare(rows, "cand", "base", replicates=["rerun"])
    assert not widened.worse and widened.replicates == ("rerun",)
    assert not compare(rows, "cut", "base").adopt  # a loss is never adopted as a gain
    assert compare(rows, "cut", "base", cut=True).adopt is False  # 0.5% on every block: each scene worse
    assert compare(rows, "cut", "base", replicates=["rerun"], cut=True).adopt  # inside the seeds' noise
    assert not compare(rows, "costly", "base", replicates=["rerun"], cut=True).adopt  # 3%: beyond the margin


def test_a_cut_whose_intervals_narrow_is_rejected_though_its_scores_hold():
    """Sigma 5% narrower on every scene leaves RMSE and CRPS within the cut's margin but moves 90%
    coverage away from 0.90 on every scene: the cut is rejected for its calibration alone."""
    rng = np.random.default_rng(5)
    rows = []
    for s in range(12):
        err = rng.normal(size=1024)
        rows += [_row(f"s{s}", "base", err), _row(f"s{s}", "rerun", err * (1.01 if s % 2 else 1 / 1.01)),
                 _row(f"s{s}", "narrow", err, std=0.95)]
    narrow = compare(rows, "narrow", "base", replicates=["rerun"], cut=True)
    assert all(narrow.suite[m][2] < 1.01 for m in ("rmse", "crps")) and not narrow.worse
    assert narrow.calibration_worse and not narrow.adopt
    assert not compare(rows, "rerun", "base", cut=True).calibration_worse


def test_the_table_stores_a_scene_layout_once_and_reads_every_row_back_whole(tmp_path):
    """Rows sharing their scene's block layout keep only their sums on disk; a row that scored fewer
    cells keeps its own; the rule reads the same rows that were written, and an older table (rows
    whole, no layouts) still reads."""
    rng = np.random.default_rng(2)
    errors = rng.normal(size=1024)
    partial = errors.copy()
    partial[:100] = np.nan  # a model that left 100 cells unscored: a different layout
    rows = [_row("a#0", "linear", errors), _row("a#0", "kriging", errors / 2), _row("a#0", "odd", partial),
            _row("b#0", "linear", errors[::-1])]
    path = tmp_path / "suite_validation.json"
    suite_table.write(path, "header", "validation", [{"scene": "a#0"}, {"scene": "b#0"}], rows)
    stored = json.loads(path.read_text())
    assert set(stored["layouts"]) == {"a#0", "b#0"}
    assert [set(r["blocks"]) for r in stored["rows"]] == [{"sse", "crps", "in90"}] * 2 + [
        {"block", "bin", "n", "sse", "crps", "in90"}, {"sse", "crps", "in90"}]
    assert suite_table.read(path)["rows"] == json.loads(json.dumps(rows))
    assert load_rows("validation", path) == json.loads(json.dumps(rows))
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"header": "h", "split": "validation", "scenes": [], "rows": rows}))
    assert suite_table.read(old)["rows"] == json.loads(json.dumps(rows))
    # A row's own figures are kept to 6 significant digits; the block sums the rule reads are not touched.
    figures = {**rows[0], "rmse": 0.123456789, "rmse_by_distance": {"1": 2.0 / 3.0, ">25": None}, "commit": "abc"}
    suite_table.write(path, "header", "validation", [{"scene": "a#0"}], [figures])
    back = suite_table.read(path)["rows"][0]
    assert (back["rmse"], back["rmse_by_distance"], back["commit"]) == (0.123457, {"1": 0.666667, ">25": None}, "abc")
    assert back["blocks"] == json.loads(json.dumps(rows[0]["blocks"]))


def test_figures_by_distance_are_left_off_the_disk_where_the_block_sums_give_them_back(tmp_path):
    """A row's RMSE, counts and coverage by distance are stored only where the block sums do not give
    them back to the digit; a scored row that had none reads back without them."""
    rng = np.random.default_rng(3)
    base = _row("a#0", "linear", rng.normal(size=1024))
    figures = suite_table.by_distance(json.loads(json.dumps(base["blocks"])), suite_table.bin_labels())
    assert figures["n_by_distance"]["1"] == 1024 and figures["n_by_distance"][">25"] == 0
    assert figures["cov90_by_distance"][">25"] is None
    derivable = {**base, "rmse": 1.0, **figures}
    odd = {**derivable, "model": "odd", "rmse_by_distance": {**figures["rmse_by_distance"], "1": 9.0}}
    bare = {**base, "model": "bare", "rmse": 1.0}
    path = tmp_path / "suite_validation.json"
    suite_table.write(path, "header", "validation", [{"scene": "a#0"}], [derivable, odd, bare])
    stored = json.loads(path.read_text())["rows"]
    assert [set(suite_table.BY_DISTANCE) & set(r) for r in stored] == [set(), {"rmse_by_distance"},
                                                                       set(suite_table.BY_DISTANCE)]
    assert all(stored[2][k] is None for k in suite_table.BY_DISTANCE)
    back = suite_table.read(path)["rows"]
    assert back == json.loads(json.dumps([derivable, odd, bare]))
    assert [list(r) for r in back] == [list(r) for r in (derivable, odd, bare)]  # a rewrite keeps each line
    nll_first = {"scene": "a#0", "model": "linear", "rmse": 1.0, "nll": 0.5, **figures, "wall_s": 1.0,
                 "blocks": base["blocks"]}
    suite_table.write(path, "header", "validation", [{"scene": "a#0"}], [nll_first])
    assert list(suite_table.read(path)["rows"][0]) == list(nll_first)


def test_coverage_interval_counts_cells_inside_the_90_percent_interval():
    err = np.concatenate([np.zeros(900), np.full(124, 5.0)])  # 900 of 1024 inside +-1.645 sigma
    cover, low, high, n = coverage_interval(_row("s", "m", err))
    assert n == 1024 and cover == pytest.approx(900 / 1024) and low <= cover <= high


@pytest.fixture(scope="module")
def drawn():
    if data_dir() is None:
        pytest.skip("real data folder absent (set GEONP_DATA or provide ../shared/data)")
    from pipelines import suite_scenes

    return suite_scenes, suite_scenes.draw()


def test_the_draw_keeps_its_rule(drawn):
    suite_scenes, scenes = drawn
    spec = suite_scenes.SPEC
    assert len(scenes) >= 40 and len({s.product for s in scenes}) >= 10
    val = {s.product for s in scenes if s.split == "validation"}
    test = {s.product for s in scenes if s.split == "test"}
    assert len(test) >= 3 and not val & test
    # Nothing of a test product is in the mask pool or in the bundled weights' training fields.
    test_paths = {spec["products"][p].get("path") for p in test} - {None}
    assert not test_paths & {m["path"] for m in spec["masks"]}
    trained = yaml.safe_load(open("pipelines/weights/resume/accuracy/history-folds-small/config.yaml"))["data"]
    named = {f.get("path") for f in trained["files"] + trained["val_files"]} | \
        {p for f in trained["files"] for p in f.get("paths", [])}
    assert not test_paths & named
    assert {s.kind for s in scenes} == {"single", "multi"}
    low, high = spec["hidden"]
    for scene in scenes:
        ds, variable, under = suite_scenes.load(scene)
        target = scene.target - scene.steps[0]
        seen = np.isfinite(ds[variable].values[target]) & ds["valid"].values
        share = (under[target] & seen).sum() / seen.sum()
        assert low <= share <= high, scene.name
        assert not under[np.arange(under.shape[0]) != target].any(), scene.name
        assert ds[variable].shape[1:] == scene.shape and ds.sizes["time"] == scene.steps[1] - scene.steps[0]


def test_the_draw_is_the_same_every_time(drawn):
    suite_scenes, scenes = drawn
    suite_scenes.product.cache_clear()
    suite_scenes._gap_layers.cache_clear()
    assert suite_scenes.draw() == scenes


def test_fill_options_rows_are_checked_before_anything_runs():
    """``--options LABEL=JSON`` takes geonp.infill's fill options; an unknown one is the parser's one-line error."""
    import argparse

    from pipelines.benchmarks.suite import fill_rows

    parser = argparse.ArgumentParser(prog="suite")
    assert fill_rows(parser, ['calsig={"calibrate_sigma": true}']) == {"calsig": {"calibrate_sigma": True}}
    for bad in ('{"calibrate": true}', '{"seed": 1}', '{"fit_steps": 0}', '{"fit": {"steps": 3}}', '{"samples": 2}'):
        with pytest.raises(SystemExit):
            fill_rows(parser, [f"bad={bad}"])


def test_a_row_label_is_checked_before_anything_runs(monkeypatch, capsys):
    """A row is LABEL[~sSEED][@FIT]: anything else is the parser's one-line error, before any scene loads."""
    from pipelines.benchmarks import suite

    for bad in ("te-pt-tnp~x", "te-pt-tnp@0~s1", "te-pt-tnp@two"):
        monkeypatch.setattr("sys.argv", ["suite", "--split", "validation", "--rows", bad])
        with pytest.raises(SystemExit) as stop:
            suite.main()
        assert stop.value.code == 2 and "LABEL[~sSEED][@FIT_STEPS]" in capsys.readouterr().err


def test_the_overlap_ceilings_find_what_hindsight_can_gain():
    """Two fills whose errors cancel blend to zero error at w = 0.5; a fill better in one bin is chosen there."""
    from pipelines.suite_overlap import overlap

    rng = np.random.default_rng(3)
    e = rng.normal(size=400)
    distance = np.where(np.arange(400) < 200, 1.0, 20.0)  # bins "1" and "13-25", 200 cells each
    cells = {"truth": np.zeros(400), "distance": distance, "te-pt-tnp:mean": e, "kriging:mean": -e,
             "linear:mean": 5 * e}
    out = overlap(cells)
    assert out["other"] == "kriging" and math.isclose(out["correlation"], -1.0, abs_tol=1e-12)
    assert out["blend_weight"] == 0.5 and out["blend_rmse"] < 1e-12
    # Kriging twice as good beyond 12 cells only: the per-bin choice takes it there and te-pt-tnp near.
    kriging = np.where(distance > 12, e / 2, 2 * e)
    cells = {**cells, "kriging:mean": kriging, "dineof:mean": 3 * e}
    out = overlap(cells)
    expected = math.sqrt((np.sum(e[:200] ** 2) + np.sum((e[200:] / 2) ** 2)) / 400)
    assert out["other"] == "kriging" and math.isclose(out["by_bin_rmse"], expected, rel_tol=1e-12)
    # Worse near and better far, kriging adds nothing to a single blend weight: te-pt-tnp alone is best.
    assert out["blend_weight"] == 1.0 and math.isclose(out["blend_rmse"], out["model_rmse"])
    with pytest.raises(ValueError, match="need 'te-pt-tnp'"):
        overlap({"truth": np.zeros(3), "distance": np.ones(3), "linear:mean": np.ones(3)})
