"""Coherent samples of a filled scene (geonp.fill.samples) and the scores that test them
(geonp.sample_scores): exact at observed cells, the fill's own spread at each gap cell, errors
correlated as the scene's variogram says, and block means covered where independent draws are not."""

from __future__ import annotations

import numpy as np
import pytest

from geonp.fill.samples import correlation, draw_samples, plane_distance, scene_correlation, unconditional
from geonp.models.field_kriging import krige_scene
from geonp.sample_scores import block_mean_coverage, independent_draws, patches_and_blocks, sample_scores


def test_unconditional_fields_have_the_asked_correlation():
    fields = unconditional((40, 50), 400, range_cells=12.0, nugget_share=0.2, rng=np.random.default_rng(0))
    assert abs(fields.var() - 1.0) < 0.05
    for lag in (1, 4, 10):
        seen = np.mean(fields[:, :, :-lag] * fields[:, :, lag:])
        assert abs(seen - correlation(np.array(float(lag)), 12.0, 0.2)) < 0.05, lag


def scene(seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A field drawn with a known correlation, a wide cloud and scattered gaps: truth, input, gaps."""
    rng = np.random.default_rng(seed)
    truth = 10.0 + 2.0 * unconditional((48, 56), 1, 15.0, 0.05, rng)[0]
    values = truth.copy()
    values[12:36, 16:44] = np.nan
    values[rng.random(truth.shape) < 0.05] = np.nan
    return truth, values, np.isnan(values)


def test_samples_are_exact_where_observed_and_spread_as_sigma_where_filled():
    truth, values, gaps = scene()
    mean, std, _ = krige_scene(values, np.ones(values.shape, bool))
    samples = draw_samples(values, mean, std, gaps, 300, np.random.default_rng(2))
    assert np.array_equal(samples[:, ~gaps], np.broadcast_to(values[~gaps], (300, (~gaps).sum())))
    ratio = samples[:, gaps].std(0) / std[gaps]
    assert 0.9 < np.median(ratio) < 1.1 and np.all((ratio > 0.7) & (ratio < 1.3))
    # Neighbouring filled cells err together: deep in the cloud, errors a cell apart correlate strongly.
    err = samples[:, 20:28, 25:35] - mean[20:28, 25:35]
    assert np.mean(err[:, :, :-1] * err[:, :, 1:]) / np.mean(err**2) > 0.7
    again = draw_samples(values, mean, std, gaps, 300, np.random.default_rng(2))
    assert np.array_equal(samples, again, equal_nan=True)


def test_block_means_of_coherent_samples_are_covered_and_of_independent_draws_are_not():
    """Kriging's fill of scenes drawn from a known correlation: 90% intervals of the 8 x 8 block means
    from coherent samples cover near 0.9; from independent per-cell draws, far less."""
    coherent, independent = [], []
    for seed in range(6):
        truth, values, gaps = scene(seed)
        mean, std, _ = krige_scene(values, np.ones(values.shape, bool))
        rng = np.random.default_rng(seed)
        blocks = patches_and_blocks(gaps)["block"]
        for draws, out in ((draw_samples(values, mean, std, gaps, 64, rng), coherent),
                           (independent_draws(mean, std, 64, rng), independent)):
            out.append(block_mean_coverage(truth[gaps], draws[:, gaps], blocks, min_cells=16)[0])
    assert 0.75 <= np.mean(coherent) <= 1.0 and np.mean(independent) < np.mean(coherent) - 0.2


def test_block_mean_intervals_from_few_samples_cover_as_they_say():
    """Truths drawn from the distribution the samples come from fall in the 90% prediction interval
    of 16 samples 0.90 of the time (the plain +-1.645 s.d. of 16 samples covers about 0.87)."""
    from geonp.sample_scores import interval_halfwidth

    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(20000), 2)  # 20,000 groups of two cells
    truth, samples = rng.standard_normal(groups.size), rng.standard_normal((16, groups.size))
    coverage, scored = block_mean_coverage(truth, samples, groups)
    assert scored == 20000 and abs(coverage - 0.90) < 0.006
    assert abs(interval_halfwidth(16) - 1.8070) < 1e-4 and abs(interval_halfwidth(10**6) - 1.6449) < 1e-3
    means = samples.reshape(16, -1, 2).mean(-1)
    plain = np.mean(np.abs(truth.reshape(-1, 2).mean(-1) - means.mean(0)) <= 1.6449 * means.std(0, ddof=1))
    assert abs(plain - 0.869) < 0.006
    one = block_mean_coverage(truth, samples[:1], groups)  # one sample has no spread: no interval
    assert np.isnan(one[0]) and one[1] == 0


def test_sample_scores_name_every_figure():
    truth, values, gaps = scene()
    mean, std, _ = krige_scene(values, np.ones(values.shape, bool))
    scores = sample_scores(truth, draw_samples(values, mean, std, gaps, 16, np.random.default_rng(0)), gaps,
                           np.random.default_rng(0))
    assert set(scores) == {"energy", "variogram", "patch_cov90", "patches", "block_cov90", "blocks"}
    assert scores["energy"] > 0 and scores["variogram"] > 0 and scores["blocks"] > 10


def test_a_scene_too_sparse_for_a_variogram_gets_a_default_correlation():
    values = np.full((20, 30), np.nan)
    values[3, 4] = 1.0
    assert scene_correlation(values) == (7.5, 0.0)
    # A step with nothing observed (a stack's cloudy day): unconditioned draws of the fill.
    empty, mean, std = np.full((20, 30), np.nan), np.zeros((20, 30)), np.ones((20, 30))
    drawn = draw_samples(empty, mean, std, np.ones((20, 30), bool), 50, np.random.default_rng(0))
    assert np.isfinite(drawn).all() and 0.8 < drawn.std() < 1.2


def test_infill_writes_samples_in_memory_and_to_zarr_the_same(tmp_path, tiny_checkpoint):
    """``samples=N`` (``--samples N``): ``v_sample [sample, *v.dims]``, exact at observed cells,
    NaN outside the valid area, drawn at filled ones; the Zarr store holds the same numbers, one
    sample of one step per chunk; another seed gives other samples."""
    import xarray as xr
    from conftest import smooth_cube

    import geonp
    from geonp.cli import main

    ds = smooth_cube(t=2, r=24, c=30)
    out = geonp.infill(ds, "sst", model="te-pt-tnp", checkpoint=tiny_checkpoint, fit_steps=0, samples=3, seed=1)
    samples, flag = out["sst_sample"], out["sst_flag"].values
    assert samples.dims == ("sample", *out["sst"].dims) and samples.sizes["sample"] == 3
    values = samples.values
    observed = out["sst"].values[flag == 0]
    assert np.array_equal(values[:, flag == 0], np.broadcast_to(observed, (3, observed.size)))
    assert np.isfinite(values[:, flag == 1]).all() and np.isnan(values[:, flag == 2]).all()
    assert not np.array_equal(values[0, flag == 1], values[1, flag == 1])
    path = tmp_path / "in.nc"
    ds.to_netcdf(path)
    assert main(["infill", str(path), "--var", "sst", "--model", "te-pt-tnp", "--checkpoint", tiny_checkpoint,
                 "--fit-steps", "0", "--samples", "3", "--seed", "1", "-o", str(tmp_path / "out.zarr"), "-q"]) == 0
    stored = xr.open_zarr(tmp_path / "out.zarr")["sst_sample"]
    assert stored.encoding["preferred_chunks"] == {"sample": 1, "time": 1, "lat": 24, "lon": 30}
    np.testing.assert_allclose(stored.values, values, rtol=1e-6, equal_nan=True)
    other = geonp.infill(ds, "sst", model="te-pt-tnp", checkpoint=tiny_checkpoint, fit_steps=0, samples=3, seed=2)
    assert not np.allclose(other["sst_sample"].values[:, flag == 1], values[:, flag == 1])


def test_plot_draws_samples_beside_the_mean(tmp_path):
    """``geonp plot --samples 2`` adds two sample panels; asking for more than the store holds, or
    for samples of a store without them, is one line and exit code 2."""
    from conftest import smooth_cube

    from geonp.cli import main
    from geonp.fill.engine import infill_to_zarr
    from geonp.maps.figure import map_figure

    ds = smooth_cube(t=2, r=24, c=30)
    with_samples = infill_to_zarr(ds, tmp_path / "s.zarr", "sst", "linear", samples=2, progress=False)
    without = infill_to_zarr(ds, tmp_path / "plain.zarr", "sst", "linear", progress=False)
    import xarray as xr

    titles = [ax.get_title() for ax in map_figure(xr.open_zarr(with_samples), "sst", samples=2).axes]
    assert "sample 1" in titles and "sample 2" in titles
    assert main(["plot", str(with_samples), "-o", str(tmp_path / "m.png"), "--samples", "2"]) == 0
    assert (tmp_path / "m.png").stat().st_size > 0
    assert main(["plot", str(with_samples), "-o", str(tmp_path / "x.png"), "--samples", "3"]) == 2
    assert main(["plot", str(without), "-o", str(tmp_path / "y.png"), "--samples", "1"]) == 2


def test_evaluate_scores_samples_as_a_whole(tmp_path):
    """``geonp evaluate --samples N``: each row gains the samples' energy and variogram scores and
    block-mean coverages beside independent draws', and the table shows them."""
    from conftest import smooth_cube

    from geonp.cli import main
    from geonp.evaluate import evaluate

    ds = smooth_cube(t=3, r=32, c=40)
    res = evaluate(ds, "sst", ["kriging"], samples=8)
    scores = res["rows"][0]["samples"]
    assert {"energy", "independent_energy", "variogram", "block_cov90", "spread_ratio"} <= set(scores)
    assert scores["energy"] > 0 and 0.7 < scores["spread_ratio"] < 1.3
    path = tmp_path / "in.nc"
    ds.to_netcdf(path)
    assert main(["evaluate", str(path), "--var", "sst", "--model", "linear", "--samples", "4",
                 "-o", str(tmp_path / "e.md")]) == 0
    assert "Samples as a whole" in (tmp_path / "e.md").read_text()


def test_the_accessor_takes_samples():
    from conftest import smooth_cube

    import geonp  # noqa: F401  (registers ds.geonp)

    out = smooth_cube(t=1, r=20, c=24).geonp.infill("sst", model="linear", samples=2)
    assert out["sst_sample"].sizes["sample"] == 2 and out["sst_sample"].dims[1:] == out["sst"].dims


def test_the_errors_correlation_rule_is_a_choice_of_the_caller():
    """``correlation_fit`` replaces the scene's variogram: without its nugget, neighbouring cells near
    the cloud's rim err more alike (an experiment's variant, pipelines.experiments.samples_check)."""
    truth, values, gaps = scene()
    values = values + np.random.default_rng(3).normal(0, 0.8, values.shape)  # a rough scene: a real nugget
    mean, std, _ = krige_scene(values, np.ones(values.shape, bool))
    share = scene_correlation(values)[1]
    assert share > 0.05

    def rim_correlation(fit) -> float:
        drawn = draw_samples(values, mean, std, gaps, 200, np.random.default_rng(4), correlation_fit=fit)
        err = drawn[:, 12:36, 16:18] - mean[12:36, 16:18]  # the cloud's first two columns
        a, b = err[:, :, 0], err[:, :, 1]
        return float(np.mean(a * b) / np.sqrt(np.mean(a**2) * np.mean(b**2)))

    smooth = rim_correlation(lambda v: (scene_correlation(v)[0], 0.0))
    assert smooth > rim_correlation(scene_correlation) + 0.1


def test_the_samples_check_scores_every_sampler_from_one_fill(monkeypatch):
    """Every sampler draws from the one fill of the scene; the sequential one (a model's own sampling,
    coarse to fine) fills again twice per sample, its samples exact where observed."""
    import xarray as xr

    import geonp.fill.engine as engine
    from pipelines.experiments import samples_check, sequential_samples

    truth, _, _ = scene()
    ds = xr.Dataset({"v": (("lat", "lon"), truth)}, coords={"lat": np.arange(48) * 0.1, "lon": np.arange(56) * 0.1})
    calls = []
    real = engine.infill
    monkeypatch.setattr(engine, "infill", lambda *a, **k: calls.append(k.get("fit_steps")) or real(*a, **k))
    rows = samples_check.check_scene(ds, "v", None, "linear", 4, 0, ["scene", "no-nugget", "range2"])
    assert len(calls) == 1 and [r["variant"] for r in rows] == ["scene", "no-nugget", "range2"]
    assert len({r["rmse"] for r in rows}) == 1  # one fill
    assert len({r["energy"] for r in rows}) == 3 and all(r["spread_ratio"] > 0.5 for r in rows)

    calls.clear()
    holes = ds.assign(v=ds.v.where((np.arange(56) < 20) | (np.arange(56) > 30)))  # a band of gaps
    fill = real(holes, "v", "linear", fit_steps=0)
    out = sequential_samples.sequential_samples(fill, holes, "v", "linear", 3, 0, {"fit_steps": 30})
    assert len(calls) == 3 * len(sequential_samples.STRIDES) and set(calls) == {sequential_samples.REFIT_STEPS}
    drawn = out.v_sample.values
    seen = np.isfinite(holes.v.values)
    assert np.array_equal(drawn[:, seen], np.broadcast_to(holes.v.values[seen], (3, seen.sum())))
    assert np.isfinite(drawn).all() and not np.allclose(drawn[0], drawn[1])


def test_plane_distance_is_numpys_norm_to_the_bit():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(50, 8, 1, 2)) * 100, rng.normal(size=(50, 1, 8, 2)) * 100
    np.testing.assert_array_equal(plane_distance(a, b), np.linalg.norm(a - b, axis=-1))
    cells = rng.integers(0, 500, size=(50, 1, 2))  # integer cells against float points, as the weights use
    np.testing.assert_array_equal(plane_distance(a[:, :, 0], cells), np.linalg.norm(a[:, :, 0] - cells, axis=-1))


