"""The accuracy ablation's variant file (pipelines/experiments/accuracy_ablation.py): live and retired variants."""

from __future__ import annotations

import pytest

from pipelines.checkpoint_variants import merged
from pipelines.experiments.accuracy_ablation import REPO, load_variants


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


def test_every_live_variant_builds_and_every_retired_one_names_its_commit():
    """A variant that needs a retired part says at which commit it last ran; every other one
    builds with today's model (its model arguments are all ones the shipped class takes)."""
    import sys

    from geonp.models import build
    from pipelines.experiments import accuracy_ablation

    variants = load_variants()
    retired = {n for n, v in variants.items() if "retired" in v}
    assert {"krig64", "flagship", "knn16-skip"} <= retired and "flagship-history-folds" not in retired
    for name, v in variants.items():
        if name in retired:  # the commit it last ran at, and what went
            assert v["retired"].split(", ")[0] in ("3ab7466", "fbc8402") and ", " in v["retired"], name
        elif "config" in v and v["config"]["model"] == "te-pt-tnp":
            build("te-pt-tnp", 3 + (v["config"]["model_args"].get("kriging") or {}).get("covariates", 0), 1,
                  preset=v["config"]["preset"], **v["config"]["model_args"])
    sys_argv = sys.argv
    try:
        sys.argv = ["accuracy_ablation", "--variants", "krig64"]
        with pytest.raises(SystemExit, match="krig64 \\(retired at 3ab7466, kriging_mix gate"):
            accuracy_ablation.main()
    finally:
        sys.argv = sys_argv
