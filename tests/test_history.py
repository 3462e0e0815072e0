"""DINEOF (``geonp.tasks.history``): a stack's gaps from the EOFs of its own history."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from geonp.tasks.clouds import random_clouds
from geonp.tasks.dineof import dineof


def low_rank_stack(steps: int = 20, rows: int = 60, cols: int = 70, noise: float = 0.1, seed: int = 1):
    """Three spatial patterns with random daily amplitudes plus noise, under cloud-shaped gaps:
    ``(truth, with gaps)``, both ``[T, R, C]``."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:rows, 0:cols]
    patterns = [np.sin(yy / 9.0) + np.cos(xx / 13.0), np.sin((xx + yy) / 11.0), np.cos(yy / 5.0) * np.sin(xx / 7.0)]
    amps = rng.normal(size=(steps, 3)) * [3.0, 1.5, 0.8]
    truth = 20 + sum(a[:, None, None] * p for a, p in zip(amps.T, patterns)) + rng.normal(0, noise, (steps, rows, cols))
    given = truth.copy()
    for t in range(steps):
        given[t][random_clouds((rows, cols), rng.uniform(0.2, 0.7), rng, 6.0)] = np.nan
    return truth, given


def test_a_low_rank_stack_is_filled_to_its_noise_and_the_modes_are_found():
    truth, given = low_rank_stack()
    rec = dineof(given)
    gap = np.isnan(given)
    rmse = np.sqrt(np.mean((rec.mean[gap] - truth[gap]) ** 2))
    assert rmse < 0.25  # noise 0.1; the field's own spread is about 3
    assert 3 <= rec.modes <= 10
    assert min(rec.cv_rmse, key=rec.cv_rmse.get) == rec.modes
    # Fewer modes than the field holds fit worse at the cross-validation cells.
    assert rec.cv_rmse[1] > 2 * rec.cv_rmse[rec.modes]