def test_the_samples_check_names_scenes_a_variant_makes_worse_beyond_the_seeds_spread():
    """A variant is worse on a scene only where it loses to geonp's rule by more than geonp's rule
    drawn from other seeds moves; a replicate's own line shows the seeds' spread over the suite."""
    from pipelines.experiments.samples_check import variant_lines

    def row(scene, variant, energy, variogram=10.0, block=0.9):
        return {"scene": scene, "model": "m", "variant": variant, "energy": energy, "variogram": variogram,
                "patch_cov90": block, "block_cov90": block}

    rows = [row("a", "scene", 1.00), row("a", "scene~s1", 1.02), row("a", "range2", 1.01, block=0.88),
            row("b", "scene", 2.00), row("b", "scene~s1", 1.99), row("b", "range2", 2.10, block=0.7)]
    lines = variant_lines(rows)
    assert len(lines) == 2 and lines[0].startswith("- m (range2) against m (2 scenes)")
    assert lines[1].startswith("- m (scene~s1) against m (2 scenes)") and "worse beyond" not in lines[1]
    # With two replicates each is judged against the other: what chance alone reaches.
    rows += [row("a", "scene~s2", 1.001), row("b", "scene~s2", 2.05), row("b", "range2", 2.10)]
    lines = variant_lines(rows[:-1])
    assert "worse beyond the seeds' spread on 1: b" in lines[0]  # 2.10 against 2.00: beyond 0.05
    assert "by chance, worse beyond the seeds' spread on 1: a" in lines[1]  # s1 against s2 on a
    assert "by chance, worse beyond the seeds' spread on 1: b" in lines[2]  # s2 against s1 on b
    assert "worse beyond the seeds' spread on 1: b" in lines[0]
    assert "block_cov90 mean |cov - 0.90| +0.110" in lines[0]


