"""Infill at scale (CPU, or the GPU with ``--device cuda``): peak memory of ``geonp infill`` on a ~2 GB Zarr cube, and
targets/s per model.

Memory (goal: peak RSS < 1.5 GB whatever the cube's size). Writes a float32 Zarr v3 cube of
``--size-gb`` (default 2.0, i.e. time 500 x 1000 x 1000 with chunks (1, 500, 500)) chunk by
chunk, so the writer itself stays small: a smooth moving field plus a little noise, with
cloud-shaped gaps (``random_clouds``) in ``--gap-steps`` time steps, ``--gap-cells`` in all.
Then runs ``python -m geonp infill CUBE -o OUT --model te-pt-tnp --checkpoint CKPT
--fit-steps 0 -q`` as a subprocess and records its peak resident set two ways, both polled every
0.2 s: the summed RSS of the process tree (psutil), and the kernel's high-water mark ``VmHWM``
of each process (``/proc/PID/status``), which also catches peaks between polls. (``ru_maxrss``
from ``wait4`` is kept in the JSON only: Linux carries the spawning process's resident set into
the child's ``ru_maxrss`` across fork/vfork + exec, so it is a floor of this benchmark's own
size, not the child's peak, whenever this process is the larger one.)
Every block is visited (read, composed, written), gaps or not, so the run reads and writes the
whole cube.

Throughput. One in-memory scene (``--scene`` cells square, a smooth field plus noise, about
30% cloud cover) filled by ``geonp.infill(ds, "v", model=..., fit_steps=0)`` for each of
``--models``, timed around the call (model loading and block composition included).

Without ``--checkpoint`` the te-pt-tnp weights are the bundled ones when geonp ships them,
else a random-weight checkpoint of the same architecture (``tiny`` preset, infill scaling
8 cells per unit): for memory and speed the values of the weights do not matter.

    python -m pipelines.benchmarks.infill_benchmark --out pipelines/results/infill_cpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dask
import dask.array as dsa
import numpy as np
import pandas as pd
import psutil
import torch
import xarray as xr
import zarr

import geonp
from geonp.data import zarr_store
from geonp.fill.output import FLAG_INFILLED, is_complete
from geonp.fill.predictor import bundled_checkpoint
from geonp.tasks.clouds import random_clouds
from pipelines.benchmarks.memory import high_water
from pipelines.provenance import header

GOAL_BYTES = 1.5e9
MODEL = "te-pt-tnp"


def smooth_field(t: np.ndarray, r: np.ndarray, c: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A smooth pattern drifting with time plus 0.2 K noise, ``[len(t), len(r), len(c)]`` float32."""
    t, r, c = t[:, None, None], r[None, :, None], c[None, None, :]
    f = (285.0 + 8.0 * np.sin(2 * np.pi * (r / 400.0 + t / 60.0)) * np.cos(2 * np.pi * c / 300.0)
         + 3.0 * np.sin(2 * np.pi * (r + c) / 150.0 - t / 7.0))
    return (f + rng.normal(0.0, 0.2, f.shape)).astype(np.float32)


