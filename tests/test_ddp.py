"""Data-parallel training with torchrun on CPU (gloo, 2 processes): same weights on every rank
after every step, different tasks per rank, the loss goes down, resume is exact, rank 0 writes."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from geonp.models import load

WORKER = Path(__file__).with_name("ddp_worker.py")
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="torchrun with gloo on Linux/macOS")


def _config(tmp_path: Path, name: str, steps: int) -> Path:
    cfg = {"model": "cnp", "preset": "tiny", "out_dir": str(tmp_path / name),
           "data": {"name": "gp-se", "max_context": 32},
           "steps": steps, "batch_size": 8, "lr": 2e-3, "checkpoint_every": 20, "val_every": 40, "log_every": 10,
           "val_tasks": 16, "seed": 5, "device": "cpu"}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parents[1])}


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *args]
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _records(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_two_processes_train_one_model_and_resume_exactly(tmp_path):
    # Straight through: 40 steps with the CLI (geonp train --ddp 2).
    cli = subprocess.run([sys.executable, "-m", "geonp", "train", _config(tmp_path, "straight", 40), "--ddp", "2",
                          "--no-progress"], capture_output=True, text=True, env=_env(), timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert cli.stdout.count("trained cnp for 40 steps") == 1, cli.stdout  # one line per run, from rank 0
    straight = load(tmp_path / "straight" / "model.safetensors")

    # The same run stopped at step 20, then resumed to 40, recording every rank's weights per step.
    _torchrun(str(WORKER), str(_config(tmp_path, "stopped", 20)), str(tmp_path / "first"))
    _torchrun(str(WORKER), str(_config(tmp_path, "stopped", 40)), str(tmp_path / "second"), "--resume")
    first, second = _records(tmp_path / "first"), _records(tmp_path / "second")
    for part in (first, second):
        assert part[0]["steps"] == part[1]["steps"]  # identical weights on both ranks after every step
        assert part[0]["first_batch"] != part[1]["first_batch"]  # but each rank drew its own tasks
        for rank in part:  # the process group left nothing running (a gloo thread at exit can abort)
            assert not [name for name in rank["threads_left"] if "gloo" in name], rank["threads_left"]
    assert sorted(map(int, first[0]["steps"])) == list(range(1, 21))
    assert sorted(map(int, second[0]["steps"])) == list(range(21, 41))

    resumed = load(tmp_path / "stopped" / "model.safetensors")
    for (k, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert (a == b).all(), k

    rows = list(csv.DictReader(open(tmp_path / "stopped" / "log.csv")))
    assert [int(r["step"]) for r in rows] == [10, 20, 30, 40]  # one writer: no duplicated rows
    losses = [float(r["train_loss"]) for r in rows]
    assert losses[-1] < losses[0], losses
    summary = json.loads((tmp_path / "stopped" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["step"] == 40


def test_resuming_with_another_number_of_processes_is_refused(tmp_path):
    _torchrun("-m", "geonp.train", str(_config(tmp_path, "run", 20)), "--no-progress")
    alone = subprocess.run([sys.executable, "-m", "geonp", "train", _config(tmp_path, "run", 40), "--resume"],
                           capture_output=True, text=True, env=_env(), timeout=300)
    assert alone.returncode == 2
    assert alone.stderr.strip().splitlines()[-1].startswith("geonp: error: checkpoint")
    assert "written by 2 training process(es), resumed with 1" in alone.stderr and "Traceback" not in alone.stderr