def test_a_rewritten_samples_table_says_the_samples_it_was_run_with(tmp_path, monkeypatch, capsys):
    """``--rewrite`` takes the sample count from the stored table, not from ``--samples``' default
    (a 64-sample table once said 16); a table stored before the count was kept gives its budget line's."""
    import json
    import sys

    from pipelines.experiments.samples_check import main, stored_samples, write

    row = {"scene": "a", "model": "m", "variant": "scene", "hidden_cells": 9, "wall_s": 1.0, "spread_ratio": 1.0,
           **{k + f: 1.0 for k in ("", "independent_") for f in ("energy", "variogram", "patch_cov90", "block_cov90")}}
    text = "# t\n\n- budget: 64 samples; each model with its defaults\n"
    write(tmp_path / "t.md", text, [row], 64)
    stored = json.loads((tmp_path / "t.json").read_text())
    assert stored_samples(stored) == 64 and "64 samples per scene" in (tmp_path / "t.md").read_text()
    assert stored_samples({"header": text.replace("64", "32"), "rows": []}) == 32
    with pytest.raises(ValueError, match="no sample count"):
        stored_samples({"header": "# t\n", "rows": []})
    # The command itself: --rewrite with --samples' default writes the stored count.
    (tmp_path / "t.md").write_text("")
    monkeypatch.setattr(sys, "argv", ["samples_check", "--rewrite", "--out", str(tmp_path / "t")])
    main()
    assert "64 samples per scene" in (tmp_path / "t.md").read_text()


