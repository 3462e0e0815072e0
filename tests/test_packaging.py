"""pyproject.toml, environment.yml, README and .ci/run tell the same story."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"torch": "pytorch", "eccodes": "python-eccodes"}  # PyPI name -> conda-forge name where they differ


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower()


def _spec(requirement: str) -> str:
    return requirement.replace(" ", "")[len(_name(requirement)):]


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        pip_reqs += extra
    wanted = {CONDA_NAMES.get(_name(r), _name(r)): _spec(r) for r in pip_reqs}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = {_name(d): _spec(d) for d in env["dependencies"] if isinstance(d, str)}
    conda.pop("pip", None)
    python = conda.pop("python")
    assert python == project["requires-python"]
    assert conda == wanted


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, flags=re.S)
    quick = [c.strip() for c in commands if "pytest" in c]
    assert quick, "README has no test command"
    assert quick[0] in (ROOT / ".ci" / "run").read_text()


def test_readme_demo_command_is_first():
    readme = (ROOT / "README.md").read_text()
    first = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, flags=re.S)[0]
    assert "geonp demo" in first and "torch==" in first


#: Tracked files may exceed this only under geonp/weights/ (the weights geonp ships).
LARGEST_FILE = 2 * 1024 * 1024
TRAINING_STATE = ("state.safetensors", "train_state.safetensors")


def test_no_large_file_or_training_state_is_tracked():
    """Resumable training state lives in the run folder, never in git, and no file over 2 MB joins the
    tree outside the shipped weights (pipelines/weights/README.md): a clone stays light."""
    import subprocess

    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        import pytest

        pytest.skip("not a git checkout (an unpacked sdist): nothing is tracked")
    files = [f for f in listed.decode().split("\0") if f and (ROOT / f).is_file()]
    assert files, "git ls-files listed nothing"
    large = [f for f in files if not f.startswith("geonp/weights/") and (ROOT / f).stat().st_size > LARGEST_FILE]
    state = [f for f in files if Path(f).name in TRAINING_STATE]
    assert not large, f"files over 2 MB outside geonp/weights/: {large}"
    assert not state, f"training state tracked in git: {state}"
