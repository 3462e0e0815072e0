"""Run one training process under torchrun and record, per step, a digest of its weights.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/ddp_worker.py CONFIG OUT [--resume]

Writes ``OUT/rank<r>.json``: ``{"steps": {step: digest}, "first_batch": digest, "losses": [...]}``,
so a test can check that every rank holds the same weights after every step and that the ranks
trained on different tasks.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from geonp.tasks.sources import make_task_source
from geonp.train import TrainConfig, train


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    config, out = sys.argv[1], Path(sys.argv[2])
    resume = "--resume" in sys.argv[3:]
    torch.set_num_threads(1)
    record: dict = {"steps": {}, "losses": []}

    def on_step(step: int, model: torch.nn.Module, loss: float) -> None:
        record["steps"][step] = digest(model.state_dict().values())
        record["losses"].append(loss)

    cfg = TrainConfig.from_yaml(config)
    source = make_task_source(**cfg.data)
    draw = source.sample

    def sample(batch_size: int, rng: torch.Generator):
        batch = draw(batch_size, rng)
        record.setdefault("first_batch", digest([batch.xc, batch.yc]))
        return batch

    source.sample = sample
    result = train(cfg, resume=resume, progress=False, source=source, on_step=on_step)
    rank = int(os.environ.get("RANK", 0))
    record["final"] = digest(result.model.state_dict().values())
    # The process group's threads must be gone once train() returns: a gloo thread still running
    # when the interpreter finalises can abort the process at exit.
    tasks = Path("/proc/self/task")
    record["threads_left"] = sorted((t / "comm").read_text().strip() for t in tasks.iterdir()) if tasks.exists() else []
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
