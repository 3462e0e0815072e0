"""What every results table records: command, device, date, commit, versions."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

import geonp
from geonp.skill_table import rows_json

REPO = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """Short commit of the working tree, with ``-dirty`` when there are uncommitted changes.

    ``GEONP_COMMIT`` overrides it, for copies of the tree made without ``.git``.
    """
    if os.environ.get("GEONP_COMMIT"):
        return os.environ["GEONP_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.strip()
        # The tables a run writes as it goes (pipelines/results) do not make the code dirty: a run
        # that scores several protocols in turn would otherwise mark all but its first rows.
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)pipelines/results"], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_description(device: torch.device) -> str:
    """Human-readable device: GPU name and memory, or CPU model and thread count."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {cpu}, {torch.get_num_threads()} threads"


def header(title: str, device: torch.device, budget: str, extra: dict[str, str] | None = None) -> str:
    """Markdown preamble for a results table."""
    argv = list(sys.argv)
    script = Path(argv[0]).resolve()
    if script.suffix == ".py" and script.is_relative_to(REPO / "pipelines"):  # python -m pipelines.GROUP.NAME
        argv[0:1] = ["-m", ".".join(script.relative_to(REPO).with_suffix("").parts)]
    rows = {
        "command": "`" + " ".join(shlex.quote(a) for a in ["python", *argv]) + "`",
        "device": device_description(device),
        "budget": budget,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "versions": f"geonp {geonp.__version__}, torch {torch.__version__}, Python {platform.python_version()}",
        **(extra or {}),
    }
    return f"# {title}\n\n" + "\n".join(f"- {k}: {v}" for k, v in rows.items()) + "\n"


def append_rows(out: Path, row: dict) -> list[dict]:
    """The rows of the results table ``out`` (its ``.json``; none before the first run) and ``row``."""
    path = out.with_suffix(".json")
    return [*(json.loads(path.read_text())["rows"] if path.exists() else []), row]


def write_results(out: Path, text: str, rows: list[dict]) -> None:
    """``out.md``, the table ``text``, and ``out.json``, its preamble and ``rows``."""
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(rows_json({"header": text.split("\n|")[0]}, rows))
