"""One large scene under wide real clouds: how a fill holds up deep inside a cloud.

    python -m pipelines.benchmarks.wide_clouds --split validation                 # default rows
    python -m pipelines.benchmarks.wide_clouds --split test --rows linear kriging te-pt-tnp@30
    python -m pipelines.benchmarks.wide_clouds --split validation --reuse --rows wide@30 \\
        --checkpoint wide=runs/some/model.safetensors

MODIS Terra daytime land surface temperature (1 km, one day over Brazil), a crop of 150,000 cells
per split, its observed cells hidden under the *night* pass's real clouds over another part of
the same tile (``pipelines/scenes.yaml``, ``wide_clouds``): real cloud shapes, about a third of
the observed cells hidden, a third of those more than 12 cells from the nearest observation.
That is where a fill must at least match interpolation across the whole image, and where its
sigma must still cover the truth (issue: history and the large scale). The distance bins split
the far one at 25 cells (``geonp.metrics.WIDE_DISTANCE_BINS``).

A row is ``MODEL[@FIT_STEPS]`` or ``LABEL[@FIT_STEPS]`` with ``--checkpoint LABEL=PATH`` (te-pt-tnp
with other weights) or ``--variant LABEL=JSON`` (the bundled te-pt-tnp with other covariates or
inference settings, e.g. ``coarse='{"covariates": ["coarse"]}'``). ``validation`` is where variants are chosen; ``test``
is reported once per variant. Writes ``pipelines/results/wide_clouds_<split>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np
import torch

from geonp.data import open_satellite
from geonp.data.readers import data_folder
from geonp.device import resolve_device
from geonp.evaluate import evaluate
from geonp.metrics import WIDE_DISTANCE_BINS
from geonp.skill_table import write_table
from pipelines.checkpoint_variants import bundled_variants
from pipelines.provenance import REPO, git_commit, header
from pipelines.scene_tables import earlier_results, keep_earlier
from pipelines.scenes import WIDE_CLOUDS

ROWS = ["linear", "kriging", "te-pt-tnp", "te-pt-tnp@30"]
BUDGET = ("bundled weights unless a row names others, fine-tuned on the scene for a row's fit steps; the "
          "crop's observed cells under the night pass's clouds of the donor crop; a row's commit is the run "
          "that produced it")


def scene(split: str):
    """``(dataset, variable, hide-under mask [rows, cols], what)`` of one split."""
    spec = WIDE_CLOUDS[split]
    path = data_folder() / spec["path"]
    target = {d: slice(*r) for d, r in spec["target"].items()}
    donor = {d: slice(*r) for d, r in spec["donor"].items()}
    ds = open_satellite(path, spec["variable"]).isel(target)
    night = open_satellite(path, spec["clouds_of"]).isel(donor)
    under = (~np.isfinite(night[spec["clouds_of"]].values)) & night["valid"].values.astype(bool)
    what = (f"{spec['variable']} crop {_crop(spec['target'])} under {spec['clouds_of']}'s clouds of crop "
            f"{_crop(spec['donor'])}")
    return ds, spec["variable"], under, what


def _crop(ranges: dict) -> str:
    return ", ".join(f"{d} {a}:{b}" for d, (a, b) in ranges.items())


def summary(results: list[dict]) -> str:
    """Per scene and te-pt-tnp row, the issue's large-scale goals against linear and kriging."""
    lines = ["| row | RMSE / linear | RMSE / kriging | CRPS / kriging | 13-25 cells RMSE / linear | "
             ">25 cells RMSE / linear | 90% coverage by distance |", "|---|---:|---:|---:|---:|---:|---|"]
    for res in results:
        by = {(r["model"], r["fit_steps"]): r for r in res["rows"]}
        lin = next((r for (m, _), r in by.items() if m == "linear"), None)
        kri = next((r for (m, _), r in by.items() if m == "kriging"), None)
        if lin is None or kri is None:
            continue
        far = lambda r, b: (r.get("rmse_by_distance") or {}).get(b, {}).get("rmse", math.nan)  # noqa: E731
        for (model, fit), r in by.items():
            if model in ("linear", "kriging"):
                continue
            cover = " / ".join("–" if not math.isfinite(v) else f"{v:.2f}"
                               for v in (r.get("coverage_90_by_distance") or {}).values())
            lines.append(f"| {model} @{fit} | {r['rmse'] / lin['rmse']:.3f} | {r['rmse'] / kri['rmse']:.3f} | "
                         f"{r['crps'] / kri['crps']:.3f} | {far(r, '13-25') / far(lin, '13-25'):.3f} | "
                         f"{far(r, '>25') / far(lin, '>25'):.3f} | {cover or '–'} |")
    return ("Goals (issue: history and the large scale): beyond 12 cells RMSE <= linear's, 90% coverage "
            "0.85-0.95 in every distance bin, RMSE and CRPS at or below kriging's.\n\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=["validation", "test"], required=True)
    parser.add_argument("--rows", nargs="*", default=ROWS)
    parser.add_argument("--checkpoint", action="append", default=[], metavar="LABEL=PATH",
                        help="a row LABEL[@FIT] scores te-pt-tnp with these weights")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=JSON",
                        help='a row LABEL[@FIT] scores the bundled te-pt-tnp changed at inference only: '
                             '{"covariates": [...], "model_args": {...}, "window": {...}}')
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse", action="store_true", help="keep the earlier table's rows not run now")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not args.rows:
        raise SystemExit("wide_clouds: nothing to run; give --rows")
    out = Path(args.out or REPO / "pipelines" / "results" / f"wide_clouds_{args.split}.md")
    earlier = earlier_results(out.with_suffix(".json")) if args.reuse else {}
    trained = dict(item.split("=", 1) for item in args.checkpoint)
    commit = git_commit()
    ds, variable, under, what = scene(args.split)
    res = None
    with tempfile.TemporaryDirectory() as tmp:
        trained.update(bundled_variants(args.variant, Path(tmp)))
        for row in args.rows:
            label, _, fit = row.partition("@")
            model, checkpoints = (("te-pt-tnp", {"te-pt-tnp": trained[label]}) if label in trained else (label, None))
            part = evaluate(ds, variable, [model], checkpoints=checkpoints, fit_steps=int(fit or 0), seed=args.seed,
                            options={"device": "auto"}, hide_under=under, distance_bins=WIDE_DISTANCE_BINS)
            r = part["rows"][0]
            r.update(model=label, commit=commit)
            print(f"{row}: RMSE {r['rmse']:.4g} CRPS {r['crps']:.4g} cov90 {r['coverage_90']:.3f} "
                  f"({r['wall_s']:.0f} s)", flush=True)
            if res is None:
                res = part
            else:
                res["rows"] += part["rows"]
    res["source"] = f"modis_lst_brazil_2019-11-01.nc {what}"
    if res["source"] in earlier:
        keep_earlier(res, earlier[res["source"]], args.split)
    order = {m: i for i, m in enumerate(["linear", "kriging", "te-pt-tnp"])}
    res["rows"].sort(key=lambda r: (order.get(r["model"], len(order)), r["fit_steps"]))
    text = header(f"One large scene under wide real clouds ({args.split} split)", resolve_device("auto"), BUDGET)
    write_table([res], out, header=text + "\n" + summary([res]))
    print(out.read_text())


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
