"""Reliability report (issue #16 §8): the bad-input matrix, kill-and-resume trials, cluster trials.

    python -m pipelines.benchmarks.reliability [--infill-trials 10] [--train-trials 3] [--fetch-trials 3]

Writes ``pipelines/results/reliability.md`` (and ``.json``):

* every case of the bad-input matrix (tests/test_bad_input.py) run through the command line, with
  its exit code, its one stderr line, and whether it left a complete-looking output or changed
  an input;
* ``geonp infill`` killed with SIGKILL at a random moment (start-up, fine-tuning, blocks or the
  final rewrite) of a real satellite scene, then rerun: the output must equal an uninterrupted run
  value for value;
* ``geonp train`` killed at a random moment, resumed (``--resume`` when a checkpoint exists): the
  final weights must equal an uninterrupted run's bit for bit (CPU, fixed seed);
* ``geonp fetch era5`` killed mid-download against the stand-in CDS (tests/cds_standin.py), rerun:
  the store must equal an uninterrupted fetch, no time step missing or doubled;
* the cluster trials (tests/test_dask_cluster.py) and the list of writers and how each survives a kill.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import xarray as xr
import yaml
from safetensors.torch import load_file

from pipelines.provenance import REPO, header

sys.path.insert(0, str(REPO / "tests"))
RESULTS = REPO / "pipelines" / "results" / "reliability.md"
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
GEONP = [sys.executable, "-m", "geonp"]

#: Every file geonp writes, and what keeps it whole when the process is killed.
WRITERS = [
    ("infill output (geonp/fill/output.py)", "Zarr blocks, each block's data before its done byte; the finished "
     "store is written as OUT.geonp-final and swapped in by two renames (a cut swap is put back on the next run)"),
    ("fine-tuned weights inside an unfinished output (geonp/fill/prepare.py)", "geonp/atomic.py (temporary file "
     "beside it, then rename); the resumed run reuses them"),
    ("training state.safetensors and model.safetensors (geonp/train_state.py, geonp/checkpoint.py)",
     "geonp/atomic.py; on resume the log is cut back to the checkpoint's step"),
    ("ERA5 store (geonp/data/era5.py)", "a month is appended to the Zarr store, then recorded in its "
     "geonp_months attribute; an append without its record is cut off on the next run"),
    ("ERA5 downloads (geonp/data/era5.py)", "a temporary folder beside the store, removed on failure; one left by "
     "a killed fetch is removed by the next"),
    ("geonp evaluate and satellite_cv tables (geonp/skill_table.py), geonp plot PNGs (geonp/maps/figure.py)",
     "geonp/atomic.py"),
    ("other pipeline tables (pipelines/*)", "written once at the end of a run; rows of earlier runs kept with "
     "--reuse"),
]


def _hash_store(path: Path) -> dict[str, np.ndarray]:
    ds = xr.open_zarr(path)
    return {v: ds[v].values for v in ds.data_vars}


def _same_store(a: Path, b: Path) -> bool:
    x, y = _hash_store(a), _hash_store(b)
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k], equal_nan=True) for k in x)


def _kill_at(cmd: list[str], seconds: float) -> int:
    """Run ``cmd``, SIGKILL it after ``seconds`` (if still running); its return code."""
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return proc.returncode


def _timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - start


def matrix() -> list[dict]:
    import pytest
    from test_bad_input import CASES, outcome

    rows = []
    for param in CASES:
        build = param.values[0]
        with tempfile.TemporaryDirectory() as tmp:
            try:
                c = build(Path(tmp))
            except pytest.skip.Exception as why:
                rows.append({"case": param.id, "outcome": f"skipped: {why}"})
                continue
            got = outcome(c)
        ok = (got["code"] == c.code and len(got["lines"]) == 1 and c.expect in got["lines"][0]
              and "Traceback" not in got["stderr"] and not got["complete_output"] and not got["modified"])
        rows.append({"case": param.id, "exit": got["code"], "line": got["lines"][0] if got["lines"] else "",
                     "outcome": "pass" if ok else "FAIL"})
    return rows


def infill_trials(n: int, rng: np.random.Generator, work: Path) -> list[dict]:
    from conftest import data_dir

    folder = data_dir()
    if folder is None:
        raise SystemExit("the infill trials need ../shared/data (or GEONP_DATA)")
    scene = xr.open_dataset(folder / "satellite" / "alboran_sst_avhrr_2017-05.nc").isel(
        time=slice(0, 4), lat=slice(0, 120), lon=slice(0, 150)).load()
    path = work / "alboran_crop.nc"
    scene.to_netcdf(path, encoding={v: {"chunksizes": (1, 60, 75)} for v in ("SST",)})
    cmd = [*GEONP, "infill", str(path), "--var", "SST", "--satellite", "--valid-mask", "mask", "--model",
           "te-pt-tnp", "--fit-steps", "5", "-q"]
    whole = _timed([*cmd, "-o", str(work / "reference.zarr")])
    rows = []
    for trial in range(n):
        out = work / f"trial{trial}.zarr"
        at = float(rng.uniform(0.05, 1.0) * whole)
        code = _kill_at([*cmd, "-o", str(out)], at)
        state = "finished before the kill" if code == 0 else (
            "incomplete store" if out.exists() else "nothing written yet")
        # A run that finished before the kill is complete: a rerun would rightly be refused.
        rerun = 0 if code == 0 else subprocess.run([*cmd, "-o", str(out)], env=ENV, capture_output=True).returncode
        rows.append({"trial": trial, "killed_at_s": round(at, 1), "of_s": round(whole, 1), "left": state,
                     "rerun_exit": rerun if code else "no rerun", "identical": rerun == 0
                     and _same_store(work / "reference.zarr", out)})
        print(f"infill trial {trial}: {rows[-1]}", flush=True)
    return rows


def train_trials(n: int, rng: np.random.Generator, work: Path) -> list[dict]:
    config = {"model": "te-pt-tnp", "preset": "tiny", "data": {"name": "gp"}, "steps": 60, "batch_size": 8,
              "checkpoint_every": 10, "val_every": 60, "val_tasks": 16, "log_every": 10, "device": "cpu", "seed": 3}

    def run_to_end(name: str, kill_at: float | None = None) -> tuple[Path, str]:
        cfg = work / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump({**config, "out_dir": str(work / name)}))
        left = "uninterrupted"
        if kill_at is not None:
            code = _kill_at([*GEONP, "train", str(cfg), "--no-progress"], kill_at)
            state = work / name / "state.safetensors"
            left = "finished before the kill" if code == 0 else (
                f"checkpoint at step {json.loads((work / name / 'summary.json').read_text())['step']}"
                if (work / name / "summary.json").exists() and state.exists() else
                "checkpoint" if state.exists() else "no checkpoint yet")
            if code == 0:
                return work / name / "model.safetensors", left
        resume = ["--resume"] if (work / name / "state.safetensors").exists() else []
        subprocess.run([*GEONP, "train", str(cfg), "--no-progress", *resume], env=ENV, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return work / name / "model.safetensors", left

    start = time.perf_counter()
    reference, _ = run_to_end("reference")
    whole = time.perf_counter() - start
    ref = load_file(str(reference))
    rows = []
    for trial in range(n):
        at = float(rng.uniform(0.2, 1.0) * whole)
        weights, left = run_to_end(f"trial{trial}", at)
        got = load_file(str(weights))
        same = ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
        rows.append({"trial": trial, "killed_at_s": round(at, 1), "of_s": round(whole, 1), "left": left,
                     "identical_weights": same})
        print(f"train trial {trial}: {rows[-1]}", flush=True)
    return rows


def fetch_trials(n: int, rng: np.random.Generator, work: Path) -> list[dict]:
    from cds_standin import StandIn

    args = ["fetch", "era5", "--variable", "2m_temperature", "--start", "2019-01-30", "--end", "2019-04-02",
            "--area", "50/-2/46/3", "--grid", "1", "--hours", "0,12", "--retries", "0"]
    rows = []
    with StandIn() as cds:
        env = {**ENV, "CDSAPI_URL": cds.url, "CDSAPI_KEY": cds.key, "HOME": str(work), "no_proxy": "127.0.0.1"}
        global_env = dict(ENV)
        ENV.update(env)
        try:
            whole = _timed([*GEONP, *args, "-o", str(work / "reference.zarr")])
            reference = xr.open_zarr(work / "reference.zarr").load()
            for trial in range(n):
                out = work / f"fetch{trial}.zarr"
                cds.requests.clear()
                at = float(rng.uniform(0.1, 1.0) * whole)
                code = _kill_at([*GEONP, *args, "-o", str(out)], at)
                before = list(cds.months())
                again = subprocess.run([*GEONP, *args, "-o", str(out)], env=ENV, capture_output=True, text=True)
                got = xr.open_zarr(out).load() if again.returncode == 0 else None
                times = got["time"].values if got is not None else np.array([])
                rows.append({"trial": trial, "killed_at_s": round(at, 1), "of_s": round(whole, 1),
                             "months_before_kill": len(before), "finished_before_kill": code == 0,
                             "rerun_exit": again.returncode,
                             "no_time_missing_or_doubled": bool(np.array_equal(times, reference["time"].values)),
                             "identical": got is not None and got.equals(reference)})
                print(f"fetch trial {trial}: {rows[-1]}", flush=True)
        finally:
            ENV.clear()
            ENV.update(global_env)
    return rows


def cluster_trials() -> list[dict]:
    report = Path(tempfile.mkdtemp()) / "cluster.json"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_dask_cluster.py",
                    f"--junitxml={report.with_suffix('.xml')}"], cwd=REPO, env=ENV, capture_output=True)
    import xml.etree.ElementTree as ET

    rows = []
    for case in ET.parse(report.with_suffix(".xml")).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped")
        rows.append({"trial": case.get("name"), "seconds": round(float(case.get("time", 0)), 1),
                     "outcome": "skipped: " + (skipped.get("message") or "") if skipped is not None
                     else "FAIL" if failed else "pass"})
    return rows


def _table(rows: list[dict]) -> str:
    if not rows:
        return "(none)\n"
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")).replace("|", "/") for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--infill-trials", type=int, default=10)
    parser.add_argument("--train-trials", type=int, default=3)
    parser.add_argument("--fetch-trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    work = Path(tempfile.mkdtemp(prefix="geonp-reliability-"))
    for part in ("infill", "train", "fetch"):
        (work / part).mkdir()
    try:
        sections = {
            "Bad-input matrix (tests/test_bad_input.py, through `geonp.cli.main`)": matrix(),
            "geonp infill killed (SIGKILL) at a random moment, then rerun (Alboran SST, 4 x 120 x 150 cells, "
            "16 blocks, te-pt-tnp, 5 fit steps)": infill_trials(args.infill_trials, rng, work / "infill"),
            "geonp train killed (SIGKILL) at a random moment, then resumed (te-pt-tnp tiny, 60 steps, "
            "checkpoint every 10, CPU)": train_trials(args.train_trials, rng, work / "train"),
            "geonp fetch era5 killed (SIGKILL) mid-download against the stand-in CDS, then rerun "
            "(4 months)": fetch_trials(args.fetch_trials, rng, work / "fetch"),
            "dask.distributed LocalCluster, two worker processes (tests/test_dask_cluster.py)": cluster_trials(),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    budget = (f"{args.infill_trials} infill, {args.train_trials} train and {args.fetch_trials} fetch kill trials, "
              f"kill moments drawn with seed {args.seed}")
    text = header("Reliability: bad input, kill and resume, a real cluster", torch.device("cpu"), budget)
    for title, rows in sections.items():
        text += f"\n## {title}\n\n{_table(rows)}"
    text += "\n## Writers and what keeps each whole when the process is killed\n\n"
    text += _table([{"writer": w, "protection": p} for w, p in WRITERS])
    failures = [(t, r) for t, rows in sections.items() for r in rows
                if r.get("outcome") == "FAIL" or r.get("identical") is False or r.get("identical_weights") is False]
    text += "\n## Not yet handled\n\n" + ("\n".join(f"- {t}: {r}" for t, r in failures) or
                                            "- nothing failed in this run") + "\n"
    out = Path(args.out)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(sections, indent=1, default=str))
    print(text)


if __name__ == "__main__":
    main()
