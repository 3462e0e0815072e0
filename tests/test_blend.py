"""pipelines.experiments.blend: cells hidden under the input's own gap shapes, weights that fit, sigma that covers."""

from __future__ import annotations

import numpy as np
import pytest

from geonp.metrics import WIDE_DISTANCE_BINS
from pipelines.experiments.blend import SHRINK_CELLS, apply_blend, best_weights, check_cells, fit_blend


def test_check_cells_hides_observed_cells_of_steps_with_gaps_within_the_share():
    rng = np.random.default_rng(0)
    observed = np.ones((3, 40, 50), bool)
    gaps = np.zeros_like(observed)
    gaps[0, 5:15, 5:20] = True  # step 0's gap: 150 cells
    observed[0] = ~gaps[0]
    gaps[2, 20:30, 10:40] = True  # step 2's gap: 300 cells
    observed[2] = ~gaps[2]
    hidden = check_cells(observed, gaps, rng, share=(0.05, 0.3))
    assert not (hidden & ~observed).any()
    for t in (0, 2):
        share = hidden[t].sum() / observed[t].sum()
        assert 0.05 <= share <= 0.3
    assert not hidden[1].any()  # no gap to fill in step 1: nothing to check there
    # Same generator state, same cells.
    assert np.array_equal(hidden, check_cells(observed, gaps, np.random.default_rng(0), share=(0.05, 0.3)))


def test_check_cells_copies_the_steps_own_gap_shapes():
    """A single step: its hidden cells are its own gap shape moved elsewhere (a 12 x 12 square)."""
    observed = np.ones((1, 60, 60), bool)
    gaps = np.zeros_like(observed)
    gaps[0, 10:22, 30:42] = True
    observed &= ~gaps
    hidden = check_cells(observed, gaps, np.random.default_rng(3), share=(0.02, 0.3))[0]
    rows, cols = np.nonzero(hidden)
    # A wrapped square may be split at the border, but never holds more than the square's cells.
    assert 0 < hidden.sum() <= 144
    assert len(set(rows)) <= 12 + 12 and len(set(cols)) <= 12 + 12


def test_best_weights_finds_the_error_minimising_mix():
    rng = np.random.default_rng(1)
    truth = rng.normal(size=2000)
    a = truth + rng.normal(scale=1.0, size=2000)
    b = truth + rng.normal(scale=1.0, size=2000)  # independent errors of equal size: the mix is half-half
    w = best_weights(np.stack([a - truth, b - truth]))
    assert w == pytest.approx([0.5, 0.5], abs=0.1)
    bad = truth + rng.normal(scale=5.0, size=2000)
    assert best_weights(np.stack([bad - truth, a - truth]))[1] > 0.9


def test_fit_blend_learns_by_distance_and_covers_90_percent():
    rng = np.random.default_rng(2)
    n = 6000
    distance = rng.choice([1.0, 5.0, 30.0], size=n)
    truth = rng.normal(size=n)
    near = distance < 10
    # Filler 0 is good near the observations and poor far away; filler 1 the other way round.
    f0 = truth + rng.normal(size=n) * np.where(near, 0.2, 2.0)
    f1 = truth + rng.normal(size=n) * np.where(near, 2.0, 0.2)
    stds = np.full((2, n), 0.3)  # too wide near where each filler is good: the scales narrow it
    blend = fit_blend(truth, distance, np.stack([f0, f1]), stds, ("np", "linear"))
    bins = {label: i for i, (label, _) in enumerate(WIDE_DISTANCE_BINS)}
    assert blend.weights[bins["1"], 0] > 0.8 and blend.weights[bins[">25"], 1] > 0.8
    assert np.allclose(blend.weights.sum(1), 1.0)
    mean, sigma = apply_blend(blend, distance, np.stack([f0, f1]), stds)
    inside = np.abs(mean - truth) <= 1.6448536269514722 * sigma
    for d in (1.0, 5.0, 30.0):
        assert inside[distance == d].mean() == pytest.approx(0.9, abs=0.03)
    assert blend.cells.sum() == n and "sigma x" in blend.describe()


def test_a_bin_with_few_cells_leans_on_all_bins():
    rng = np.random.default_rng(4)
    n = 3000
    distance = np.ones(n)
    distance[:20] = 30.0  # 20 far cells, where filler 1 happens to be better
    truth = rng.normal(size=n)
    f0 = truth + rng.normal(size=n) * 0.2
    f1 = truth + rng.normal(size=n) * 2.0
    f1[:20] = truth[:20]
    blend = fit_blend(truth, distance, np.stack([f0, f1]), np.ones((2, n)), ("np", "linear"))
    far = [label for label, _ in WIDE_DISTANCE_BINS].index(">25")
    # 20 cells against SHRINK_CELLS pseudo-cells of the all-bins blend (filler 0): filler 0 keeps most weight.
    assert blend.weights[far, 0] >= SHRINK_CELLS / (SHRINK_CELLS + 20) - 0.05


def test_no_usable_cell_keeps_the_first_filler():
    blend = fit_blend(np.array([np.nan]), np.array([1.0]), np.zeros((2, 1)), np.ones((2, 1)), ("np", "linear"))
    assert (blend.weights[:, 0] == 1).all() and (blend.scales == 1).all()
