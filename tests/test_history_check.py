"""Whether te-pt-tnp uses a field's history (``--history``, :mod:`geonp.fill.history_check`): the
check compares the same hidden cells with and without it, ``none`` drops it as one scene has none,
``auto`` drops it only where the field's own cells say so, and the choice is recorded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import geonp.fill.history_check as check
from geonp.fill.engine import infill
from geonp.fill.plan import plan
from geonp.fill.stack import add_history_folds
from tests.test_nugget_choice import cube

COVARIATES = ["dineof", "spread", "nugget"]


@pytest.fixture()
def planned():
    p = plan(cube(0.1), "v", "te-pt-tnp", fit_steps=0, check_windows=8)
    assert p.choice.covariates == COVARIATES
    return p


def test_both_sources_draw_the_same_windows_and_differ_only_in_the_history_maps(planned):
    f = planned.fields[0]
    add_history_folds(f, COVARIATES, 2, seed=0)
    assert f.folds
    with_history, flat = check.paired_sources(f, COVARIATES, planned.spec, 5, planned.choice.model.dim_x)
    for _ in range(3):
        a, b = with_history.sample(4), flat.sample(4)
        for name in ("yc", "yt", "mask_c", "mask_t"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert torch.equal(a.xc[..., :3], b.xc[..., :3]) and torch.equal(a.xt[..., :3], b.xt[..., :3])
        assert torch.equal(a.xt[..., -1], b.xt[..., -1])  # the nugget share: the step's own, kept
        history = b.xt[..., 3:5][b.mask_t]
        assert not torch.equal(a.xt[..., 3:5][a.mask_t], history)
        # Flat maps: one value per window (the field's mean, standardised as the window's values are).
        for w in range(b.xt.shape[0]):
            assert torch.unique(b.xt[w, :, 3:5][b.mask_t[w]]).numel() == 1


def test_none_drops_the_history_as_one_scene_has_none_and_use_keeps_it(planned):
    f = planned.fields[0]
    before = np.array(f.history)
    said, dropped = check.choose_history(planned.choice.model, [f], planned.spec, "cpu", COVARIATES, "use")
    assert dropped == [] and "used (asked)" in said and np.array_equal(f.history, before) and not f.folds
    said, dropped = check.choose_history(planned.choice.model, [f], planned.spec, "cpu", COVARIATES, "none")
    assert dropped == [f.label] and "not used (asked)" in said
    assert np.all(f.history[:2] == np.float32(f.mean)) and np.array_equal(f.history[2], before[2])
    add_history_folds(f, COVARIATES, 3, seed=0)
    assert f.folds == []  # a dropped history is not folded again (fine-tuning, the nugget check)
    with pytest.raises(ValueError, match="--history must be one of"):
        check.choose_history(planned.choice.model, [f], planned.spec, "cpu", COVARIATES, "never")


@pytest.mark.parametrize("flat_better, drops", [(0.3, True), (-0.3, False), (0.001, False)])
def test_auto_drops_the_history_only_where_flat_maps_fill_the_fields_own_cells_better(planned, monkeypatch,
                                                                                        flat_better, drops):
    calls = []

    def fake(model, with_history, flat, device, windows, first=0):
        calls.append(first)
        ids = np.repeat(np.arange(first, first + windows), 10)
        history = 1.0 + 0.05 * np.sin(ids)
        # The gain varies from window to window: a standard error of about 0.006 over 32 windows.
        return history - flat_better + 0.05 * np.cos(1.7 * ids), history, ids

    monkeypatch.setattr(check, "paired_history_crps", fake)
    f = planned.fields[0]
    said, dropped = check.choose_history(planned.choice.model, [f], planned.spec, "cpu", COVARIATES, "auto",
                                         windows=8)
    assert (dropped == [f.label]) == drops and f.history_dropped == drops
    assert ("not used" if drops else ": used (CRPS") in said and not f.folds
    assert np.all(f.history[:2] == np.float32(f.mean)) == drops


def test_infill_records_the_choice_and_a_single_scene_is_not_checked():
    out = infill(cube(0.1), "v", "te-pt-tnp", fit_steps=0, history="auto", check_windows=8)
    assert "CRPS with the history" in out.attrs["geonp_history_used"]
    one = infill(cube(0.1).isel(time=[1]), "v", "te-pt-tnp", fit_steps=0, history="auto", check_windows=8)
    assert "geonp_history_used" not in one.attrs
