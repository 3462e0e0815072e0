"""How long DINEOF takes on a long stack: EOFs from a dense ``eigh``, fresh Lanczos, or carried on.

    GEONP_DATA=../shared/data python -m pipelines.benchmarks.dineof_speed
    GEONP_DATA=../shared/data python -m pipelines.benchmarks.dineof_speed --paths lanczos block
    GEONP_DATA=../shared/data python -m pipelines.benchmarks.dineof_speed --paths block block-device --device cuda

The two hourly months among the training fields of ``history-folds-small`` (ERA5 2 m temperature
over the UK, 744 steps of 33 x 49 cells; WFDE5 air temperature over the UK, 744 steps of 20 x 28),
each with a third of its steps' cells hidden as one history fold hides them
(:func:`geonp.tasks.history.history_folds`' first fold, the same seed), filled by
:func:`geonp.tasks.dineof.dineof` once per path: ``eigh``, every iteration's EOFs from a dense
``numpy.linalg.eigh`` of ``X^T X`` (``dense_steps`` past the stack's length); ``lanczos``, from a
fresh ARPACK Lanczos in every iteration (``warm_start=False``, the code before 2026-11-30's
block iteration); ``block``, as shipped: Lanczos once at the start of each convergence, then block
iteration until the EOFs settle (:data:`geonp.tasks.eofs.EOF_RESIDUAL`); ``block-fill-threads``,
as shipped but with its iterations on the BLAS threads a fill configures
(:func:`geonp.threads.configure`: every usable core) instead of one
(:func:`geonp.threads.one_blas_thread`); ``block-device``, the shipped steps with the iterations in
torch on ``--device`` (float64; :func:`geonp.tasks.eofs.converge`), a fill's path on a GPU (on a CPU
device a check of that code against NumPy's). Every path runs with the threads a fill sets. Reports each
one's wall time, the modes kept, the largest difference of the held-out predictions (the covariate
a model reads) from the shipped path's, in the field's units, and each path's RMSE at the fold's
hidden cells against the field itself. Run it with nothing else on the machine for timings to
compare with other rows (rows before 2026-11-30 ran with ``OMP_NUM_THREADS=1``: one thread for
everything; they also ran an older cross-validation set, before 9da2803, which kept 7 modes on
WFDE5 where today's keeps 19; rows before the block iteration shipped fresh Lanczos, and their
fill's-threads column timed that).
Writes ``pipelines/results/dineof_speed_cpu.md``, or ``dineof_speed_cuda.md`` with ``--device cuda``
(one row per field and run, earlier rows kept).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from geonp.data.readers import data_folder
from geonp.tasks import dineof as module
from geonp.tasks import eofs
from geonp.tasks.history import FOLD_SEED, fold_hidden
from geonp.tasks.real_fields import load_field
from geonp.threads import configure
from pipelines.provenance import REPO, append_rows, git_commit, header, write_results

RESULTS = REPO / "pipelines" / "results"
FIELDS = {
    "era5_uk_hourly_t2m": {"path": "era5/era5_t2m_uk_2019-03_hourly.nc", "variable": "t2m"},
    "wfde5_uk_hourly_tair": {"path": "reanalysis/wfde5_tair_uk_2017-01_hourly_0p5.nc", "variable": "Tair"},
}
#: The ways of filling a stack compared: EOFs by dense eigh, by fresh Lanczos in every iteration,
#: carried on by block iteration (shipped), that with the fill's BLAS threads in its iterations, and
#: the shipped steps in torch on ``--device``.
PATHS = ("eigh", "lanczos", "block", "block-fill-threads", "block-device")
SHIPPED = "block"


def fold_stack(entry: dict) -> tuple[np.ndarray, np.ndarray, np.random.Generator, np.ndarray]:
    """The field ``[T, R, C]`` with the cells of a first history fold hidden (NaN), its valid mask,
    the generator state DINEOF continues from there, as in training, and the field itself."""
    folder = data_folder()
    if not (folder / entry["path"]).exists():
        raise SystemExit(f"dineof_speed: {folder / entry['path']} not found (set GEONP_DATA to the shared data)")
    values, valid, _, _ = load_field(entry, folder)
    rng = np.random.default_rng(FOLD_SEED)
    hidden = fold_hidden(values, np.broadcast_to(valid, values.shape), 0, 3, rng)
    return np.where(hidden, np.nan, values), valid, rng, values


def timed(values: np.ndarray, valid: np.ndarray, rng_state: dict, path: str,
          device: torch.device | None = None) -> tuple[float, module.Reconstruction]:
    """One :func:`dineof` of the stack by ``path`` (one of :data:`PATHS`; ``block-device`` on
    ``device``), its wall seconds (a GPU's work waited for: the fill comes back to the host)."""
    rng = np.random.default_rng()
    rng.bit_generator.state = rng_state
    threads = (mock.patch.object(eofs, "one_blas_thread", contextlib.nullcontext) if path == "block-fill-threads"
               else contextlib.nullcontext())
    start = time.perf_counter()
    with threads:
        rec = module.dineof(values, valid, rng=rng, dense_steps=10**9 if path == "eigh" else eofs.DENSE_EOF_STEPS,
                            warm_start=path != "lanczos", device=device if path == "block-device" else None)
    return time.perf_counter() - start, rec


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fields", nargs="+", default=list(FIELDS), choices=list(FIELDS))
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS,
                        help="which ways to fill each stack (block, the shipped one, always runs)")
    parser.add_argument("--device", default="cpu", help="where block-device runs (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="results path without suffix (default: "
                        "pipelines/results/dineof_speed_DEVICE, DEVICE cpu or cuda)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "dineof_speed: --device cuda: no CUDA device here\n")
    if device.type == "cuda":
        torch.zeros(1, device=device)  # CUDA's start is not DINEOF's time
    out = args.out or RESULTS / f"dineof_speed_{device.type}"
    threads = configure()  # as a fill does
    stacks = {name: fold_stack(FIELDS[name]) for name in args.fields}  # every file found before any row
    for name, (values, valid, rng, truth) in stacks.items():
        row = compare(name, values, valid, rng.bit_generator.state, args.paths, threads, truth, device)
        rows = append_rows(out, row)
        write_results(out, _table(rows, device), rows)
        print(row)
    print(_table(rows, device))


def compare(name: str, values: np.ndarray, valid: np.ndarray, rng_state: dict, paths: list[str],
            threads: int, truth: np.ndarray | None = None, device: torch.device | None = None) -> dict:
    """One results row: the stack ``values [T, R, C]`` filled by each of ``paths`` from the same state
    (``block-device`` on ``device``, default the CPU), scored at its hidden cells (NaN in ``values``,
    finite in ``truth [T, R, C]``) when given."""
    device = torch.device("cpu") if device is None else device
    runs = {path: timed(values, valid, rng_state, path, device)
            for path in [SHIPPED, *[p for p in paths if p != SHIPPED]]}
    shipped = runs[SHIPPED][1]
    steps, r, c = values.shape
    seconds = {p: round(runs[p][0], 1) if p in runs else None for p in PATHS}
    diffs = {p: float(np.nanmax(np.abs(rec.held_out - shipped.held_out))) for p, (_, rec) in runs.items()
             if p != SHIPPED}  # each path's largest held-out difference from the shipped one
    hidden = np.isnan(values) & np.isfinite(truth) if truth is not None else None
    rmse = None if hidden is None else " / ".join(
        f"{np.sqrt(np.mean((runs[p][1].held_out - truth)[hidden] ** 2)):.5f}" for p in PATHS if p in runs)
    return {"field": name, "steps": steps, "grid": f"{r} x {c}", "threads": threads,
            "modes": " / ".join(str(runs[p][1].modes) for p in PATHS if p in runs),
            "eigh_s": seconds["eigh"], "lanczos_s": seconds["lanczos"], "block_s": seconds["block"],
            "block_threads_s": seconds["block-fill-threads"], "block_device_s": seconds["block-device"],
            "device": device.type if "block-device" in runs else None,
            "device_diff": float(f"{diffs['block-device']:.2g}") if "block-device" in diffs else None,
            "shipped": SHIPPED,
            "max_diff": float(f"{max(diffs.values()):.2g}") if diffs else None, "hidden_rmse": rmse,
            "commit": git_commit()}


def _table(rows: list[dict], device: torch.device) -> str:
    text = header("DINEOF on a long stack: dense eigh, fresh Lanczos, block iteration, BLAS threads, torch",
                  device, "one history fold of each field (a third of the steps, 10-50% of their "
                  "cells hidden), one fill per path, with the threads a fill configures")
    text += ("\n| field | steps | grid | threads | modes (each path run, in the columns' order) | eigh s | Lanczos s "
             "| Lanczos, fill's BLAS threads s | block s | block, fill's BLAS threads s "
             "| block in torch s (device, max held-out difference from block) "
             "| shipped "
             "| max held-out difference from shipped | held-out RMSE at the hidden cells (each path run) | commit |\n"
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|---|\n")

    def cell(value):
        return "–" if value is None else value

    # Rows before the block iteration: Lanczos shipped, its fill's-threads time in fill_threads_s.
    return text + "".join(
        f"| {x['field']} | {x['steps']} | {x['grid']} | {cell(x.get('threads', 1))} | {x['modes']} "
        f"| {cell(x['eigh_s'])} | {cell(x['lanczos_s'])} | {cell(x.get('fill_threads_s'))} | {cell(x.get('block_s'))} "
        f"| {cell(x.get('block_threads_s'))} | {_on_device(x)} | {x.get('shipped', 'lanczos')} | {cell(x['max_diff'])} "
        f"| {cell(x.get('hidden_rmse'))} | {x['commit']} |\n" for x in rows)


def _on_device(row: dict) -> str:
    """The ``block-device`` cell: its seconds, device and largest held-out difference from the
    shipped path's, or a dash (rows before it had none)."""
    if row.get("block_device_s") is None:
        return "–"
    diff = row.get("device_diff")
    return f"{row['block_device_s']} ({row['device']}{'' if diff is None else f', {diff:.2g} from block'})"


if __name__ == "__main__":
    main()
