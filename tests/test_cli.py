"""The geonp command: help, version, one-line errors with exit code 2, training from YAML."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from geonp import __version__
from geonp.cli import main


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "geonp", *args], capture_output=True, text=True, timeout=300)


def test_version_and_help():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"geonp {__version__}"
    out = run("--help")
    assert out.returncode == 0 and "demo" in out.stdout and "train" in out.stdout


def test_bad_input_is_one_line_and_exit_code_2(tmp_path):
    out = run("train", str(tmp_path / "missing.yaml"))
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "missing.yaml" in out.stderr and "Traceback" not in out.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": "no-such-model", "out_dir": str(tmp_path / "r")}))
    out = run("train", str(cfg))
    assert out.returncode == 2 and "unknown model name 'no-such-model'" in out.stderr


def test_train_command_writes_a_loadable_model(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": "rcnp", "preset": "tiny", "out_dir": str(tmp_path / "r"), "steps": 6,
                                   "batch_size": 4, "val_tasks": 8, "val_every": 3, "log_every": 3}))
    assert main(["train", str(cfg), "--no-progress", "--device", "cpu"]) == 0
    assert "trained rcnp for 6 steps" in capsys.readouterr().out
    assert main(["train", str(cfg), "--no-progress", "--resume", "--steps", "9"]) == 0
    assert "trained rcnp for 9 steps" in capsys.readouterr().out  # resumed at 6, went on to 9
    from geonp.models import load

    assert load(tmp_path / "r" / "model.safetensors").config["name"] == "rcnp"
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["step"] == 9


def test_models_lists_names(capsys):
    assert main(["models"]) == 0
    assert "te-pt-tnp" in capsys.readouterr().out