def test_the_oracle_sigma_diagnostic_scales_sigma_to_cover_the_truth():
    """A fill whose sigma is half what it should be gets twice the scale of the same fill with its
    sigma as given, and samples spread by the scaled sigma; a truth of another shape is refused."""
    import xarray as xr

    from geonp.fill.output import FLAG_INFILLED, FLAG_OBSERVED
    from pipelines.experiments.samples_check import oracle_sigma

    truth, values, gaps = scene()
    mean, std, _ = krige_scene(values, np.ones(values.shape, bool))
    dims = ("lat", "lon")
    flag = np.where(gaps, FLAG_INFILLED, FLAG_OBSERVED).astype(np.int8)

    def fill(sigma):
        return xr.Dataset({"v": (dims, np.where(gaps, mean, values)), "v_std": (dims, np.where(gaps, sigma, 0.0)),
                           "v_flag": (dims, flag)})

    scales: dict[str, float] = {}
    known = truth.copy()
    known[20:24, 20:30] = np.nan  # a real gap: filled, with no truth to score
    oracle_sigma(xr.DataArray(known, dims=dims), scales)(fill(std), None, "v", "m", 2, 0, {})
    hidden = gaps & np.isfinite(known)
    z = np.abs(truth[hidden] - mean[hidden]) / std[hidden]
    assert np.mean(z <= 1.6449 * scales["v"]) == pytest.approx(0.90, abs=0.005)  # the hidden cells covered 0.90
    oracle_sigma(xr.DataArray(truth, dims=dims), scales)(fill(std), None, "v", "m", 2, 0, {})
    given = scales["v"]
    out = oracle_sigma(xr.DataArray(truth, dims=dims), scales)(fill(std / 2), None, "v", "m", 200, 0, {})
    assert scales["v"] == pytest.approx(2 * given, rel=1e-9) and 0.3 < given < 3
    ratio = np.median(out["v_sample"].values[:, gaps].std(0) / (std[gaps] / 2))
    assert ratio == pytest.approx(scales["v"], rel=0.15)
    np.testing.assert_array_equal(out["v_std"].values, fill(std / 2)["v_std"].values)  # the fill's own sigma kept
    with pytest.raises(ValueError, match="not shaped as the fill"):
        oracle_sigma(xr.DataArray(truth[:-1], dims=dims), scales)(fill(std), None, "v", "m", 2, 0, {})