def write_cube(path: Path, size_gb: float, grid: int, chunk: int, gap_cells: int, gap_steps: int,
               seed: int = 0) -> dict:
    """Write the test cube to ``path`` one chunk at a time; returns its description."""
    steps = max(1, round(size_gb * 1e9 / (4 * grid * grid)))
    gap_steps = max(1, min(gap_steps, steps))
    cover = gap_cells / (gap_steps * grid * grid)
    if not 0 < cover < 1:
        raise ValueError(f"--gap-cells {gap_cells} over {gap_steps} steps of {grid}x{grid}: cover must be in (0, 1)")
    shape, chunks = (steps, grid, grid), (1, chunk, chunk)
    template = xr.Dataset(
        {"v": (("time", "lat", "lon"), dsa.full(shape, np.nan, dtype=np.float32, chunks=chunks),
               {"units": "K", "long_name": "synthetic smooth field"})},
        coords={"time": pd.date_range("2000-01-01", periods=steps, freq="D"),
                "lat": np.linspace(60.0, 35.0, grid), "lon": np.linspace(-10.0, 30.0, grid)})
    with zarr_store.quiet_zarr():  # consolidated metadata in v3: zarr warns, xarray reads it
        template.to_zarr(path, mode="w-", compute=False, consolidated=True, zarr_format=3,
                         encoding={"v": {"chunks": chunks, "_FillValue": np.float32(np.nan)}})
    rng = np.random.default_rng(seed)
    # Gap steps spread evenly, away from the ends (each gets observed neighbours in time).
    spread = np.linspace(0, steps - 1, gap_steps + 2)[1:-1] if gap_steps < steps else np.arange(steps)
    holes = {int(t): random_clouds((grid, grid), cover, rng, scale=12.0) for t in np.unique(spread.round())}
    array = zarr.open_group(str(path), mode="r+", use_consolidated=False)["v"]
    axis = np.arange(grid, dtype=np.float64)
    for t in range(steps):
        for r0 in range(0, grid, chunk):
            for c0 in range(0, grid, chunk):
                rows, cols = slice(r0, min(r0 + chunk, grid)), slice(c0, min(c0 + chunk, grid))
                block = smooth_field(np.array([t], float), axis[rows], axis[cols], rng)
                if t in holes:
                    block[0][holes[t][rows, cols]] = np.nan
                array[t:t + 1, rows, cols] = block
    n_chunks = steps * (-(-grid // chunk)) ** 2
    return {"shape": list(shape), "chunks": list(chunks), "blocks": n_chunks, "memory_bytes": 4 * steps * grid * grid,
            "disk_bytes": disk_bytes(path), "gap_steps": sorted(holes),
            "gap_cells": int(sum(h.sum() for h in holes.values()))}


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def resolve_checkpoint(given: str | None, folder: Path) -> tuple[str, str]:
    """(path, description) of the te-pt-tnp weights: given, bundled, or random of the same architecture."""
    if given:
        return given, f"given checkpoint {given}"
    bundled = bundled_checkpoint(MODEL)
    if bundled is not None:
        return str(bundled), f"bundled weights ({bundled.name})"
    from geonp.models import build, save

    torch.manual_seed(0)
    path = folder / f"{MODEL}-random.safetensors"
    save(build(MODEL, 3, 1, preset="tiny"), path, extra={"infill": {"cells_per_unit": 8.0}})
    return str(path), "random weights, `tiny` preset (no bundled weights yet; same speed and memory)"


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "DASK_NUM_WORKERS"):
        env[var] = str(threads)
    return env


def run_infill(cube: Path, out: Path, checkpoint: str, threads: int, extra: list[str] | None = None,
               interval: float = 0.2) -> dict:
    """Run ``geonp infill`` in a subprocess; peak RSS (polled tree RSS, VmHWM) and wall time."""
    cmd = [sys.executable, "-m", "geonp", "infill", str(cube), "-o", str(out), "--model", MODEL,
           "--checkpoint", checkpoint, "--fit-steps", "0", "-q", *(extra or [])]
    with tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=err, stderr=err, env=child_env(threads))
        tree = psutil.Process(proc.pid)
        peak, hwm, samples = 0, {}, []
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            rss = 0
            try:
                for p in [tree, *tree.children(recursive=True)]:
                    rss += p.memory_info().rss
                    hwm[p.pid] = max(hwm.get(p.pid, 0), high_water(p.pid))
            except (psutil.Error, OSError):  # exiting between the calls
                pass
            peak = max(peak, rss)
            samples.append((round(time.perf_counter() - start, 1), rss))
            time.sleep(interval)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        log = err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"geonp infill exited {proc.returncode}: {log.strip()[-2000:]}")
    step = max(1, len(samples) // 200)  # a trace of the resident set, for the JSON
    return {"command": " ".join(["python", *cmd[1:]]), "wall_s": wall, "peak_rss_polled": peak,
            "peak_rss_hwm": sum(hwm.values()), "ru_maxrss_with_parent": usage.ru_maxrss * 1024,
            "rss_trace": samples[::step]}


def baseline_rss(threads: int) -> int:
    """Peak RSS of a process that only imports what ``geonp infill`` imports (the floor under any run)."""
    code = ("import torch, xarray, zarr, dask.array, geonp.cli, geonp.fill.engine, geonp.models, geonp.data; "
            "from pipelines.benchmarks.memory import high_water; print(high_water())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(threads),
                          check=True)
    return int(proc.stdout.strip().splitlines()[-1])


def check_output(out: Path, info: dict) -> int:
    """The store is complete and every gap cell is flagged infilled with a finite value; returns that count."""
    if not is_complete(out):
        raise RuntimeError(f"{out}: infill output not marked complete")
    ds = xr.open_zarr(out)
    filled = 0
    with dask.config.set(scheduler="synchronous"):
        for t in info["gap_steps"]:
            flag = ds["v_flag"][t].values
            value = ds["v"][t].values
            filled += int((flag == FLAG_INFILLED).sum())
            if not np.isfinite(value).all():
                raise RuntimeError(f"{out}: non-finite values left at time step {t}")
    if filled != info["gap_cells"]:
        raise RuntimeError(f"{out}: {filled} cells flagged infilled, expected {info['gap_cells']}")
    return filled


def memory_run(args: argparse.Namespace, checkpoint: str, folder: Path) -> dict:
    cube, out = folder / "cube.zarr", folder / "out.zarr"
    start = time.perf_counter()
    info = write_cube(cube, args.size_gb, args.grid, args.chunk, args.gap_cells, args.gap_steps, args.seed)
    info["write_s"] = time.perf_counter() - start
    print(f"cube {info['shape']} written in {info['write_s']:.0f} s ({info['disk_bytes'] / 1e9:.2f} GB on disk)",
          flush=True)
    result = run_infill(cube, out, checkpoint, args.threads, extra=["--device", args.device])
    info["import_rss"] = baseline_rss(args.threads)
    info.update(result)
    info["filled"] = check_output(out, info)
    info["out_disk_bytes"] = disk_bytes(out)
    info["filled_per_s"] = info["filled"] / info["wall_s"]
    info["peak_rss"] = max(info["peak_rss_polled"], info["peak_rss_hwm"])
    print(f"infill: {info['wall_s']:.0f} s, peak RSS {info['peak_rss'] / 1e9:.3f} GB", flush=True)
    return info


def scene(size: int, cover: float, seed: int = 0) -> xr.Dataset:
    """One ``size`` x ``size`` scene: the smooth field plus noise under random clouds."""
    rng = np.random.default_rng(seed)
    axis = np.arange(size, dtype=np.float64)
    values = smooth_field(np.zeros(1), axis, axis, rng)[0]
    values[random_clouds((size, size), cover, rng, scale=8.0)] = np.nan
    return xr.Dataset({"v": (("lat", "lon"), values, {"units": "K"})},
                      coords={"lat": np.linspace(50.0, 45.0, size), "lon": np.linspace(5.0, 10.0, size)})


def throughput(models: list[str], ds: xr.Dataset, checkpoint: str, seed: int = 0, device: str = "cpu") -> list[dict]:
    targets = int(np.isnan(ds["v"].values).sum())
    rows = []
    for name in models:
        start = time.perf_counter()
        out = geonp.infill(ds, "v", model=name, checkpoint=checkpoint if name == MODEL else None, fit_steps=0,
                           device=device, seed=seed)
        seconds = time.perf_counter() - start
        filled = int((out["v_flag"].values == FLAG_INFILLED).sum())
        rows.append({"model": name, "targets": targets, "filled": filled, "seconds": seconds,
                     "targets_per_s": targets / seconds})
        print(rows[-1], flush=True)
    return rows


def gb(n: float) -> str:
    return f"{n / 1e9:.3f} GB ({n / 2**30:.3f} GiB)"


def report(args: argparse.Namespace, weights: str, memory: dict | None, rows: list[dict]) -> str:
    scene_cells = args.scene * args.scene
    text = header(f"Infill at scale on {'the GPU' if args.device == 'cuda' else 'CPU'}: peak memory and targets per "
                  "second", torch.device(args.device),
                  f"one `geonp infill` run on the cube; one `geonp.infill` call per model on the scene; "
                  f"{args.threads} thread(s) (torch, OpenMP/MKL, dask)",
                  {"te-pt-tnp weights": weights})
    if memory is not None:
        t, r, c = memory["shape"]
        ok = "yes" if memory["peak_rss"] < GOAL_BYTES else "**no**"
        text += (f"\n## Memory: `geonp infill` on a {memory['memory_bytes'] / 1e9:.3g} GB cube\n\n"
                 f"Goal: peak RSS < 1.5 GB, bounded by the block, not the cube. Cube: float32 Zarr v3, time {t} x "
                 f"{r} x {c}, chunks {tuple(memory['chunks'])}, smooth field + 0.2 K noise, cloud-shaped gaps "
                 f"(`random_clouds`, scale 12 cells) in time steps {memory['gap_steps']}.\n\n"
                 f"Command: `{memory['command']}`\n\n"
                 "| cube in memory | cube on disk | blocks | gap cells | wall s | peak RSS (psutil, tree, 0.2 s) "
                 "| peak RSS (VmHWM) | < 1.5 GB | filled cells/s | output on disk |\n"
                 "|---|---|---|---|---|---|---|---|---|---|\n"
                 f"| {gb(memory['memory_bytes'])} | {gb(memory['disk_bytes'])} | {memory['blocks']:,} "
                 f"| {memory['gap_cells']:,} | {memory['wall_s']:.1f} | {gb(memory['peak_rss_polled'])} "
                 f"| {gb(memory['peak_rss_hwm'])} | {ok} | {memory['filled_per_s']:,.0f} "
                 f"| {gb(memory['out_disk_bytes'])} |\n\n"
                 f"Imports alone (torch, xarray, zarr, dask, geonp): {gb(memory['import_rss'])} peak RSS. "
                 "Wall time includes the interpreter start, the statistics pass over the whole cube and visiting "
                 "every block (read, compose, write three variables), gaps or not; filled cells/s is gap cells over "
                 "that wall time.\n")
    if rows:
        text += (f"\n## Throughput: one {args.scene} x {args.scene} scene, {rows[0]['targets'] / scene_cells:.0%} "
                 f"cloud cover\n\n`geonp.infill(ds, \"v\", model=..., fit_steps=0)`, timed around the call "
                 f"(model load, windows, blending included); torch.set_num_threads({args.threads}).\n\n"
                 "| model | targets | filled | wall s | targets/s |\n|---|---|---|---|---|\n")
        for r in rows:
            text += (f"| {r['model']} | {r['targets']:,} | {r['filled']:,} | {r['seconds']:.2f} "
                     f"| {r['targets_per_s']:,.0f} |\n")
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gb", type=float, default=2.0, help="cube size in memory, 1e9 bytes (default: 2.0)")
    p.add_argument("--grid", type=int, default=1000, help="rows = cols of the cube (default: 1000)")
    p.add_argument("--chunk", type=int, default=500, help="chunk rows = cols (default: 500; one time step per chunk)")
    p.add_argument("--gap-cells", type=int, default=50_000, help="gap cells in the cube (default: 50,000)")
    p.add_argument("--gap-steps", type=int, default=5, help="time steps holding the gaps (default: 5)")
    p.add_argument("--models", nargs="*", default=[MODEL, "linear", "kriging"], help="throughput models")
    p.add_argument("--scene", type=int, default=512, help="throughput scene rows = cols (default: 512)")
    p.add_argument("--cover", type=float, default=0.3, help="throughput scene cloud cover (default: 0.3)")
    p.add_argument("--checkpoint", default=None, help="te-pt-tnp weights (default: bundled, else random)")
    p.add_argument("--threads", type=int, default=1, help="torch / OpenMP / dask threads (default: 1)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="fill on the CPU (default) or the GPU: `geonp infill --device` and the scene's calls")
    p.add_argument("--skip-memory", action="store_true", help="only the throughput table")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tmp", default=None, help="folder for the temporary cube (default: the system's)")
    p.add_argument("--keep", action="store_true", help="keep the temporary cube, output and checkpoint")
    p.add_argument("--out", default=None, help="the table (default: pipelines/results/infill_{device}.md)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.exit(2, "infill_benchmark: --device cuda: no CUDA device here\n")
    torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="geonp-infill-bench-", dir=args.tmp))
    try:
        checkpoint, weights = resolve_checkpoint(args.checkpoint, folder)
        memory = None if args.skip_memory else memory_run(args, checkpoint, folder)
        with dask.config.set(num_workers=args.threads):
            rows = throughput(args.models, scene(args.scene, args.cover, args.seed), checkpoint, args.seed,
                              args.device)
    finally:
        if args.keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    text = report(args, weights, memory, rows)
    out = Path(args.out or f"pipelines/results/infill_{args.device}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"weights": weights, "threads": args.threads, "memory": memory,
                                                    "throughput": rows}, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
