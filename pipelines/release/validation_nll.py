"""Validation NLL of checkpoints on a training config's own validation windows (``geonp train``'s).

    python -m pipelines.release.validation_nll pipelines/configs/bundled/te_pt_tnp.yaml \\
        geonp/weights/te-pt-tnp.safetensors pipelines/weights/te-pt-tnp-history-folds.safetensors

For a checkpoint exported from a step no validation ran at (the te-pt-tnp bundled before was step
10500 of a run that validates every 2000), and to compare exported weights on one set. Each checkpoint
is scored as trained: its history covariates are the config's and its inference-only choices
(``pipelines.release.pretrain.AT_INFERENCE``) are set back to their defaults, the same tensors.
Only the config's ``val_files`` are read (not its training fields), so this takes a minute.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from geonp.models import load
from geonp.tasks.sources import make_task_source
from geonp.train import TrainConfig, evaluate_nll
from pipelines.checkpoint_variants import variant_checkpoint
from pipelines.release.pretrain import AT_INFERENCE

#: The defaults the inference-only choices are set back to (the trained model's own).
TRAINED_DEFAULTS = {"kriging": {"slope_prior": "none"}}


def validation_nll(config: Path, checkpoints: list[Path]) -> dict[str, float]:
    """``{checkpoint: mean NLL per target}`` on ``config``'s validation windows (nats, standardised units)."""
    cfg = TrainConfig.from_yaml(config)
    data = {k: v for k, v in cfg.data.items() if k not in ("name", "files")}
    source = make_task_source(cfg.data["name"], **data)
    val = source.validation(cfg.val_tasks, cfg.batch_size, seed=cfg.val_seed)
    undo = {k: TRAINED_DEFAULTS[k] for k in AT_INFERENCE.get(cfg.model, {}) if k in TRAINED_DEFAULTS}  # merged in
    scores = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in checkpoints:
            trained = variant_checkpoint(path, Path(tmp) / path.name, model_args=undo,
                                         covariates=list(cfg.data.get("covariates", [])))
            scores[str(path)] = evaluate_nll(load(trained).eval(), val, torch.device("cpu"))
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path, help="a geonp train config with data: {name: windows, val_files}")
    parser.add_argument("checkpoints", type=Path, nargs="+")
    args = parser.parse_args()
    for path, nll in validation_nll(args.config, args.checkpoints).items():
        print(f"{path}: validation NLL {nll:.5f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
