"""What every results table records (command, device, date, commit, versions), and reading an
earlier table back to keep the rows a rerun does not replace (``--reuse``)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch

import geonp

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
    out.with_suffix(".json").write_text(json.dumps({"header": text.split("\n|")[0], "rows": rows}, indent=2))


def earlier_results(path: Path) -> dict[str, dict]:
    """Results of an earlier run by source; rows that predate the commit column get the table's commit."""
    if not path.exists():
        raise SystemExit(f"{path}: no earlier table to take rows from")
    commit = header_field(path, "commit", "unknown")
    out = {}
    for res in json.loads(path.read_text())["results"]:
        for row in res["rows"]:
            row.setdefault("commit", commit)
        out[res["source"]] = res
    return out


def header_field(path: Path, key: str, missing: str = "unrecorded") -> str:
    """The value of the ``- key: value`` line of a results table's provenance header, else ``missing``."""
    found = re.search(rf"^- {key}: (.+)$", json.loads(path.read_text()).get("header", ""), re.MULTILINE)
    return found.group(1).strip() if found else missing


def keep_earlier(res: dict, old: dict, name: str) -> None:
    """Add to ``res`` the rows of ``old`` (same scene) for (model, fit steps) not run now.

    Rows from tables older than the diagnostics lack them and print "–" there; the hidden cells'
    counts by distance are the same for both (same cells), so ``res`` takes ``old``'s if it has none.
    """
    same_cells(res, old, name)
    ran = {(r["model"], r["fit_steps"]) for r in res["rows"]}
    res["rows"] += [r for r in old["rows"] if (r["model"], r["fit_steps"]) not in ran]
    if "hidden_by_distance" in old:
        res.setdefault("hidden_by_distance", old["hidden_by_distance"])


def same_cells(a: dict, b: dict, name: str) -> None:
    """Stop (one line) unless two runs of scene ``name`` hid the same cells (seed, donors, count)."""
    if (a["seed"], a["donors"], a["hidden_cells"]) != (b["seed"], b["donors"], b["hidden_cells"]):
        raise SystemExit(f"{name}: rows to combine hid different cells (seed, donors or count differ); "
                         "rerun every model without --reuse")
