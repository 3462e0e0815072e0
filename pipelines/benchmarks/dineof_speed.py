"""How long DINEOF takes on a long stack: EOFs from a dense ``eigh`` or from Lanczos, BLAS threads.

    GEONP_DATA=../shared/data python -m pipelines.benchmarks.dineof_speed
    GEONP_DATA=../shared/data python -m pipelines.benchmarks.dineof_speed --paths lanczos lanczos-fill-threads

The two hourly months among the training fields of ``history-folds-small`` (ERA5 2 m temperature
over the UK, 744 steps of 33 x 49 cells; WFDE5 air temperature over the UK, 744 steps of 20 x 28),
each with a third of its steps' cells hidden as one history fold hides them
(:func:`geonp.tasks.history.history_folds`' first fold, the same seed), filled by
:func:`geonp.tasks.dineof.dineof` twice: with every stack on the dense ``numpy.linalg.eigh`` of
``X^T X`` (``dense_steps`` past the stack's length, the code before Lanczos) and as
shipped (ARPACK's Lanczos beyond ``DENSE_EOF_STEPS`` steps), and a third time as shipped but with
its iterations on the BLAS threads a fill configures (:func:`geonp.threads.configure`: every
usable core) instead of one (:func:`geonp.threads.one_blas_thread`, the shipped choice since
2026-11-30). Every path runs with the threads a fill sets. Reports each one's wall time, the modes
kept and the largest difference of the held-out predictions (the covariate a model reads) from the
shipped path's, in the field's units. Run it with nothing else on the machine for timings to
compare with other rows (rows before 2026-11-30 ran with ``OMP_NUM_THREADS=1``: one thread for
everything, and the column of the fill's threads did not exist; they also ran an older
cross-validation set, before 9da2803, which kept 7 modes on WFDE5 where today's keeps 19).
Writes ``pipelines/results/dineof_speed_cpu.md`` (one row per field and run, earlier rows kept).
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
from geonp.tasks.history import FOLD_SEED, fold_hidden
from geonp.tasks.real_fields import load_field
from geonp.threads import configure
from pipelines.provenance import REPO, append_rows, git_commit, header, write_results

OUT = REPO / "pipelines" / "results" / "dineof_speed_cpu"
FIELDS = {
    "era5_uk_hourly_t2m": {"path": "era5/era5_t2m_uk_2019-03_hourly.nc", "variable": "t2m"},
    "wfde5_uk_hourly_tair": {"path": "reanalysis/wfde5_tair_uk_2017-01_hourly_0p5.nc", "variable": "Tair"},
}
#: The ways of filling a stack compared: EOFs by dense eigh, by Lanczos (shipped), by Lanczos with
#: the fill's BLAS threads in its iterations (the code before 2026-11-30).
PATHS = ("eigh", "lanczos", "lanczos-fill-threads")


def fold_stack(entry: dict) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
    """The field ``[T, R, C]`` with the cells of a first history fold hidden (NaN), its valid mask,
    and the generator state DINEOF continues from there, as in training."""
    folder = data_folder()
    if not (folder / entry["path"]).exists():
        raise SystemExit(f"dineof_speed: {folder / entry['path']} not found (set GEONP_DATA to the shared data)")
    values, valid, _, _ = load_field(entry, folder)
    rng = np.random.default_rng(FOLD_SEED)
    hidden = fold_hidden(values, np.broadcast_to(valid, values.shape), 0, 3, rng)
    return np.where(hidden, np.nan, values), valid, rng


def timed(values: np.ndarray, valid: np.ndarray, rng_state: dict, path: str) -> tuple[float, module.Reconstruction]:
    """One :func:`dineof` of the stack by ``path`` (one of :data:`PATHS`), its wall seconds."""
    rng = np.random.default_rng()
    rng.bit_generator.state = rng_state
    threads = (mock.patch.object(module, "one_blas_thread", contextlib.nullcontext) if path == "lanczos-fill-threads"
               else contextlib.nullcontext())
    start = time.perf_counter()
    with threads:
        rec = module.dineof(values, valid, rng=rng, dense_steps=10**9 if path == "eigh" else module.DENSE_EOF_STEPS)
    return time.perf_counter() - start, rec


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fields", nargs="+", default=list(FIELDS), choices=list(FIELDS))
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS,
                        help="which ways to fill each stack (lanczos, the shipped one, always runs)")
    parser.add_argument("--out", type=Path, default=OUT, help="results path without suffix (default: %(default)s)")
    args = parser.parse_args(argv)
    threads = configure()  # as a fill does
    stacks = {name: fold_stack(FIELDS[name]) for name in args.fields}  # every file found before any row
    for name, (values, valid, rng) in stacks.items():
        row = compare(name, values, valid, rng.bit_generator.state, args.paths, threads)
        rows = append_rows(args.out, row)
        write_results(args.out, _table(rows), rows)
        print(row)
    print(_table(rows))


def compare(name: str, values: np.ndarray, valid: np.ndarray, rng_state: dict, paths: list[str],
            threads: int) -> dict:
    """One results row: the stack ``values [T, R, C]`` filled by each of ``paths`` from the same state."""
    runs = {path: timed(values, valid, rng_state, path) for path in ["lanczos", *[p for p in paths if p != "lanczos"]]}
    shipped = runs["lanczos"][1]
    steps, r, c = values.shape
    seconds = {p: round(runs[p][0], 1) if p in runs else None for p in PATHS}
    diffs = [float(np.nanmax(np.abs(rec.held_out - shipped.held_out))) for p, (_, rec) in runs.items()
             if p != "lanczos"]
    return {"field": name, "steps": steps, "grid": f"{r} x {c}", "threads": threads,
            "modes": " / ".join(str(runs[p][1].modes) for p in PATHS if p in runs),
            "eigh_s": seconds["eigh"], "lanczos_s": seconds["lanczos"],
            "fill_threads_s": seconds["lanczos-fill-threads"],
            "max_diff": float(f"{max(diffs):.2g}") if diffs else None, "commit": git_commit()}


def _table(rows: list[dict]) -> str:
    text = header("DINEOF on a long stack: dense eigh, Lanczos, BLAS threads", torch.device("cpu"),
                  "one history fold of each field (a third of the steps, 10-50% of their cells hidden), "
                  "one fill per path, with the threads a fill configures")
    text += ("\n| field | steps | grid | threads | modes (each path run, in the columns' order) | eigh s "
             "| Lanczos s (shipped) "
             "| Lanczos, fill's BLAS threads s | max held-out difference | commit |\n"
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---|\n")
    def cell(value):
        return "–" if value is None else value

    return text + "".join(
        f"| {x['field']} | {x['steps']} | {x['grid']} | {cell(x.get('threads', 1))} | {x['modes']} "
        f"| {cell(x['eigh_s'])} | {cell(x['lanczos_s'])} | {cell(x.get('fill_threads_s'))} | {cell(x['max_diff'])} "
        f"| {x['commit']} |\n" for x in rows)


if __name__ == "__main__":
    main()
