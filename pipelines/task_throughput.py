"""Tasks per second from a local ERA5-shaped Zarr cube (issue goal: >= 2,000 tasks/s on 2 CPU cores).

Builds (once, under ``--store``) a cube shaped like a ``geonp fetch era5`` download: 2 m
temperature at 0.5 degrees over Europe (lat 30..72, lon -25..45), 6-hourly for one year, float32,
chunked as ``geonp.data.zarr_store.chunk_sizes`` chunks a fetch (one day per time chunk),
Zstandard-compressed by Zarr's defaults, with an elevation coordinate. The field is a smooth
seasonal/diurnal pattern plus noise, so compression works on it about as it does on real data.

Then draws [time 5, lat 15, lon 15] windows (7.5 degrees by 30 h, the TE-TNP ERA5 set-up) in
central Europe with inputs (lat, lon, time, elevation), Dx = 4, and counts tasks per second,
reading from the Zarr store included, in this process and with DataLoader workers.

    python -m pipelines.task_throughput --out pipelines/results/task_throughput_cpu.md
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import xarray as xr
from torch.utils.data import DataLoader

from geonp.data import open_cube
from geonp.data.tasks import TaskSampler
from geonp.data.zarr_store import chunk_sizes
from pipelines.provenance import header

WINDOW = (5, 15, 15)


def build_store(path: Path) -> Path:
    """Write the ERA5-shaped cube to ``path`` unless it is already there."""
    if path.exists():
        return path
    lat, lon = np.arange(30.0, 72.01, 0.5), np.arange(-25.0, 45.01, 0.5)
    time_ = pd.date_range("2019-01-01", "2019-12-31T18:00", freq="6h")
    rng = np.random.default_rng(0)
    hours = np.arange(time_.size)[:, None, None] * 6.0
    season = 10 * np.cos(2 * np.pi * (hours / 24 - 200) / 365.25)
    diurnal = 4 * np.cos(2 * np.pi * (hours % 24 - 14) / 24)
    t2m = (285 - 0.6 * (lat[None, :, None] - 50) + season + diurnal
           + rng.normal(0, 1.5, (time_.size, lat.size, lon.size))).astype(np.float32)
    elevation = np.clip(rng.normal(300, 400, (lat.size, lon.size)), 0, None).astype(np.float32)
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), t2m, {"units": "K"})},
                    coords={"time": time_, "lat": lat, "lon": lon,
                            "elevation": (("lat", "lon"), elevation, {"units": "m"})})
    chunks = chunk_sizes(steps_per_day=4, nlat=lat.size, nlon=lon.size)
    ds.chunk(chunks).to_zarr(path, consolidated=True)
    return path


def run(sampler: TaskSampler, workers: int, batches: int) -> dict:
    """Draw ``batches`` batches (the first tile read included) and time them."""
    loader = DataLoader(sampler, batch_size=None, num_workers=workers) if workers else sampler
    start = time.perf_counter()
    stream = iter(loader)
    tasks = 0
    for _ in range(batches):
        batch = next(stream)
        tasks += len(batch)
    seconds = time.perf_counter() - start
    del stream
    return {"tasks": tasks, "seconds": seconds, "tasks_per_s": tasks / seconds,
            "mean_context": float(batch.mask_c.sum(1).float().mean()),
            "mean_target": float(batch.mask_t.sum(1).float().mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="runs/era5_shaped.zarr", help="where the test cube lives")
    parser.add_argument("--batches", type=int, default=2000, help="batches per measurement")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", default="pipelines/results/task_throughput_cpu.md")
    args = parser.parse_args()
    torch.set_num_threads(2)
    store = build_store(Path(args.store))
    cube = open_cube(store, "t2m")
    rows = []
    for workers in (0, 2):
        for gap_fill in (0.0, 0.5):
            sampler = TaskSampler(cube, "t2m", window=WINDOW, region="central_europe",
                                  inputs=("lat", "lon", "time", "elevation"), batch_size=args.batch_size,
                                  gap_fill=gap_fill, seed=1)
            result = run(sampler, workers, args.batches)
            rows.append({"workers": workers, "gap_fill": gap_fill, "tiles": len(sampler.tiles), **result})
            print(rows[-1], flush=True)
    sizes = dict(cube.sizes)
    chunks = {d: c[0] for d, c in cube["t2m"].chunksizes.items()}
    text = header("Task sampler throughput (CPU)", torch.device("cpu"),
                  f"{args.batches} batches of {args.batch_size} tasks per row, first tile read included",
                  {"cube": f"ERA5-shaped Zarr v3, t2m float32, sizes {sizes}, chunks {chunks}",
                   "tasks": f"window {WINDOW} (time, lat, lon) in central_europe, inputs lat/lon/time/elevation "
                            "(Dx=4), context fraction U(0.01, 1/3)"})
    text += "\n| DataLoader workers | gap-fill share | tasks | seconds | tasks/s | mean Nc | mean Nt |\n"
    text += "|---|---|---|---|---|---|---|\n"
    for r in rows:
        text += (f"| {r['workers'] or 'none (in process)'} | {r['gap_fill']:.1f} | {r['tasks']} | {r['seconds']:.2f} "
                 f"| {r['tasks_per_s']:,.0f} | {r['mean_context']:.0f} | {r['mean_target']:.0f} |\n")
    text += ("\nGoal: at least 2,000 tasks/s for [15, 15, 5] windows on 2 CPU cores. Workers cost a process start "
             "each, which these short runs include.\n")
    out = Path(args.out)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
