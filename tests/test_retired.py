"""Retired variants (geonp.models.retired): checkpoints and configs that name the shipped choice
load and resume unchanged; those that ask for a variant that lost are refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import random_tasks

from geonp.checkpoint import read_checkpoint, write_checkpoint
from geonp.models import build, load, save
from geonp.train import TrainConfig, train

REPO = Path(__file__).resolve().parents[1]
KRIGING = dict(num_neighbours=4, local_kriging=True, kriging_neighbours=8)


def test_an_argument_naming_the_shipped_choice_is_dropped_and_a_lost_variant_refused():
    model = build("te-pt-tnp", 2, 1, preset="tiny", value_skip=False, **KRIGING)
    assert "kriging_mix" not in model.config["kwargs"] and not hasattr(model, "kriging_gate")
    for key, value in (("kriging_mix", "gate"), ("value_skip", True), ("local_context", True)):
        with pytest.raises(ValueError, match=f"{key}={value!r} is a retired variant .* check out commit 3ab7466"):
            build("te-pt-tnp", 2, 1, preset="tiny", **{key: value}, **KRIGING)


def _with_a_gate(tensors: dict, prefix: str = "") -> dict:
    """What a checkpoint written before the gate was retired also held: its unused weights."""
    return {**tensors, f"{prefix}kriging_gate.weight": torch.zeros(1, 33), f"{prefix}kriging_gate.bias": torch.zeros(1)}


def test_a_checkpoint_written_with_the_unused_gate_loads_and_predicts_the_same(tmp_path):
    model = build("te-pt-tnp", 2, 1, preset="tiny", **KRIGING).eval()
    save(model, tmp_path / "now.safetensors")
    tensors, meta = read_checkpoint(tmp_path / "now.safetensors")
    meta["model"]["kwargs"]["kriging_mix"] = "kriging"
    write_checkpoint(tmp_path / "before.safetensors", _with_a_gate(tensors), meta)
    xc, yc, xt, mask_c = random_tasks(dx=2)
    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path / "before.safetensors").eval()(xc, yc, xt, mask_c).loc,
                                   model(xc, yc, xt, mask_c).loc, atol=0, rtol=0)
    # Without kriging_mix recorded, the gate was the default: that model mixed means, it is refused.
    del meta["model"]["kwargs"]["kriging_mix"]
    write_checkpoint(tmp_path / "gated.safetensors", _with_a_gate(tensors), meta)
    with pytest.raises(ValueError, match="gated kriging mean .* a retired variant"):
        load(tmp_path / "gated.safetensors")


@pytest.mark.parametrize("path", ["geonp/weights/te-pt-tnp.safetensors",
                                  "pipelines/weights/te-pt-tnp-era5-uk.safetensors"])
def test_the_committed_weights_load(path):
    assert load(REPO / path).kriging is not None


def test_a_run_saved_with_the_gate_resumes_as_an_uninterrupted_run(tmp_path):
    """A training state written before the gate left: its weights and optimizer list the gate's two
    parameters last; the resumed run ends where an uninterrupted one does."""
    base = dict(model="te-pt-tnp", preset="tiny", model_args=KRIGING, data={"name": "gp-se", "max_context": 16},
                batch_size=4, checkpoint_every=2, val_every=2, log_every=2, val_tasks=4, seed=3)
    straight = train(TrainConfig(out_dir=str(tmp_path / "a"), steps=4, **base), progress=False)
    train(TrainConfig(out_dir=str(tmp_path / "b"), steps=2, **base), progress=False)
    state = tmp_path / "b" / "state.safetensors"
    tensors, meta = read_checkpoint(state)
    meta["model"]["kwargs"]["kriging_mix"] = "kriging"
    group = meta["optimizer"]["param_groups"][0]
    group["params"] = [*group["params"], len(group["params"]), len(group["params"]) + 1]
    write_checkpoint(state, _with_a_gate(tensors, "model."), meta)
    resumed = train(TrainConfig(out_dir=str(tmp_path / "b"), steps=4, **base), resume=True, progress=False)
    for (k, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), k
