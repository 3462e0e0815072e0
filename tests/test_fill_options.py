"""How a fill is made travels as data (geonp.fill.options): checked where it is built, recorded
in the store, never read from module settings."""

from __future__ import annotations

import json

import pytest
from conftest import smooth_cube

import geonp
from geonp.fill.options import FillOptions, FitOptions
from geonp.fill.plan import plan


def test_keywords_build_the_same_options_as_the_dataclass():
    given = FillOptions.from_keywords(fit_steps=5, seed=3, nugget="model", calibrate_sigma=True, threads=None)
    assert given == FillOptions(fit=FitOptions(steps=5), seed=3, nugget="model", calibrate_sigma=True)
    assert FillOptions.from_keywords() == FillOptions()


@pytest.mark.parametrize("keywords, message", [
    ({"fit_steps": -1}, "--fit-steps must be >= 0, got -1"),
    ({"nugget": "both"}, "--nugget must be one of auto, scene, model"),
    ({"batch_size": 0}, "--batch-size must be >= 1, got 0"),
    ({"threads": 0}, "--threads must be >= 1, got 0"),
    ({"fit_stpes": 3}, "unknown infill option 'fit_stpes'"),
])
def test_a_bad_option_is_refused_in_one_line(keywords, message):
    with pytest.raises(ValueError, match=message):
        FillOptions.from_keywords(**keywords)
    with pytest.raises(ValueError, match="fit own_gaps must be a share"):
        FitOptions(own_gaps=1.5)


def test_options_and_their_keywords_together_are_refused():
    with pytest.raises(ValueError, match="give options= or its keywords"):
        plan(smooth_cube(t=2, r=12, c=12), "sst", "linear", options=FillOptions(), seed=1)


def test_the_output_records_the_options_it_was_filled_with():
    out = geonp.infill(smooth_cube(t=2, r=12, c=12), "sst", model="linear", options=FillOptions(seed=7))
    recorded = json.loads(out.attrs["geonp_options"])
    assert recorded["seed"] == 7 and recorded["fit"]["steps"] == FitOptions().steps and recorded["nugget"] == "auto"


def test_the_checks_on_the_inputs_own_cells_hide_them_as_fine_tuning_does():
    """The nugget check and calibration draw FieldWindows with its defaults: half of them under the
    input's own gaps, as fine-tuning's windows (an earlier refactor had left them at none)."""
    import inspect

    from geonp.fill.finetune import FieldWindows

    defaults = inspect.signature(FieldWindows).parameters
    assert defaults["own_gaps"].default == FitOptions().own_gaps == 0.5
    assert defaults["wide_clouds"].default == FitOptions().wide_clouds


def test_the_history_limit_default_is_the_tasks_layers():
    """Written out in FillOptions (the CLI reads it before torch loads); the same number as training's."""
    from geonp.fill.options import FillOptions
    from geonp.tasks.covariate_maps import MAX_HISTORY_CELLS

    assert FillOptions().max_history_cells == MAX_HISTORY_CELLS
