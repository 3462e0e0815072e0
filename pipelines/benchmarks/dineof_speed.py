"""How long DINEOF takes on a long stack, with the EOFs from a dense ``eigh`` or from Lanczos.

    GEONP_DATA=../shared/data OMP_NUM_THREADS=1 python -m pipelines.benchmarks.dineof_speed

The two hourly months among the training fields of ``history-folds-small`` (ERA5 2 m temperature
over the UK, 744 steps of 33 x 49 cells; WFDE5 air temperature over the UK, 744 steps of 20 x 28),
each with a third of its steps' cells hidden as one history fold hides them
(:func:`geonp.tasks.history.history_folds`' first fold, the same seed), filled by
:func:`geonp.tasks.dineof.dineof` twice: with every stack on the dense ``numpy.linalg.eigh`` of
``X^T X`` (``dense_steps`` past the stack's length, the code before Lanczos) and as
shipped (ARPACK's Lanczos beyond ``DENSE_EOF_STEPS`` steps). Reports each one's wall time, the modes
kept and the largest difference of the held-out predictions (the covariate a model reads), in the
field's units. Run it with nothing else on the machine for timings to compare with other rows.
Writes ``pipelines/results/dineof_speed_cpu.md`` (one row per field and run, earlier rows kept).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from geonp.data.readers import data_folder
from geonp.tasks import dineof as module
from geonp.tasks.history import FOLD_SEED, fold_hidden
from geonp.tasks.real_fields import load_field
from pipelines.provenance import REPO, append_rows, git_commit, header, write_results

OUT = REPO / "pipelines" / "results" / "dineof_speed_cpu"
FIELDS = {
    "era5_uk_hourly_t2m": {"path": "era5/era5_t2m_uk_2019-03_hourly.nc", "variable": "t2m"},
    "wfde5_uk_hourly_tair": {"path": "reanalysis/wfde5_tair_uk_2017-01_hourly_0p5.nc", "variable": "Tair"},
}


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


def timed(values: np.ndarray, valid: np.ndarray, rng_state: dict, dense: bool) -> tuple[float, module.Reconstruction]:
    """One :func:`dineof` of the stack, its wall seconds; ``dense`` keeps every stack on ``eigh``."""
    rng = np.random.default_rng()
    rng.bit_generator.state = rng_state
    start = time.perf_counter()
    rec = module.dineof(values, valid, rng=rng, dense_steps=10**9 if dense else module.DENSE_EOF_STEPS)
    return time.perf_counter() - start, rec


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fields", nargs="+", default=list(FIELDS), choices=list(FIELDS))
    parser.add_argument("--out", type=Path, default=OUT, help="results path without suffix (default: %(default)s)")
    args = parser.parse_args(argv)
    stacks = {name: fold_stack(FIELDS[name]) for name in args.fields}  # every file found before any row
    for name, (values, valid, rng) in stacks.items():
        row = compare(name, values, valid, rng.bit_generator.state)
        rows = append_rows(args.out, row)
        write_results(args.out, _table(rows), rows)
        print(row)
    print(_table(rows))


def compare(name: str, values: np.ndarray, valid: np.ndarray, rng_state: dict) -> dict:
    """One results row: the stack ``values [T, R, C]`` filled on both paths from the same state."""
    dense_s, dense = timed(values, valid, rng_state, dense=True)
    lanczos_s, lanczos = timed(values, valid, rng_state, dense=False)
    steps, r, c = values.shape
    return {"field": name, "steps": steps, "grid": f"{r} x {c}", "modes": f"{dense.modes} / {lanczos.modes}",
            "eigh_s": round(dense_s, 1), "lanczos_s": round(lanczos_s, 1),
            "speedup": round(dense_s / max(lanczos_s, 1e-9), 2),
            "max_diff": float(f"{np.nanmax(np.abs(dense.held_out - lanczos.held_out)):.2g}"),
            "commit": git_commit()}


def _table(rows: list[dict]) -> str:
    text = header("DINEOF on a long stack: dense eigh against Lanczos", torch.device("cpu"),
                  "one history fold of each field (a third of the steps, 10-50% of their cells hidden), "
                  "one fill per path")
    text += ("\n| field | steps | grid | modes (eigh / Lanczos) | eigh s | Lanczos s | speed-up "
             "| max held-out difference | commit |\n|---|---:|---:|---|---:|---:|---:|---:|---|\n")
    return text + "".join(f"| {x['field']} | {x['steps']} | {x['grid']} | {x['modes']} | {x['eigh_s']} "
                          f"| {x['lanczos_s']} | {x['speedup']}x | {x['max_diff']} | {x['commit']} |\n" for x in rows)


if __name__ == "__main__":
    main()
