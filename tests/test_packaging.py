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
