"""Does te-pt-tnp fill a cube the same on the GPU as on the CPU? A check for a GPU session.

    python -m pipelines.benchmarks.device_agreement                    # CPU against CUDA, 0 fit steps
    python -m pipelines.benchmarks.device_agreement --fit-steps 30
    python -m pipelines.benchmarks.device_agreement --devices cpu cpu  # the script itself, anywhere

A smooth synthetic cube (4 steps of 60 x 80 cells, an 8 x 12 hole in every step, 10% of the
other cells missing, a land corner) filled with the bundled te-pt-tnp on two devices, the same
seed: the largest difference of the filled values and of sigma over the gap cells, and each
fill's wall time. Until the neighbour search ranked equal distances by index, an H200 and the CPU
differed here by 1.4e-2 in the values and 1.8e-2 in sigma (at most 0.24): their ``topk`` broke
the grid's ties differently. Since then (H200, 2026-11-27, ``pipelines/results/device_agreement.md``)
they differ by 4.2e-5 in the values and 1.4e-5 in sigma, what sums taken in another order give (the
CPU's attention backends: up to 6e-5); thirty fine-tuning steps (``--fit-steps 30``) take that to
1.8e-4 and 2.5e-4, what the optimiser makes of it.
Writes ``pipelines/results/device_agreement.md`` (one row per run, earlier rows kept).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import xarray as xr

from geonp.fill.engine import infill
from pipelines.provenance import REPO, append_rows, git_commit, header, write_results

OUT = REPO / "pipelines" / "results" / "device_agreement"


def synthetic_cube(steps: int = 4, rows: int = 60, cols: int = 80, seed: int = 3) -> xr.Dataset:
    """``sst [time, lat, lon]`` (degC) and ``valid [lat, lon]``: a smooth field with a hole,
    scattered missing cells and land (never valid) in a corner; the test suite's ``smooth_cube``.
    The hole's position does not scale with the size: keep ``rows``, ``cols`` >= 16, 22."""
    rng = np.random.default_rng(seed)
    t, r, c = np.meshgrid(np.arange(steps), np.arange(rows), np.arange(cols), indexing="ij")
    field = 15 + np.sin(r / 5.0) + np.cos(c / 7.0) + 0.2 * t
    field[:, 8:16, 10:22] = np.nan
    field[rng.random(field.shape) < 0.1] = np.nan
    field[:, :5, :5] = np.nan
    valid = np.ones((rows, cols), bool)
    valid[:5, :5] = False
    return xr.Dataset({"sst": (("time", "lat", "lon"), field.astype(np.float32),
                               {"units": "degC", "standard_name": "sea_surface_temperature"}),
                       "valid": (("lat", "lon"), valid)},
                      coords={"time": pd.date_range("2020-01-01", periods=steps),
                              "lat": np.linspace(40, 47, rows), "lon": np.linspace(0, 10, cols)})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", nargs=2, default=["cpu", "cuda"], metavar=("A", "B"))
    parser.add_argument("--fit-steps", type=int, default=0)
    parser.add_argument("--out", default=str(OUT), help="results path without suffix (default: %(default)s)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if "cuda" in args.devices and not torch.cuda.is_available():
        sys.exit("device_agreement: no CUDA device here (--devices cpu cpu checks the script itself)")
    ds = synthetic_cube()
    gap = ~np.isfinite(ds.sst.values) & ds.valid.values
    fills, walls = [], []
    for device in args.devices:
        start = time.perf_counter()
        fills.append(infill(ds, "sst", "te-pt-tnp", fit_steps=args.fit_steps, seed=0, device=device))
        walls.append(time.perf_counter() - start)
    a, b = fills
    row = {"devices": " / ".join(args.devices), "fit_steps": args.fit_steps,
           "max_value_diff": float(np.abs(a.sst.values - b.sst.values)[gap].max()),
           "max_sigma_diff": float(np.abs(a.sst_std.values - b.sst_std.values)[gap].max()),
           "max_sigma": float(a.sst_std.values[gap].max()),
           "wall_s": " / ".join(f"{w:.1f}" for w in walls), "commit": git_commit()}
    rows = append_rows(out, row)
    device = torch.device("cuda" if "cuda" in args.devices else "cpu")
    text = header("The same fill on two devices (bundled te-pt-tnp, synthetic cube)", device,
                  f"4 x 60 x 80 cells, {int(gap.sum())} gap cells; one fill per device, the same seed")
    text += ("\n| devices | fit steps | max value difference | max sigma difference | max sigma | wall s | commit |\n"
             "|---|---:|---:|---:|---:|---|---|\n")
    text += "".join(f"| {x['devices']} | {x['fit_steps']} | {x['max_value_diff']:.2g} | {x['max_sigma_diff']:.2g} "
                    f"| {x['max_sigma']:.3g} | {x['wall_s']} | {x['commit']} |\n" for x in rows)
    write_results(out, text, rows)
    print(text)


if __name__ == "__main__":
    main()
