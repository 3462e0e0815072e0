"""Skill scores for gap filling: calibrated predictions score as theory says, bad ones worse."""

from __future__ import annotations

import math

import numpy as np
import pytest

from geonp.metrics import (
    DISTANCE_BINS,
    binned_coverage,
    binned_rmse,
    crps_normal,
    distance_to_observed,
    gaussian_skill,
    interval_score,
    normal_cdf,
    normal_pdf,
    normal_ppf,
    pit_histogram,
)


def test_calibrated_gaussian_scores_match_theory():
    rng = np.random.default_rng(0)
    y = rng.normal(2.0, 3.0, 400_000)
    s = gaussian_skill(y, np.full_like(y, 2.0), np.full_like(y, 3.0))
    assert s["rmse"] == pytest.approx(3.0, rel=0.01)
    assert s["mae"] == pytest.approx(3.0 * math.sqrt(2 / math.pi), rel=0.01)
    assert s["nll"] == pytest.approx(0.5 * math.log(2 * math.pi * 9) + 0.5, rel=0.01)
    # CRPS of N(mu, s^2) averaged over its own draws is s / sqrt(pi).
    assert s["crps"] == pytest.approx(3.0 / math.sqrt(math.pi), rel=0.01)
    assert s["coverage_50"] == pytest.approx(0.50, abs=0.003)
    assert s["coverage_90"] == pytest.approx(0.90, abs=0.003)
    assert s["coverage_95"] == pytest.approx(0.95, abs=0.003)


def test_closed_forms_agree_with_scoringrules():
    """The Gaussian CRPS and interval score geonp writes out equal the library's, point by point."""
    import scoringrules as sr

    rng = np.random.default_rng(2)
    y, mean, std = rng.normal(size=500), rng.normal(size=500), rng.uniform(0.05, 4.0, 500)
    np.testing.assert_allclose(crps_normal(y, mean, std), sr.crps_normal(y, mean, std), rtol=1e-10, atol=1e-12)
    lower, upper = mean - 1.64 * std, mean + 1.64 * std
    np.testing.assert_allclose(interval_score(y, lower, upper, 0.1), sr.interval_score(y, lower, upper, 0.1),
                               rtol=1e-10)


def test_overconfident_predictions_lose_coverage_and_score_worse():
    rng = np.random.default_rng(1)
    y = rng.normal(size=50_000)
    good = gaussian_skill(y, np.zeros_like(y), np.ones_like(y))
    narrow = gaussian_skill(y, np.zeros_like(y), np.full_like(y, 0.3))
    assert narrow["coverage_90"] < 0.5 and narrow["rmse"] == pytest.approx(good["rmse"])
    for key in ("nll", "crps", "interval_score_90"):
        assert narrow[key] > good[key]


def test_nan_points_are_dropped_and_nothing_to_score_is_an_error():
    s = gaussian_skill(np.array([1.0, np.nan, 3.0]), np.array([1.0, 0.0, np.nan]), np.ones(3))
    assert s["n"] == 1 and s["rmse"] == 0.0
    with pytest.raises(ValueError, match="no point"):
        gaussian_skill(np.array([np.nan]), np.zeros(1), np.ones(1))


# -- diagnostics: distance to the nearest observed cell, PIT ------------------------------------

def test_distance_to_observed_exact_on_a_small_grid():
    observed = np.zeros((2, 5, 5), bool)
    observed[0, 2, 2] = True  # step 1 has no observed cell at all
    d = distance_to_observed(observed)
    assert d.shape == observed.shape and d.dtype == np.float64
    assert d[0, 2, 2] == 0.0
    assert d[0, 2, 3] == 1.0 and d[0, 1, 2] == 1.0  # edge neighbours
    assert d[0, 3, 3] == pytest.approx(math.sqrt(2))  # diagonal
    assert d[0, 2, 4] == 2.0 and d[0, 0, 0] == pytest.approx(math.sqrt(8))
    assert np.isinf(d[1]).all()
    # Steps are independent: an observed cell at step 0 is not near the same cell of step 1.
    observed[1, 0, 0] = True
    assert distance_to_observed(observed)[1, 2, 2] == pytest.approx(math.sqrt(8))
    # A single scene (no step axis) works; fewer than two axes does not.
    np.testing.assert_array_equal(distance_to_observed(observed[0]), d[0])
    with pytest.raises(ValueError, match="two horizontal axes"):
        distance_to_observed(np.ones(4, bool))


