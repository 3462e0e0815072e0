"""The accuracy ablation's variant file and its forced-mean checkpoints (pipelines/accuracy_ablation.py)."""

from __future__ import annotations

import pytest
import torch

from geonp.models import build, load, save
from pipelines.accuracy_ablation import REPO, forced_mean, load_variants, merged


def test_merged_replaces_values_and_merges_mappings():
    base = {"model_args": {"a": 1, "b": [1, 2]}, "steps": 600}
    out = merged(base, {"model_args": {"b": [3]}, "lr": 1e-3})
    assert out == {"model_args": {"a": 1, "b": [3]}, "steps": 600, "lr": 1e-3}
    assert base["model_args"]["b"] == [1, 2]  # the base is not modified


def test_every_variant_is_trainable_or_points_at_a_committed_file():
    variants = load_variants()
    assert {"linear", "kriging", "bundled", "krig64", "flagship"} <= set(variants)
    for name, v in variants.items():
        if "checkpoint" in v:
            assert (REPO / v["checkpoint"]).exists(), name
        elif v.get("train", True):
            assert v["config"]["out_dir"] == f"runs/accuracy/{name}"
            # A trained variant starts from the weights bundled before #13, not today's, so its
            # row means the same whatever is bundled later; only the flagship-* rows are defined
            # relative to today's bundled te-pt-tnp (as the checkpoint rows above them are).
            start = v["config"].get("init_from")
            assert start is None or (REPO / start).exists(), name
            if not name.startswith("flagship"):
                assert start != "geonp/weights/te-pt-tnp.safetensors", name


@pytest.mark.parametrize("mean, gate", [("kriging", 1.0), ("decoder", 0.0)])
def test_forced_mean_pins_the_kriging_gate(tmp_path, mean, gate):
    torch.manual_seed(0)
    model = build("te-pt-tnp", 3, 1, preset="tiny", num_neighbours=4, local_kriging=True, kriging_neighbours=8)
    torch.nn.init.normal_(model.kriging_gate.weight)
    save(model, tmp_path / "m.safetensors")
    forced = load(forced_mean(tmp_path / "m.safetensors", mean, tmp_path / "forced.safetensors"))
    features = torch.randn(5, forced.kriging_gate.in_features)
    torch.testing.assert_close(torch.sigmoid(forced.kriging_gate(features)), torch.full((5, 1), gate))


def test_forced_mean_refuses_a_model_without_a_gate(tmp_path):
    save(build("te-pt-tnp", 3, 1, preset="tiny"), tmp_path / "m.safetensors")
    with pytest.raises(SystemExit, match="no kriging gate"):
        forced_mean(tmp_path / "m.safetensors", "kriging", tmp_path / "forced.safetensors")
