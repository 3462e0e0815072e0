"""How fast each filler fills, alone on the machine and beside another job (issue 54).

    python -m pipelines.benchmarks.fill_speed                                   # every case, quiet and contended
    python -m pipelines.benchmarks.fill_speed --cases scene150k demo --models te-pt-tnp kriging
    python -m pipelines.benchmarks.fill_speed --cases cube1m --models te-pt-tnp --quiet-only
    python -m pipelines.benchmarks.fill_speed --cases demo --models te-pt-tnp --threads 2   # a fixed count

Cases (each filled whole with ``geonp.infill``, the defaults a user gets, in a process of its own):

- ``scene150k``: the wide-cloud validation scene (MODIS LST, 150,000 cells, its observed cells
  under the night pass's clouds: ``pipelines.benchmarks.wide_clouds``);
- ``demo``: ``geonp demo``'s HadISST SST under 30% synthetic clouds;
- ``stack``: Alboran SST, 10 days of 201 x 301, every real cloud gap of every day;
- ``cube1m``: ERA5 2 m temperature over the UK, the whole hourly month (744 x 33 x 49), every step
  under smooth random clouds of 85% cover: about a million gap cells.

Each (case, model) runs quiet, then *contended*: beside another CPU-bound PyTorch job with its
default threads (matrix products in a loop, started first and stopped after), with no setting
changed. ``--repeats N`` runs each N times, the models of a case taking turns (so a drift of the
machine falls on all of them), and reports the median: single runs of the demo moved by about a
second, as much as separates te-pt-tnp from twice kriging's time there. Reported: wall time of the
fill (the median, and every run's), peak resident memory of the process, gap cells filled per
second, and the contended time over the quiet one (issue 54's goal: at most 2.5).
``--device cuda`` fills on the GPU instead (quiet only: the contended case is about shared CPU
cores) and writes ``fill_speed_cuda``, with the GPU's peak memory; the CPU rows stay in
``fill_speed_cpu``, so the two tables sit side by side (issue 54, item 5: at least 10^7 gap cells
a minute, 166,667 a second, on one H100/H200).
``--threads N`` fills with a fixed thread count (``geonp infill --threads N``) instead of geonp's
choice (``auto``: the cores the process may use, :func:`geonp.threads.configure`); rows are kept
per setting, so a table can show both. (The ``auto`` rows at commit 916d601 ran with threads that
gave way to the other job, ``geonp.threads.adapt``; no faster than 2 fixed threads beside it,
304.8 s against 238.7 s, it was removed.)
Writes ``pipelines/results/fill_speed_{device}.md`` and ``.json`` (rows of earlier runs kept unless
rerun on the same machine; each CPU row names its machine, as sessions may run on different
kinds: a run on another kind adds rows beside the others'. Compare rows of one machine; the
header's device is the last run's).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np
import torch

from pipelines.provenance import REPO, device_description, git_commit, header, rows_json

CASES = ("scene150k", "demo", "stack", "cube1m")
MODELS = ("linear", "kriging", "dineof", "te-pt-tnp")
RESULTS = REPO / "pipelines" / "results"
#: The other job: PyTorch matrix products with its default threads, as a notebook or a training run would be.
COMPETITOR = "import torch\na = torch.randn(1200, 1200)\nwhile True:\n    a = torch.tanh(a @ a / 1200)\n"
#: The machine of the rows written before rows named their own (the headers of those runs, in git
#: history, all say this CPU with 2 threads); a table's rows may come from several machines.
EARLIER_MACHINE = "CPU Intel(R) Xeon(R) Processor, 2 threads"
#: Windows a model call in rows without a ``batch_size``: infill's default (``FillOptions.batch_size``),
#: a constant here because importing geonp sets OpenMP's environment, which this process passes to
#: its fills and to the other job.
DEFAULT_BATCH = 16


def load_case(case: str):
    """``(dataset to fill, variable, valid mask or None)`` of a case, its gaps in place."""
    from geonp.data import open_cube, open_satellite
    from geonp.data.readers import data_folder
    from geonp.tasks.clouds import random_clouds
    from geonp.tasks.hidden import hide_under_mask

    if case == "scene150k":
        from pipelines.benchmarks.wide_clouds import scene

        ds, variable, under, _ = scene("validation")
        masked, _ = hide_under_mask(ds[variable].compute(), ds["valid"].compute(), under)
        return ds.assign({variable: masked}), variable, None
    if case == "demo":
        from geonp.demo import cloudy_scene

        return cloudy_scene()[0], "sst", None
    if case == "stack":
        return open_satellite(data_folder() / "satellite/alboran_sst_avhrr_2017-05.nc", "SST",
                              valid_mask="mask").compute(), "SST", None
    if case == "cube1m":
        ds = open_cube(data_folder() / "era5/era5_t2m_uk_2019-03_hourly.nc").compute()
        rng = np.random.default_rng(0)
        shape = ds["t2m"].shape[1:]
        clouds = np.stack([random_clouds(shape, 0.85, rng, 6.0) for _ in range(ds.sizes["time"])])
        return ds.assign(t2m=ds["t2m"].where(~clouds)), "t2m", None
    raise ValueError(f"unknown case {case!r}; one of {', '.join(CASES)}")


def one(case: str, model: str, threads: int | None = None, device: str = "cpu", batch_size: int | None = None) -> dict:
    """Fill one case with one model in this process on ``device`` (``batch_size`` windows a model call;
    None: infill's default); what the parent records."""
    import geonp
    from geonp.models import cpu_build

    if model == "te-pt-tnp" and device == "cpu":
        cpu_build.build_all()  # a one-time build is not the fill's time
    ds, variable, valid = load_case(case)
    gaps = int((~np.isfinite(ds[variable].values) & np.broadcast_to(ds["valid"].values, ds[variable].shape)).sum()
               if "valid" in ds else (~np.isfinite(ds[variable].values)).sum())
    start = time.perf_counter()
    geonp.infill(ds, variable, model, device=device, threads=threads, batch_size=batch_size)
    wall = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    row = {"case": case, "model": model, "threads_asked": threads or "auto", "gap_cells": gaps,
           "wall_s": round(wall, 1), "cells_per_s": round(gaps / wall), "peak_gb": round(peak_gb, 2)}
    if device == "cuda":
        row["gpu_peak_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        row["batch_size"] = batch_size or DEFAULT_BATCH
    else:
        row["machine"] = device_description(torch.device("cpu"))
    return row


def measure(case: str, model: str, contended: bool, threads: int | None = None, device: str = "cpu",
            batch_size: int | None = None) -> dict | None:
    """Run :func:`one` in a child process, beside the competitor when ``contended``."""
    other = subprocess.Popen([sys.executable, "-c", COMPETITOR]) if contended else None
    try:
        if other is not None:
            time.sleep(5)  # the other job at full speed before the fill starts
        fixed = ["--threads", str(threads)] if threads else []
        fixed += ["--batch-size", str(batch_size)] if batch_size else []
        out = subprocess.run([sys.executable, "-m", "pipelines.benchmarks.fill_speed", "--one", case, model, *fixed,
                              "--device", device],
                             capture_output=True, text=True, cwd=REPO, timeout=7200)
    finally:
        if other is not None:
            other.kill()
            other.wait()
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        print(f"{case} {model}: failed ({out.stderr.strip().splitlines()[-1:]})", flush=True)
        return None
    return {**json.loads(lines[-1]), "contended": contended}


def median_row(runs: list[dict]) -> dict:
    """One row for repeated runs of a (case, model, setting): the median wall time (and its cells a
    second), every run's time in ``walls_s``, the largest peak memory."""
    walls = [r["wall_s"] for r in runs]
    wall = round(float(np.median(walls)), 1)
    row = {**runs[0], "wall_s": wall, "cells_per_s": round(runs[0]["gap_cells"] / wall),
           "peak_gb": max(r["peak_gb"] for r in runs)}
    if "gpu_peak_gb" in row:
        row["gpu_peak_gb"] = max(r["gpu_peak_gb"] for r in runs)
    if len(runs) > 1:
        row["walls_s"] = walls
    return row


def row_key(row: dict, gpu: bool) -> tuple:
    """What a rerun replaces: the same case, model, threads, machine and contention (a run on
    another kind of machine adds its rows beside the others'); on a GPU also the same commit, so
    each GPU session's rows stay beside the last one's (GPU time is rare)."""
    machine = "" if gpu else row.get("machine", EARLIER_MACHINE)  # GPU rows name their device in the header
    key = row["case"], row["model"], str(row.get("threads_asked", "auto")), machine, row["contended"]
    return (*key, row["commit"], row.get("batch_size", DEFAULT_BATCH)) if gpu else key


def cpu_table(rows: list[dict]) -> list[str]:
    """One line per (case, model, threads, machine): quiet and contended wall times side by side."""
    lines = ["| case | model | threads | gap cells | quiet s | contended s | contended / quiet | cells/s (quiet) | "
             "peak GB | machine | commit | quiet runs s |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for setting in dict.fromkeys(row_key(r, False)[:4] for r in rows):
        quiet = next((r for r in rows if row_key(r, False) == (*setting, False)), None)
        busy = next((r for r in rows if row_key(r, False) == (*setting, True)), None)
        first = quiet or busy
        # A ratio only of one code on one machine: a quiet rerun (--quiet-only) beside an older
        # contended row leaves that row's time, marked with its commit, and no ratio.
        same = quiet and busy and all(quiet.get(k) == busy.get(k) for k in ("commit", "machine"))
        ratio = f"{busy['wall_s'] / quiet['wall_s']:.2f}" if same else "–"
        if busy is None:
            contended = "–"
        elif same or quiet is None:
            contended = busy["wall_s"]
        else:  # where it came from: its commit
            contended = f"{busy['wall_s']} ({busy['commit']})"
        lines.append(f"| {setting[0]} | {setting[1]} | {setting[2]} | {first['gap_cells']} | "
                     f"{quiet['wall_s'] if quiet else '–'} | {contended} | {ratio} | "
                     f"{quiet['cells_per_s'] if quiet else '–'} | {first['peak_gb']} | "
                     f"{first.get('machine', EARLIER_MACHINE)} | {first['commit']} | "
                     f"{' '.join(map(str, quiet.get('walls_s', []))) if quiet else ''} |")
    return lines


def gpu_table(rows: list[dict]) -> list[str]:
    """One line per GPU row (quiet only): wall time, cells a second and a minute (the goal's unit), memory."""
    lines = ["| case | model | windows a call | gap cells | wall s | cells/s | cells/min | peak GB (host) | GPU GB "
             "| commit |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:  # rows before --batch-size ran infill's default
        lines.append(f"| {r['case']} | {r['model']} | {r.get('batch_size', DEFAULT_BATCH)} | {r['gap_cells']} | "
                     f"{r['wall_s']} | {r['cells_per_s']} | "
                     f"{r['cells_per_s'] * 60:.3g} | {r['peak_gb']} | {r.get('gpu_peak_gb', '–')} | {r['commit']} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=CASES)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--quiet-only", action="store_true", help="skip the contended runs")
    parser.add_argument("--contended-only", action="store_true",
                        help="skip the quiet runs (their rows from an earlier run stay in the table)")
    parser.add_argument("--threads", type=int, default=None, help="a fixed thread count (default: geonp's choice)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="fill on the CPU (default) or the GPU (quiet runs only; its own table)")
    parser.add_argument("--repeats", type=int, default=1, metavar="N",
                        help="runs of each fill, the models taking turns; the table gives the median (default 1)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                        help="windows a model call, on the GPU only (default: infill's); its rows beside the default's")
    parser.add_argument("--one", nargs=2, metavar=("CASE", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one, threads=args.threads, device=args.device, batch_size=args.batch_size)),
              flush=True)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "fill_speed: --device cuda: no CUDA device here\n")
    gpu = args.device == "cuda"
    if args.batch_size is not None and not gpu:
        parser.error("--batch-size: GPU rows only (the CPU table keeps infill's default)")
    out = RESULTS / f"fill_speed_{args.device}"
    text = header("Fill speed, quiet and beside another job" if not gpu else "Fill speed on the GPU",
                  torch.device(args.device),
                  "each fill alone in its process with geonp's defaults (te-pt-tnp: 30 fit steps, the nugget check); "
                  + ("on the GPU, quiet only; wall time from the call to the filled dataset in memory (model load and "
                     "CUDA start included); GPU GB: torch's peak allocation; goal: 10^7 gap cells a minute "
                     "(166,667 a second)" if gpu else
                     "contended: beside a PyTorch job with its default threads; dineof on the multi-date cases only"))
    commit = git_commit()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    rows = []
    settings = (False,) if args.quiet_only or gpu else (True,) if args.contended_only else (False, True)
    for case in args.cases:
        models = [m for m in args.models if not (m == "dineof" and case in ("scene150k", "demo"))]
        for contended in settings:
            runs: dict[str, list[dict]] = {m: [] for m in models}
            for _ in range(args.repeats):
                for model in models:
                    run = measure(case, model, contended, args.threads, args.device, args.batch_size)
                    if run is not None:
                        runs[model].append({**run, "commit": commit})
                        print(json.dumps(runs[model][-1]), flush=True)
            rows += [median_row(r) for r in runs.values() if r]
    path = out.with_suffix(".json")
    if path.exists():
        ran = {row_key(r, gpu) for r in rows}
        rows += [r for r in json.loads(path.read_text())["rows"] if row_key(r, gpu) not in ran]
    rows.sort(key=lambda r: (CASES.index(r["case"]), MODELS.index(r["model"]), row_key(r, gpu)[2:]))
    lines = gpu_table(rows) if gpu else cpu_table(rows)
    out.with_suffix(".md").write_text(text + "\n" + "\n".join(lines) + "\n")
    path.write_text(rows_json({"header": text}, rows))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