def test_binned_rmse_puts_edge_distances_in_the_right_bins():
    distance = np.array([1.0, 1.0 + 1e-9, 3.0, 3.0 + 1e-9, 6.0, 6.0 + 1e-9, 12.0, 12.0 + 1e-9, np.inf, 2.0])
    err = np.array([1.0, 1.0, -3.0, 2.0, 2.0, -4.0, 4.0, 5.0, -5.0, np.nan])  # NaN: dropped
    bins = binned_rmse(err, distance)
    assert list(bins) == [label for label, _ in DISTANCE_BINS] == ["1", "2-3", "4-6", "7-12", ">12"]
    assert [b["n"] for b in bins.values()] == [1, 2, 2, 2, 2]
    assert bins["1"]["rmse"] == 1.0
    assert bins["2-3"]["rmse"] == pytest.approx(math.sqrt(5)) and bins["2-3"]["mae"] == 2.0  # 1 and -3
    assert bins["4-6"]["rmse"] == 2.0  # 2 (at 3+) and 2 (at 6)
    assert bins["7-12"]["rmse"] == 4.0  # -4 (at 6+) and 4 (at 12)
    assert bins[">12"]["rmse"] == 5.0  # 5 (at 12+) and -5 (no observed cell: inf)
    empty = binned_rmse(np.array([1.0]), np.array([1.0]))["7-12"]
    assert empty["n"] == 0 and math.isnan(empty["rmse"]) and math.isnan(empty["mae"])


def test_binned_coverage_near_the_level_when_calibrated_and_nan_when_empty():
    rng = np.random.default_rng(0)
    distance = np.repeat([1.0, 2.0, 5.0, 10.0], 20_000)
    std = np.repeat([0.5, 1.0, 2.0, 4.0], 20_000)
    err = rng.standard_normal(distance.size) * std
    cov = binned_coverage(err, std, distance)
    assert list(cov) == ["1", "2-3", "4-6", "7-12", ">12"] and math.isnan(cov[">12"])
    assert all(abs(cov[k] - 0.9) < 0.01 for k in ("1", "2-3", "4-6", "7-12"))
    narrow = binned_coverage(err, np.where(distance > 4, std / 2, std), distance)
    assert abs(narrow["1"] - 0.9) < 0.01 and narrow["7-12"] < 0.65  # too sure inside the gap: shown per bin
    assert binned_coverage(np.array([0.1, np.nan]), np.array([1.0, 1.0]), np.array([1.0, 1.0]), 0.5)["1"] == 1.0
    with pytest.raises(ValueError, match="level"):
        binned_coverage(err, std, distance, level=1.0)


def test_pit_histogram_flat_when_calibrated_u_when_too_narrow():
    rng = np.random.default_rng(2)
    n = 100_000
    y, mean = rng.normal(1.0, 2.0, n), np.full(n, 1.0)
    flat = pit_histogram(y, mean, np.full(n, 2.0))
    assert len(flat) == 10 and sum(flat) == n
    assert all(abs(c - n / 10) <= 0.1 * n / 10 for c in flat)
    narrow = pit_histogram(y, mean, np.full(n, 1.0))  # half the true spread: truths pile up in the tails
    assert sum(narrow) == n and min(narrow[0], narrow[-1]) > 2 * max(narrow[3:7])
    wide = pit_histogram(y, mean, np.full(n, 4.0))  # twice the spread: a hump
    assert max(wide[0], wide[-1]) < min(wide[4:6]) / 2
    assert gaussian_skill(y, mean, np.full(n, 2.0))["coverage_50"] == pytest.approx(0.5, abs=0.01)
    assert gaussian_skill(y, mean, np.full(n, 1.0))["coverage_50"] < 0.35
    # Points gaussian_skill would drop are dropped here too; other bin counts work.
    assert pit_histogram(np.array([0.0, np.nan, 0.0]), np.zeros(3), np.array([1.0, 1.0, 0.0]), bins=4) == [0, 0, 1, 0]


def test_the_normal_functions_equal_scipy_stats_to_the_bit():
    """geonp.metrics calls scipy.special rather than importing scipy.stats (0.37 s a command): the
    same values, dtypes and edge cases (float32 in, NaN, infinities, scalars)."""
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    z = np.concatenate([rng.normal(size=200) * 4, [np.nan, np.inf, -np.inf, 0.0, 40.0]])
    for x in (z, z.astype(np.float32), 0.3, np.float32(-1.2)):
        for mine, theirs in ((normal_cdf, norm.cdf), (normal_pdf, norm.pdf)):
            got, want = mine(x), theirs(x)
            assert np.asarray(got).dtype == np.asarray(want).dtype == np.float64
            np.testing.assert_array_equal(got, want)
    p = np.concatenate([rng.uniform(size=200), [0.0, 1.0, 0.5, np.nan]])
    for x in (p, p.astype(np.float32), 0.95):
        got, want = normal_ppf(x), norm.ppf(x)
        assert np.ndim(got) == np.ndim(want) and np.asarray(got).dtype == np.float64
        np.testing.assert_array_equal(got, want)
