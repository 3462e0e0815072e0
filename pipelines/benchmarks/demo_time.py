"""How long ``geonp demo`` takes as a user runs it, from the command to the exit (issue 54: under 30 s on 2
quiet cores).

    python -m pipelines.benchmarks.demo_time                 # 3 runs
    python -m pipelines.benchmarks.demo_time --repeats 5

Each run is the console command in a fresh process (``python -m geonp demo``: Python's start, the
imports, the three fills, the map and the exit all count), into a temporary folder. The C++ kernels
are built first, once, as a user's first run on a machine does (about two minutes, not
counted: it happens once per machine). Reported per run: wall time, peak resident memory of the
demo's process, and the demo's own figures (``summary.json``: each model's fill time, te-pt-tnp's
scores, which must not change when the code only gets faster); the table's figure is the median.
Rows are appended per run of this script (each names its machine and commit), so a table keeps
the history. Writes ``pipelines/results/demo_time_cpu.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from pipelines.provenance import REPO, append_rows, device_description, git_commit, header, write_results

OUT = REPO / "pipelines" / "results" / "demo_time_cpu"
GOAL_S = 30.0


def one_run(folder: Path) -> dict:
    """``geonp demo`` once in a child process: wall seconds, its peak resident memory (GB), its summary."""
    log = folder.with_name("stderr.txt")
    with log.open("w") as err:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "geonp", "demo", "-o", str(folder), "--overwrite"],
                                 stdout=subprocess.DEVNULL, stderr=err)
        try:
            _, status, usage = os.wait4(child.pid, 0)  # the child's own rusage, not every child's so far
        except BaseException:  # Ctrl-C: the demo does not go on alone
            child.kill()
            child.wait()
            raise
        wall = time.perf_counter() - start
    child.returncode = code = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    if code != 0:
        last = (log.read_text().strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"demo_time: geonp demo exited {code}: {last}")
    summary = json.loads((folder / "summary.json").read_text())
    return {"wall_s": round(wall, 2), "peak_gb": round(usage.ru_maxrss / 2**20, 2), "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of the demo (default: %(default)s)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    from geonp.models import cpu_build

    cpu_build.build_all()  # once per machine, as a user's first run: not the demo's time
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            runs.append(one_run(Path(tmp) / "geonp-demo"))
            print(f"run {i + 1}: {runs[-1]['wall_s']} s", flush=True)
    walls = [r["wall_s"] for r in runs]
    models = runs[0]["summary"]["models"]
    fill_s = {m: float(np.median([r["summary"]["models"][m]["wall_s"] for r in runs])) for m in models}
    scores = {k: models["te-pt-tnp"][k] for k in ("rmse", "crps", "coverage_90")} if "te-pt-tnp" in models else None
    row = {"date": time.strftime("%Y-%m-%d"), "commit": git_commit(),
           "machine": device_description(torch.device("cpu")), "median_s": round(float(np.median(walls)), 1),
           "runs_s": walls, "peak_gb": max(r["peak_gb"] for r in runs), "fill_s": fill_s, "te_pt_tnp": scores}
    rows = append_rows(OUT, row)
    text = header("geonp demo, command to exit", torch.device("cpu"),
                  f"`python -m geonp demo` in a fresh process, {args.repeats} runs, the median; the kernels built "
                  f"before (once per machine); goal: under {GOAL_S:.0f} s on 2 quiet cores")
    lines = ["| date | commit | machine | median s | runs s | peak GB | te-pt-tnp / kriging / linear fill s | "
             "te-pt-tnp RMSE / CRPS / cov90 |", "|---|---|---|---:|---|---:|---|---|"]
    for r in rows:
        fill = " / ".join(str(r["fill_s"].get(m, "–")) for m in ("te-pt-tnp", "kriging", "linear"))
        te = r["te_pt_tnp"]
        scores = " / ".join(f"{te[k]:.3f}" for k in ("rmse", "crps", "coverage_90")) if te else "–"
        lines.append(f"| {r['date']} | {r['commit']} | {r['machine']} | {r['median_s']} | "
                     f"{' '.join(map(str, r['runs_s']))} | {r['peak_gb']} | {fill} | {scores} |")
    write_results(OUT, text + "\n" + "\n".join(lines) + "\n", rows)
    print(OUT.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
