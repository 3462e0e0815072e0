"""Which kriging would a geostatistician accept? Variogram families and a drift, chosen per scene, on the suite.

    python -m pipelines.experiments.kriging_variants --split validation

On every suite scene (``pipelines.suite_scenes``), with the suite's cells hidden, the kriging
baseline's whole-stack fill (:func:`geonp.models.field_kriging.krige_stack`, exactly as
``geonp infill --model kriging`` calls it) is run once per variant (:data:`VARIANTS`): the
variogram family fixed or chosen per scene on the scene's own cells hidden under random clouds
(``auto``), ordinary kriging or a linear drift (``trend``), more neighbours. ``kriging-now`` is
today's default and must reproduce the suite's ``kriging`` row. Each variant is judged against
the suite's ``kriging`` row by ``pipelines.suite_rule``, and against ``linear`` on the dense
single-date scenes (issue 53: kriging at most linear's RMSE there). Writes
``pipelines/results/kriging_variants_<split>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from geonp.evaluate import static_valid_area
from geonp.models.field_kriging import krige_stack
from geonp.tasks.hidden import distance_to_context, hide_under_mask
from pipelines import suite_table
from pipelines.benchmarks.suite import block_stats
from pipelines.provenance import REPO, git_commit, header
from pipelines.suite_report import DENSE_MEDIAN
from pipelines.suite_rule import TIE, compare, load_rows, ratio_interval, rows_by_scene
from pipelines.suite_scenes import SPLITS, draw, load

#: Label -> krige_stack keywords.
VARIANTS = {
    "kriging-now": {},
    "kriging-family": {"variogram_model": "auto"},
    "kriging-trend": {"trend": "auto"},
    "kriging-auto": {"variogram_model": "auto", "trend": "auto"},
    "kriging-auto-128": {"variogram_model": "auto", "trend": "auto", "neighbours": 128},
    "kriging-gapcheck": {"check": "gaps"},
    "kriging-family-gapcheck": {"variogram_model": "auto", "check": "gaps"},
    "kriging-auto-gapcheck": {"variogram_model": "auto", "trend": "auto", "check": "gaps"},
    "kriging-128": {"neighbours": 128},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=SPLITS, required=True)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--reuse", action="store_true", help="keep the earlier table's rows of variants not run now")
    args = parser.parse_args()
    text = header(f"Kriging variants on the suite ({args.split} split)", torch.device("cpu"),
                  "each variant's whole-stack kriging of every suite scene, the suite's cells hidden")
    commit = git_commit()
    rows, what = [], {}
    for scene in draw(args.split):
        ds, variable, under = load(scene)
        da = ds[variable].compute()
        valid = static_valid_area(ds, da, None, scene.name)
        masked, hidden = hide_under_mask(da, valid, under, scene.name)
        values = np.where(np.isinf(masked.values), np.nan, masked.values).astype(np.float64)
        hide = hidden.values
        cells = {"shape": values.shape, "index": np.flatnonzero(hide), "truth": da.values[hide],
                 "distance": distance_to_context(masked, valid)[hide]}
        for label in args.variants:
            start = time.perf_counter()
            mean, std, what[scene.name, label] = krige_stack(values, valid.values, rng=np.random.default_rng([0, 4099]),
                                                             **VARIANTS[label])
            wall = time.perf_counter() - start
            err = mean[hide] - cells["truth"]
            rows.append({"scene": scene.name, "product": scene.product, "model": label,
                         "rmse": float(np.sqrt(np.nanmean(err**2))), "wall_s": wall, "commit": commit,
                         "blocks": block_stats(cells, mean[hide], std[hide])})
        print(f"{scene.name}: " + ", ".join(f"{r['model']} {r['rmse']:.4g}" for r in rows[-len(args.variants):]),
              flush=True)
    out = REPO / "pipelines" / "results" / f"kriging_variants_{args.split}.md"
    if args.reuse and out.with_suffix(".json").exists():
        rows += [r for r in suite_table.read(out.with_suffix(".json"))["rows"] if r["model"] not in args.variants]
    labels = [v for v in VARIANTS if v in {r["model"] for r in rows}]
    suite = load_rows(args.split)
    scenes = {s["scene"]: s for s in suite_table.read(
        REPO / "pipelines" / "results" / f"suite_{args.split}.json")["scenes"]}
    dense = [s for s, rec in scenes.items() if rec["kind"] == "single" and rec["median_distance"] <= DENSE_MEDIAN]
    lines = ["| variant | keywords | against the suite's kriging | dense single-date scenes above linear's RMSE "
             "(beyond noise) | wall s / kriging-now |", "|---|---|---|---|---:|"]
    linear = rows_by_scene(suite, "linear")
    for label in labels:
        verdict = compare(rows + suite, label, "kriging")
        mine = rows_by_scene(rows, label)
        above = [s for s in dense if mine[s]["rmse"] > linear[s]["rmse"]]
        beyond = [s for s in above if ratio_interval(mine[s], linear[s], "rmse")[1] > 1 + TIE]
        now = rows_by_scene(rows, "kriging-now") if "kriging-now" in labels else mine
        wall = np.exp(np.mean([np.log(mine[s]["wall_s"] / now[s]["wall_s"]) for s in mine]))
        lines.append(f"| {label} | `{VARIANTS[label]}` | " + verdict.text().replace("\n  ", "; ").replace("\n", " ")
                     + f" | {len(above)} ({len(beyond)}){': ' + ', '.join(above) if above else ''} | {wall:.2f} |")
        print(verdict.text(), flush=True)
    chosen = [f"- {scene} {label}: {w}" for (scene, label), w in what.items() if "auto" in str(VARIANTS[label])]
    out.write_text(text + "\n" + "\n".join(lines) + f"\n\nDense single-date scenes: {', '.join(dense)}.\n\n"
                   "What the variants that choose per scene chose (this run's):\n\n" + "\n".join(chosen) + "\n")
    suite_table.write(out.with_suffix(".json"), text, args.split, [], rows)
    print(out.read_text())


if __name__ == "__main__":
    main()