def one_cloud_stack(cover: float, steps: int = 12, seed: int = 3):
    """A gap-free low-rank stack with one cloud over one step (a reanalysis under a borrowed
    satellite mask, as the scene suite builds them): ``(truth, with the cloud)``."""
    truth, _ = low_rank_stack(steps=steps, noise=0.1, seed=seed)
    given = truth.copy()
    given[steps // 2][random_clouds(truth.shape[1:], cover, np.random.default_rng(seed), 6.0)] = np.nan
    return truth, given


@pytest.mark.parametrize("cover", [0.08, 0.3])
def test_a_gap_free_stack_under_one_cloud_is_cross_validated_and_its_modes_found(cover):
    """One cloud of 8% (every other step's only donor) or of 30% (more than the cross-validation
    may hide): the cross-validation still hides cells in every step and at different places, so
    the three modes are found and the cloud is filled to about the noise."""
    truth, given = one_cloud_stack(cover)
    rec = dineof(given)
    gap = np.isnan(given)
    assert rec.cv_points > 0.02 * np.isfinite(given).sum()
    assert 3 <= rec.modes <= 6
    assert np.sqrt(np.mean((rec.mean[gap] - truth[gap]) ** 2)) < 0.2  # noise 0.1, spread about 3


def test_a_donor_drawn_again_hides_its_gaps_elsewhere():
    from geonp.tasks.clouds import borrow_gaps

    _, given = one_cloud_stack(0.2, steps=6)
    observed, gaps = np.isfinite(given), np.isnan(given)
    kept, donors = borrow_gaps(observed, gaps, np.random.default_rng(0), low=0.1, high=0.5)
    moved, again = borrow_gaps(observed, gaps, np.random.default_rng(0), low=0.1, high=0.5, move_repeats=True)
    others = [t for t in range(6) if t != 3]
    assert list(donors[others]) == list(again[others]) == [3] * 5  # the cloudy step is every step's donor
    assert all((kept[t] == gaps[3]).all() for t in others)  # as drawn: the same cells in every step
    first = moved[others[0]]
    assert (first == gaps[3]).all()  # a first use keeps the donor's cells
    for t in others[1:]:
        share = moved[t].sum() / observed[t].sum()
        assert 0.1 <= share <= 0.5 and (moved[t] != first).any()
    assert not (moved & ~observed).any()


def test_sigma_is_calibrated_grows_with_distance_and_is_zero_where_observed():
    truth, given = low_rank_stack(noise=0.3)
    rec = dineof(given)
    gap = np.isnan(given)
    assert (rec.std[~gap] == 0).all() and (rec.std[gap] > 0).all()
    levels = [s for _, s in rec.sigma]
    assert levels == sorted(levels)
    z = np.abs(rec.mean[gap] - truth[gap]) / rec.std[gap]
    assert 0.8 <= np.mean(z <= 1.645) <= 0.97  # a 90% interval, roughly


def test_the_fit_is_the_rank_k_part_at_observed_cells_too():
    truth, given = low_rank_stack(noise=0.3)
    rec = dineof(given)
    seen = np.isfinite(given)
    residual = given[seen] - rec.mean[seen]
    assert 0.15 < residual.std() < 0.45  # what the modes miss is the noise, not zero


def test_valid_area_deterministic_and_input_untouched():
    truth, given = low_rank_stack(steps=8)
    valid = np.ones(given.shape[1:], bool)
    valid[:, :10] = False
    before = given.copy()
    a, b = dineof(given, valid), dineof(given, valid)
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(given, before)
    assert np.isnan(a.mean[:, :, :10]).all() and np.isnan(a.std[:, :, :10]).all()
    assert np.isfinite(a.mean[:, :, 10:]).all()


@pytest.mark.parametrize("steps", [1, 2])
def test_too_short_a_history_is_refused(steps):
    _, given = low_rank_stack(steps=steps)
    with pytest.raises(ValueError, match="at least 3 steps"):
        dineof(given)


def test_a_shape_mismatch_is_refused():
    _, given = low_rank_stack(steps=4)
    with pytest.raises(ValueError, match="does not match"):
        dineof(given, np.ones((5, 5), bool))


def test_held_out_leaves_each_observation_out_of_its_own_prediction():
    truth, given = low_rank_stack(steps=10, noise=0.3)
    rec = dineof(given)
    seen, gap = np.isfinite(given), np.isnan(given)
    rmse = lambda pred, ref, where: np.sqrt(np.mean((pred[where] - ref[where]) ** 2))  # noqa: E731
    # At a gap it predicts about as well as the reconstruction (a ridge fit of the same modes; the
    # ridge's noise is the cross-validation's error, extrapolation included, so a gap's loadings
    # shrink a little: 1.13x here, and within a few % of the fill, mostly better, on the suite's stacks).
    assert rmse(rec.held_out, truth, gap) < 1.2 * rmse(rec.mean, truth, gap)
    # At an observed cell the fit has seen the value; the held-out prediction has not, and misses
    # the observation by about as much as a gap's prediction misses a noisy observation there.
    assert rmse(rec.mean, given, seen) < 0.9 * rmse(rec.held_out, given, seen)
    at_gaps = np.sqrt(rmse(rec.held_out, truth, gap) ** 2 + 0.3**2)
    assert 0.7 < rmse(rec.held_out, given, seen) / at_gaps < 1.4


def test_a_cell_seen_once_is_predicted_without_its_own_value():
    truth, given = low_rank_stack(steps=8, noise=0.3)
    given[:, 5, 5] = np.nan
    given[2, 5, 5] = 40.0  # seen on one step, far from anything the modes predict
    rec = dineof(given)
    centre = np.nanmean(given)
    assert abs(rec.held_out[2, 5, 5] - centre) < 1.0  # the prior (the mean), not 40


def test_a_folds_covariates_know_nothing_of_its_hidden_cells():
    """Changing the values under a fold's hidden cells leaves that fold's covariates as they were:
    the covariates a training window's targets carry are as blind to them as infill's to a gap."""
    from geonp.tasks.history import history_folds

    truth, given = low_rank_stack(steps=9, rows=30, cols=34)
    folds = history_folds(given, None, ["dineof", "nearest_steps"], 3)
    assert len(folds) == 3
    for f, fold in enumerate(folds):
        assert fold.covariates.shape == (2, *given.shape) and np.isfinite(fold.covariates).all()
        steps = np.flatnonzero(fold.hidden.any(axis=(1, 2)))
        assert len(steps) and all(s % 3 == f for s in steps)  # fold f hides steps f, f + 3, ...
        assert not (fold.hidden & np.isnan(given)).any()  # only observed cells are hidden
    first = folds[0]
    changed = np.where(first.hidden, given + 50.0, given)
    again = history_folds(changed, None, ["dineof", "nearest_steps"], 3)[0]
    assert (again.hidden == first.hidden).all()
    np.testing.assert_allclose(again.covariates, first.covariates, rtol=1e-6)
    # Whereas the whole-stack covariates move with them.
    from geonp.tasks.history import history_covariates

    whole, _ = history_covariates(given, None, ["dineof"])
    moved, _ = history_covariates(changed, None, ["dineof"])
    assert np.abs(moved - whole).max() > 1.0


@pytest.mark.parametrize("names, land", [(["dineof", "nearest_steps"], False),
                                         (["dineof", "spread", "coarse", "nugget"], True),
                                         (["nearest_steps", "mean"], False)])
def test_folds_are_drawn_as_one_after_another_would_be_and_the_same_on_any_threads(monkeypatch, names, land):
    """history_folds draws every fold's hidden cells and DINEOF cross-validation cells first, in
    the order the folds one after another drew them, then computes the folds on threads: the folds
    equal, to the bit, those of the sequential loop (each fold's cells, then its DINEOF's draw from
    the same generator), on one thread or three; with or without DINEOF among the covariates, with
    a valid mask; the variogram fits of the ``nugget`` covariate on several threads leave the
    process's warning filters as they were."""
    import threading
    import warnings

    import geonp.tasks.history as history
    from geonp.tasks.history import FOLD_SEED, fold_hidden, history_covariates, history_folds
    from geonp.threads import one_blas_thread

    _, given = low_rank_stack(steps=9, rows=30, cols=34)
    valid = None
    if land:  # a coast: the first columns can hold no value
        valid = np.ones(given.shape[1:], bool)
        valid[:, :5] = False
        given[:, ~valid] = np.nan
    rng = np.random.default_rng(FOLD_SEED)
    ok = np.broadcast_to(np.ones(given.shape[1:], bool) if valid is None else valid, given.shape)
    expected = []
    with one_blas_thread():  # as history_folds runs several folds, whatever the machine's cores
        for f in range(3):  # the loop as it was before the folds ran side by side
            hidden = fold_hidden(given, ok, f, 3, rng)
            expected.append((hidden, history_covariates(np.where(hidden, np.nan, given), valid, names, rng=rng)[0]))
    workers = set()
    computed = history.history_covariates

    def recording(*args, **kwargs):
        workers.add(threading.current_thread().name)
        return computed(*args, **kwargs)

    monkeypatch.setattr(history, "history_covariates", recording)
    filters = list(warnings.filters)
    for threads in (1, 3):
        workers.clear()
        folds = history_folds(given, valid, names, 3, threads=threads)
        for fold, (hidden, covariates) in zip(folds, expected, strict=True):
            assert (fold.hidden == hidden).all()
            np.testing.assert_array_equal(fold.covariates, covariates)
        assert all(name.startswith("geonp-fold") for name in workers) == (threads > 1)
    assert warnings.filters == filters


def test_dineof_takes_its_cross_validation_cells_drawn_beforehand():
    from geonp.tasks.dineof import cross_validation_cells

    _, given = low_rank_stack(steps=8, rows=24, cols=28)
    drawn = dineof(given, rng=np.random.default_rng(5))
    cv = cross_validation_cells(given, None, np.random.default_rng(5))
    given_cells = dineof(given, rng=np.random.default_rng(99), cv_mask=cv)  # the generator draws nothing
    np.testing.assert_array_equal(given_cells.mean, drawn.mean)
    assert given_cells.cv_points == drawn.cv_points == int(cv.sum())
    with pytest.raises(ValueError, match="cross-validation mask"):
        dineof(given, cv_mask=cv[1:])
    # Only observed cells can be hidden: a mask reaching into the gaps hides what it holds of them.
    wider = dineof(given, rng=np.random.default_rng(99), cv_mask=cv | np.isnan(given))
    np.testing.assert_array_equal(wider.mean, drawn.mean)


def test_a_stack_without_history_has_none():
    from geonp.tasks.history import MIN_STEPS, has_history

    _, given = low_rank_stack(steps=MIN_STEPS, rows=10, cols=12)
    assert has_history(given, None)
    given[1:] = np.nan
    assert not has_history(given, None)


def test_analogs_learn_each_days_offset_and_scale_from_the_best_matching_days():
    from geonp.tasks.analogs import analog_prediction

    rng = np.random.default_rng(0)
    v = rng.normal(size=(5, 30, 30))
    v[3] = 2.0 * v[0] + 5.0  # day 3 is day 0 in other units; days 1, 2, 4 are unrelated noise
    v[3, :6] = np.nan
    v[0, 20:] = np.nan  # day 0 does not see the bottom rows
    pred = analog_prediction(v, analogs=1)
    np.testing.assert_allclose(pred[3, :6], 2.0 * v[0, :6] + 5.0, atol=1e-9)  # the match, mapped
    assert np.isfinite(pred[0, 20:]).all()  # from day 3 mapped back, though day 0 never saw them
    np.testing.assert_allclose(pred[0, 20:], (v[3, 20:] - 5.0) / 2.0, atol=1e-9)


def test_analogs_beat_persistence_on_a_history_of_recurring_patterns():
    from geonp.tasks.analogs import analog_prediction
    from geonp.tasks.cell_history import nearest_steps

    truth, given = low_rank_stack(steps=20)
    gap = np.isnan(given)
    rmse = {name: np.sqrt(np.mean((p[gap] - truth[gap]) ** 2))
            for name, p in (("analogs", analog_prediction(given)), ("nearest", nearest_steps(given)))}
    assert rmse["analogs"] < 0.3 * rmse["nearest"], rmse


def test_analogs_ignore_a_day_that_is_flat_where_they_meet():
    """A step constant over the cells it shares with another (sea ice, a saturated product) has a
    variance of rounding error: it predicts nothing, rather than noise over noise."""
    from geonp.tasks.analogs import analog_prediction

    for seed in range(30):
        rng = np.random.default_rng(seed)
        v = rng.normal(size=(3, 20, 20))
        v[1, :10] = v[1, 10:].mean() + 1e-3  # flat where day 0 is observed
        v[0, 10:] = np.nan
        v[2] = np.nan
        pred = analog_prediction(v, min_common=50)
        assert not np.isfinite(pred[0, 10:]).any(), seed


def test_analogs_do_not_depend_on_units():
    from geonp.tasks.analogs import analog_prediction

    truth, given = low_rank_stack(steps=12, rows=30, cols=34)
    base = analog_prediction(given - 20)
    small = analog_prediction((given - 20) * 1e-7) / 1e-7
    np.testing.assert_allclose(small, base, rtol=1e-6, atol=1e-8)


def test_a_stack_without_history_gets_one_fold_that_hides_nothing():
    from geonp.tasks.history import history_folds

    _, given = low_rank_stack(steps=2, rows=10, cols=12)
    (fold,) = history_folds(given, None, ["dineof"], 3)
    assert not fold.hidden.any() and fold.covariates.strides == (0, 0, 0, 0)
    with pytest.raises(ValueError, match="at least 1"):
        history_folds(given, None, ["dineof"], 0)


def test_the_mean_covariate_leaves_the_step_it_predicts_out():
    from geonp.tasks.cell_history import other_steps_mean

    rng = np.random.default_rng(4)
    v = rng.normal(size=(6, 5, 7))
    v[rng.random(v.shape) < 0.3] = np.nan
    v[:, 0, 0] = np.nan
    v[2, 0, 0] = 9.0  # seen once: no other step says anything about it
    pred = other_steps_mean(v)
    for t in range(6):
        others = np.delete(v, t, axis=0)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices are the cells it leaves NaN
            expected = np.nanmean(others, axis=0)
        np.testing.assert_allclose(pred[t], expected, equal_nan=True)
    assert np.isnan(pred[2, 0, 0]) and pred[0, 0, 0] == 9.0
    changed = v.copy()
    changed[3] += 100.0  # a step's own value never enters its prediction
    np.testing.assert_allclose(other_steps_mean(changed)[3], pred[3], equal_nan=True)


def test_the_spread_covariate_is_the_other_steps_standard_deviation():
    from geonp.tasks.cell_history import other_steps_spread
    from geonp.tasks.history import history_covariates

    rng = np.random.default_rng(5)
    v = 290.0 + rng.normal(size=(7, 4, 6))  # kelvin: leaving a step out must not cancel the mean
    v[rng.random(v.shape) < 0.3] = np.nan
    v[:, 0, 0] = np.nan
    v[1, 0, 0], v[4, 0, 0] = 3.0, 5.0  # seen twice: at those steps one other step, too few for a spread
    pred = other_steps_spread(v)
    for t in range(7):
        others = np.delete(v, t, axis=0)
        enough = np.isfinite(others).sum(0) >= 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = np.where(enough, np.nanstd(others, axis=0), np.nan)
        np.testing.assert_allclose(pred[t], expected, rtol=1e-9, atol=1e-9, equal_nan=True)
    assert np.isnan(pred[[1, 4], 0, 0]).all() and (np.delete(pred[:, 0, 0], [1, 4]) == 1.0).all()
    changed = v.copy()
    changed[3] *= 10.0  # a step's own value never enters its spread
    np.testing.assert_allclose(other_steps_spread(changed)[3], pred[3], atol=1e-6, equal_nan=True)
    maps, what = history_covariates(v, None, ["mean", "spread"])
    assert what.endswith("(mean), the cell's spread over the other dates (spread)") and np.isfinite(maps).all()
    assert maps[1, 1, 0, 0] == np.float32(np.nanmedian(pred))  # no spread known: the typical cell's
    assert maps[1, 0, 0, 0] == 1.0
