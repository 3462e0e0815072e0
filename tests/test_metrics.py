"""Skill scores for gap filling: calibrated predictions score as theory says, bad ones worse."""

from __future__ import annotations

import math

import numpy as np
import pytest

from geonp.metrics import gaussian_skill


def test_calibrated_gaussian_scores_match_theory():
    rng = np.random.default_rng(0)
    y = rng.normal(2.0, 3.0, 400_000)
    s = gaussian_skill(y, np.full_like(y, 2.0), np.full_like(y, 3.0))
    assert s["rmse"] == pytest.approx(3.0, rel=0.01)
    assert s["mae"] == pytest.approx(3.0 * math.sqrt(2 / math.pi), rel=0.01)
    assert s["nll"] == pytest.approx(0.5 * math.log(2 * math.pi * 9) + 0.5, rel=0.01)
    # CRPS of N(mu, s^2) averaged over its own draws is s / sqrt(pi).
    assert s["crps"] == pytest.approx(3.0 / math.sqrt(math.pi), rel=0.01)
    assert s["coverage_90"] == pytest.approx(0.90, abs=0.003)
    assert s["coverage_95"] == pytest.approx(0.95, abs=0.003)


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
