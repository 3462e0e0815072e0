"""Does a fill checked on the input itself beat te-pt-tnp alone? Blends of fillers by distance, on the suite.

    python -m pipelines.experiments.self_check --split validation            # fill, then score
    python -m pipelines.experiments.self_check --split validation --score    # score the cached fills only

For each suite scene (``pipelines.suite_scenes``), with the cells the suite hides already hidden:

1. hide 10-30% of the remaining observed cells under copies of the scene's own gap shapes
   (:func:`geonp.fill.blend.check_cells`): the *checked* cube;
2. prepare te-pt-tnp on the checked cube (the nugget check and the default fine-tuning) and fill
   both cubes with it, so no checked cell was seen by the model that fills it; fill both cubes
   with ``linear`` and ``kriging`` too;
3. cache, per scene, the checked cells' and the suite's hidden cells' truths, distances and every
   filler's mean and sigma (``runs/self_check/<split>/<scene>.npz``).

Then each rule (:data:`RULES`) learns its blend on the checked cells (:func:`geonp.fill.blend.fit_blend`)
and applies it at the suite's hidden cells; its rows are scored like the suite's (block sums) and
judged against the suite's ``te-pt-tnp`` row by ``pipelines.suite_rule``. Writes
``pipelines/results/self_check_<split>_fit<N>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from geonp.data.cube import renamed_from
from geonp.evaluate import static_valid_area
from geonp.fill.engine import fill_in_memory, infill
from geonp.fill.nugget import use_network_nugget
from geonp.fill.options import FitOptions
from geonp.fill.plan import plan
from geonp.fill.prepare import prepare
from geonp.tasks.hidden import distance_to_context, hide_under_mask
from pipelines import suite_table
from pipelines.benchmarks.suite import block_stats
from pipelines.experiments.blend import apply_blend, check_cells, fit_blend
from pipelines.provenance import REPO, git_commit, header
from pipelines.suite_rule import compare, load_rows
from pipelines.suite_scenes import SPLITS, Scene, draw, load

FILLERS = ("te-pt-tnp", "linear", "kriging")
#: Rule name -> (fillers it blends, whether sigma is rescaled per bin).
RULES = {
    "check-np": (("te-pt-tnp",), False),
    "check-np-scaled": (("te-pt-tnp",), True),
    "blend-lin": (("te-pt-tnp", "linear"), True),
    "blend-kr": (("te-pt-tnp", "kriging"), True),
    "blend-lin-kr": (("te-pt-tnp", "linear", "kriging"), True),
    "blend-lin-kr-unscaled": (("te-pt-tnp", "linear", "kriging"), False),
}
CACHE = REPO / "runs" / "self_check"


def fill_scene(scene: Scene, fit_steps: int = FitOptions().steps, seed: int = 0) -> dict[str, np.ndarray]:
    """Steps 1-2 of the module docstring for one scene: the arrays the rules need."""
    ds, variable, under = load(scene)
    da = ds[variable].compute()
    valid = static_valid_area(ds, da, None, scene.name)
    masked, hidden = hide_under_mask(da, valid, under, scene.name)
    values = masked.values
    ok = np.broadcast_to(valid.values, values.shape)
    checked = check_cells(np.isfinite(values) & ok, ~np.isfinite(values) & ok, np.random.default_rng([seed, 7919]))
    check_values = np.where(checked, np.nan, values)
    cubes = {"real": ds.assign({variable: masked}), "check": ds.assign({variable: masked.copy(data=check_values)})}
    means, stds = {}, {}
    start = time.perf_counter()
    p_check = plan(cubes["check"], variable, "te-pt-tnp", valid_mask=valid, seed=seed, fit_steps=fit_steps)
    prepare(p_check, None, None)
    p_real = plan(cubes["real"], variable, "te-pt-tnp", valid_mask=valid, seed=seed, fit_steps=0)
    p_real.choice.model = p_check.choice.model
    use_network_nugget(p_real.fields, p_check.nugget_network)
    for key, p in (("check", p_check), ("real", p_real)):
        out = fill_in_memory(p, cubes[key], renamed_from(cubes[key]), key)
        means[key, "te-pt-tnp"], stds[key, "te-pt-tnp"] = out[variable].values, out[f"{variable}_std"].values
    wall = {"te-pt-tnp": time.perf_counter() - start}
    for model in FILLERS[1:]:
        start = time.perf_counter()
        for key, cube in cubes.items():
            out = infill(cube, variable, model, valid_mask=valid, seed=seed, fit_steps=0)
            means[key, model], stds[key, model] = out[variable].values, out[f"{variable}_std"].values
        wall[model] = time.perf_counter() - start
    d_check = distance_to_context(masked.copy(data=check_values), valid)
    d_real = distance_to_context(masked, valid)
    hide = hidden.values
    arrays = {"shape": np.array(values.shape), "index": np.flatnonzero(hide), "truth": da.values[hide],
              "distance": d_real[hide], "check_truth": values[checked], "check_distance": d_check[checked],
              "wall": np.array([wall[m] for m in FILLERS])}
    for key, where in (("real", hide), ("check", checked)):
        prefix = "" if key == "real" else "check_"
        arrays[prefix + "means"] = np.stack([means[key, m][where] for m in FILLERS])
        arrays[prefix + "stds"] = np.stack([stds[key, m][where] for m in FILLERS])
    return arrays


def rule_row(scene: Scene, a: dict[str, np.ndarray], label: str, commit: str) -> dict:
    """A suite-format row of rule ``label`` (``RULE@FIT_STEPS``) on one scene's cached arrays."""
    names, rescale = RULES[label.partition("@")[0]]
    k = [FILLERS.index(n) for n in names]
    blend = fit_blend(a["check_truth"], a["check_distance"], a["check_means"][k], a["check_stds"][k], names)
    if not rescale:
        blend = type(blend)(blend.fillers, blend.weights, np.ones_like(blend.scales), blend.cells, blend.bins)
    mean, std = apply_blend(blend, a["distance"], a["means"][k], a["stds"][k])
    cells = {"shape": tuple(a["shape"]), "index": a["index"], "truth": a["truth"], "distance": a["distance"]}
    err = mean - a["truth"]
    return {"scene": scene.name, "product": scene.product, "model": label,
            "rmse": float(np.sqrt(np.nanmean(err**2))), "wall_s": float(a["wall"][k].sum()), "commit": commit,
            "blend": blend.describe(), "blocks": block_stats(cells, mean, std)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=SPLITS, required=True)
    parser.add_argument("--scenes", nargs="*", default=None)
    parser.add_argument("--fit-steps", type=int, default=FitOptions().steps, help="te-pt-tnp's fine-tuning steps")
    parser.add_argument("--score", action="store_true", help="only score the cached fills")
    args = parser.parse_args()
    scenes = [s for s in draw(args.split) if not args.scenes or s.name in args.scenes]
    folder = CACHE / f"{args.split}@{args.fit_steps}"
    folder.mkdir(parents=True, exist_ok=True)
    for scene in scenes:
        path = folder / f"{scene.name.replace('#', '_')}.npz"
        if args.score or path.exists():
            continue
        arrays = fill_scene(scene, args.fit_steps)
        np.savez_compressed(path, **arrays)
        print(f"{scene.name}: {arrays['truth'].size} hidden, {arrays['check_truth'].size} checked cells, "
              f"{arrays['wall'].round(0).tolist()} s", flush=True)
    commit = git_commit()
    rows = []
    for scene in scenes:
        path = folder / f"{scene.name.replace('#', '_')}.npz"
        if path.exists():
            a = dict(np.load(path))
            rows += [rule_row(scene, a, f"{rule}@{args.fit_steps}", commit) for rule in RULES]
    suite = [r for r in load_rows(args.split) if r["model"] in ("te-pt-tnp", "linear", "kriging")]
    lines = ["| rule | fillers | sigma | against te-pt-tnp |", "|---|---|---|---|"]
    for rule, (names, rescale) in RULES.items():
        verdict = compare(rows + suite, f"{rule}@{args.fit_steps}", "te-pt-tnp")
        sigma = "scaled per bin" if rescale else "as blended"
        lines.append(f"| {rule}@{args.fit_steps} | {', '.join(names)} | {sigma} | "
                     + verdict.text().replace("\n  ", "; ").replace("\n", " ") + " |")
        print(verdict.text(), flush=True)
    out = REPO / "pipelines" / "results" / f"self_check_{args.split}_fit{args.fit_steps}.md"
    text = header(f"Self-checked blends on the suite ({args.split} split)", torch.device("cpu"),
                  f"te-pt-tnp prepared on the checked cube ({args.fit_steps} fit steps, the nugget check); "
                  "fills cached under runs/self_check")
    out.write_text(text + "\n" + "\n".join(lines) + "\n\n" + "\n".join(
        f"- {r['scene']} {r['model']}: {r['blend']}" for r in rows if r["model"].startswith("blend-lin-kr@")) + "\n")
    suite_table.write(out.with_suffix(".json"), text, args.split, [], rows)
    print(out.read_text())


if __name__ == "__main__":
    main()
