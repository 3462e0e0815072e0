"""How long one large scene takes to fill: the issue's "a 150k-cell scene under a minute".

    python -m pipelines.benchmarks.scene_speed --threads 2            # bundled te-pt-tnp, 0 fit steps
    python -m pipelines.benchmarks.scene_speed --threads 2 --fit-steps 30

The wide-cloud validation scene (MODIS LST, about 150,000 cells, wide_clouds.py's crop and
clouds) filled once with the bundled te-pt-tnp through ``geonp.evaluate`` (so the fill is the one
that benchmark scores), timed from the call to the computed result: planning (history
covariates, the nugget check), fine-tuning when asked, and every block. Run it with nothing else
on the machine; the fused kernel's one-time build is not counted (a warm-up builds it first).
Writes ``pipelines/results/scene_speed_cpu.md`` (one row per run, earlier rows kept).
"""

from __future__ import annotations

import argparse

import torch

from geonp.evaluate import evaluate
from geonp.metrics import WIDE_DISTANCE_BINS
from pipelines.benchmarks.wide_clouds import scene
from pipelines.provenance import REPO, append_rows, git_commit, header, write_results

OUT = REPO / "pipelines" / "results" / "scene_speed_cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default: %(default)s)")
    parser.add_argument("--fit-steps", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from geonp.models import cpu_build

    cpu_build.build_all()  # built (or loaded from the cache) before the clock starts
    ds, variable, under, what = scene("validation")
    part = evaluate(ds, variable, ["te-pt-tnp"], fit_steps=args.fit_steps, seed=0, options={"device": "cpu"},
                    hide_under=under, distance_bins=WIDE_DISTANCE_BINS)
    r = part["rows"][0]
    row = {"model": "te-pt-tnp", "fit_steps": args.fit_steps, "threads": args.threads, "cells": int(ds[variable].size),
           "wall_s": round(r["wall_s"], 1), "rmse": round(r["rmse"], 4), "nugget": r.get("nugget", "–"),
           "commit": git_commit()}
    rows = append_rows(OUT, row)
    text = header("One large scene's fill time (the wide-cloud validation scene)", torch.device("cpu"),
                  f"bundled weights, {what}; one fill, the kernel built beforehand")
    text += ("\n| model | fit steps | threads | cells | wall s | RMSE | nugget | commit |\n"
             "|---|---:|---:|---:|---:|---:|---|---|\n")
    text += "".join(f"| {x['model']} | {x['fit_steps']} | {x['threads']} | {x['cells']} | {x['wall_s']} | {x['rmse']} "
                    f"| {x['nugget']} | {x['commit']} |\n" for x in rows)
    write_results(OUT, text, rows)
    print(text)


if __name__ == "__main__":
    main()
