"""The scene suite: every filler on scenes no one tuned to, with the noise of each figure.

    python -m pipelines.benchmarks.suite --split validation                    # default rows
    python -m pipelines.benchmarks.suite --split test --rows linear kriging
    python -m pipelines.benchmarks.suite --split validation --reuse --rows te-pt-tnp@0
    python -m pipelines.benchmarks.suite --split validation --reuse --rows small-10500 \\
        --checkpoint small-10500=pipelines/weights/te-pt-tnp-small-10500-spread.safetensors
    python -m pipelines.benchmarks.suite --split validation --reuse --rows head --fit 'head={"scope": "head"}'

The scenes are drawn by the rule in ``pipelines/suite.yaml`` (``pipelines.suite_scenes``): 48
scenes of 23 fields from the shared data, satellite products under their own real gaps and
gap-free fields under other products' real clouds, single-date and multi-date, small and wide
clouds. ``validation`` is where variants are chosen; ``test`` holds products out whole and is
reported once per adopted change. Each scene's target step has its observed cells hidden under
the drawn mask; every row fills the same cells (``geonp.evaluate``), scored by RMSE, CRPS and
90% coverage, by distance to the nearest observed cell (``WIDE_DISTANCE_BINS``), and per block
of cells so that ``pipelines.suite_rule`` can say what is noise.

A row is ``MODEL[~sSEED][@FIT_STEPS]``: ``te-pt-tnp`` without ``@`` fills with geonp's defaults, as a
user's ``geonp infill`` does; ``dineof`` scores the multi-date scenes only; ``~sN`` fills with seed
``N`` instead of ``--seed`` (fine-tuning's random windows; the hidden cells are the scene's), so
``te-pt-tnp~s1`` is a rerun of the shipped row that ``pipelines.suite_rule --replicate`` takes as
the noise of fine-tuning itself. ``LABEL[@FIT]`` with
``--checkpoint LABEL=PATH`` scores te-pt-tnp with other weights, ``--variant LABEL=JSON`` the
bundled te-pt-tnp changed at inference (``pipelines.checkpoint_variants.bundled_variants``),
``--fit LABEL=JSON`` the bundled te-pt-tnp fine-tuned with other :class:`~geonp.fill.options.FitOptions`
(e.g. ``head='{"scope": "head"}'``), ``--options LABEL=JSON`` the bundled te-pt-tnp with other
:class:`~geonp.fill.options.FillOptions` fields (e.g. ``calsig='{"calibrate_sigma": true}'``).
Writes ``pipelines/results/suite_<split>.md`` and ``.json`` (``{"header", "split", "scenes",
"rows"}``; a row: ``scene, product, model, rmse, crps, cov90, rmse_by_distance, wall_s``, ...).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
from pathlib import Path

import numpy as np
import torch

from geonp.device import resolve_device
from geonp.evaluate import evaluate
from geonp.fill.options import FillOptions, FitOptions
from geonp.metrics import WIDE_DISTANCE_BINS, crps_normal, distance_bin
from pipelines import suite_table
from pipelines.checkpoint_variants import bundled_variants
from pipelines.provenance import REPO, git_commit, header
from pipelines.suite_report import report
from pipelines.suite_scenes import SPEC, SPLITS, Scene, draw, load

ROWS = ["linear", "kriging", "dineof", "te-pt-tnp"]
BINS = WIDE_DISTANCE_BINS
BUDGET = ("bundled weights unless a row names others; `te-pt-tnp` fills with geonp's defaults (fine-tuned "
          f"{FitOptions().steps} steps on the scene, the nugget check), `@N` with N fit steps; a row's commit is "
          "the run that produced it (`--reuse` keeps earlier rows of scenes drawn the same)")


def scene_record(scene: Scene, res: dict) -> dict:
    """What the table says of a scene: where it comes from and what was hidden."""
    entry = SPEC["products"][scene.product]
    far = sum(n for (label, _), n in zip(BINS, res["hidden_by_distance"].values()) if label in ("13-25", ">25"))
    return {"scene": scene.name, "product": scene.product, "split": scene.split, "kind": scene.kind,
            "what": scene.describe(), "in_training": bool(entry.get("in_training", False)),
            "tuned": bool(entry.get("tuned", False)), "observed_cells": res["observed_cells"],
            "hidden_cells": res["hidden_cells"], "hidden_by_distance": res["hidden_by_distance"],
            "beyond_12": far / res["hidden_cells"],
            "median_distance": float(np.median(res["cells"]["distance"]))}


def block_side(shape: tuple[int, ...], most: int = SPEC["block"]) -> int:
    """Cells a side of a scene's noise blocks: ``most``, or on a small scene a sixth of its shorter side
    (at least 2), so every scene has at least 16 blocks to resample, never a single one."""
    return int(min(most, max(2, min(shape[-2:]) // 4)))


def block_stats(cells: dict, mean: np.ndarray, std: np.ndarray, block: int | None = None) -> dict[str, list]:
    """Per (block, distance bin): hidden cells scored, sums of squared error and CRPS, cells inside 90%.

    ``cells`` is ``evaluate``'s (``keep_cells``): the hidden cells of a ``(time, rows, cols)`` field;
    ``block``: cells a side of a block (default :func:`block_side` of the field)."""
    block = block or block_side(tuple(cells["shape"]))
    _, n_rows, n_cols = cells["shape"]
    t, r, c = np.unravel_index(cells["index"], cells["shape"])
    per_row = math.ceil(n_cols / block)
    blocks = (t * math.ceil(n_rows / block) + r // block) * per_row + c // block
    truth = cells["truth"].astype(float)
    ok = np.isfinite(truth) & np.isfinite(mean) & np.isfinite(std) & (std > 0)
    err = (mean - truth)[ok]
    key = blocks[ok] * len(BINS) + distance_bin(cells["distance"][ok], BINS)
    ids, where = np.unique(key, return_inverse=True)
    sums = {"n": np.bincount(where, minlength=ids.size),
            "sse": np.bincount(where, err**2, ids.size),
            "crps": np.bincount(where, crps_normal(truth[ok], mean[ok], std[ok]), ids.size),
            "in90": np.bincount(where, np.abs(err) <= 1.6448536269514722 * std[ok], ids.size)}
    out = {"block": (ids // len(BINS)).tolist(), "bin": (ids % len(BINS)).tolist(), "n": sums["n"].tolist()}
    out.update({k: [suite_table.rounded(v) for v in sums[k]] for k in ("sse", "crps")})
    out["in90"] = [int(v) for v in sums["in90"]]
    return out


def score_row(scene: Scene, res: dict, r: dict, label: str, commit: str) -> dict:
    """A results row: the issue's fields first, then the diagnostics and the block sums."""
    return {"scene": scene.name, "product": scene.product, "model": label, "rmse": r["rmse"], "crps": r["crps"],
            "cov90": r["coverage_90"], "mae": r["mae"], "nll": r["nll"],
            "rmse_by_distance": {k: _finite(v["rmse"]) for k, v in r["rmse_by_distance"].items()},
            "n_by_distance": {k: v["n"] for k, v in r["rmse_by_distance"].items()},
            "cov90_by_distance": {k: _finite(v) for k, v in r["coverage_90_by_distance"].items()},
            "wall_s": r["wall_s"], "fit_steps": r["fit_steps"],
            "commit": commit, **{key: r[key] for key in ("nugget", "history_used") if key in r},
            **({"samples": r["samples"]} if "samples" in r else {}),
            "blocks": block_stats(res["cells"], r["mean"], r["std"])}


def _finite(value: float) -> float | None:
    """JSON has no NaN: an empty bin's figure is null."""
    return value if math.isfinite(value) else None


#: A row label: ``LABEL[~sSEED][@FIT_STEPS]`` (module docstring).
ROW = re.compile(r"(?P<name>(?P<label>[^@~]+)(?:~s(?P<seed>\d+))?)(?:@(?P<fit>\d+))?")


def run(scenes: list[Scene], rows: list[str], trained: dict[str, str], seed: int,
        earlier: dict, fits: dict[str, FitOptions] | None = None,
        samples: int = 0, fills: dict[str, dict] | None = None,
        cells_dir: Path | None = None) -> tuple[list[dict], list[dict], list[str]]:
    """Score ``rows`` on ``scenes``; returns (scene records, rows, notes of rows not scored).
    ``trained``: row label -> te-pt-tnp weights; ``fits``: row label -> the bundled te-pt-tnp's fine-tuning;
    ``samples``: coherent samples per fill, scored as a whole (each row's ``samples``); ``fills``: row
    label -> other fill options of the bundled te-pt-tnp (``geonp.infill`` keywords); ``cells_dir``: also
    keep each scene's hidden cells and every row's predictions there (:func:`save_cells`)."""
    fits, fills = fits or {}, fills or {}
    commit = git_commit()
    records, out, notes = [], [], []
    for scene in scenes:
        ds, variable, under = load(scene)
        record, kept = None, {}
        for row in rows:
            name, label, rerun, fit = ROW.fullmatch(row).group("name", "label", "seed", "fit")
            if label == "dineof" and scene.kind == "single":
                continue  # DINEOF needs a history
            model, checkpoints = ("te-pt-tnp", {"te-pt-tnp": trained[label]}) if label in trained else (label, None)
            options = {"device": "auto"}
            if label in fits:
                model, options["fit"] = "te-pt-tnp", fits[label]
            if label in fills:
                model = "te-pt-tnp"
                options.update(fills[label])
            steps = int(fit) if fit else (options.get("fit", FitOptions()).steps if model == "te-pt-tnp" else 0)
            try:
                res = evaluate(ds, variable, [model], checkpoints=checkpoints, fit_steps=steps,
                               seed=int(rerun) if rerun else seed,
                               options=options, hide_under=under, distance_bins=BINS, keep_cells=True,
                               samples=samples)
            except ValueError as err:
                notes.append(f"{scene.name} {row}: {err}")
                print(f"{scene.name} {row}: not scored: {err}", flush=True)
                continue
            record = record or scene_record(scene, res)
            out.append(score_row(scene, res, res["rows"][0], row if fit else name, commit))
            r = out[-1]
            kept[r["model"]] = res
            print(f"{scene.name} {r['model']}: RMSE {r['rmse']:.4g} CRPS {r['crps']:.4g} cov90 {r['cov90']:.3f} "
                  f"({r['wall_s']:.0f} s)", flush=True)
        if record is not None:
            old = earlier.get("scenes", {}).get(scene.name)
            if old is not None and (old["what"], old["hidden_cells"]) != (record["what"], record["hidden_cells"]):
                raise SystemExit(f"{scene.name}: drawn differently from the earlier table ({old['what']}); "
                                 "rerun every row without --reuse")
            records.append(record)
            if cells_dir is not None:
                save_cells(cells_dir / f"{scene.name.replace('#', '_')}.npz", kept)
    return records, out, notes


def save_cells(path: Path, results: dict[str, dict]) -> None:
    """One scene's hidden cells and each row's predictions at them, for analyses that need the cells
    (:mod:`pipelines.suite_overlap`): ``truth``, ``distance`` (cells to the nearest context cell),
    ``index`` (flat, into ``shape``) and per row label ``L``: ``L:mean``, ``L:std`` (``[n_hidden]``)."""
    first = next(iter(results.values()))["cells"]
    arrays = {"truth": first["truth"], "distance": first["distance"], "index": first["index"],
              "shape": np.asarray(first["shape"])}
    for label, res in results.items():
        arrays[f"{label}:mean"], arrays[f"{label}:std"] = res["rows"][0]["mean"], res["rows"][0]["std"]
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def fit_rows(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, FitOptions]:
    """``--fit LABEL=JSON`` items as fine-tuning options per row label (a bad one: the parser's error)."""
    fits = {}
    for item in items:
        label, _, text = item.partition("=")
        try:
            fits[label] = FitOptions(**json.loads(text))
        except (ValueError, TypeError) as err:
            parser.error(f"--fit {item!r}: {err}")
    return fits


#: Fill options a row sets elsewhere: its fit steps (``LABEL@FIT``), ``--fit``, ``--seed``, ``--samples``.
ROW_SET = {"fit_steps": "LABEL@FIT", "fit": "--fit LABEL=JSON", "seed": "--seed", "samples": "--samples",
           "device": "nothing (the suite fills on the best device)"}


def fill_rows(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, dict]:
    """``--options LABEL=JSON`` items as fill options per row label, checked by
    :meth:`FillOptions.from_keywords` (a bad one, or one the row sets another way: the parser's error)."""
    fills = {}
    for item in items:
        label, _, text = item.partition("=")
        try:
            fills[label] = json.loads(text)
            elsewhere = sorted(set(fills[label]) & set(ROW_SET))
            if elsewhere:
                raise ValueError(f"{elsewhere[0]} is set with {ROW_SET[elsewhere[0]]}")
            FillOptions.from_keywords(**fills[label])
        except (ValueError, TypeError) as err:
            parser.error(f"--options {item!r}: {err}")
    return fills


def merge(split: str, records: list[dict], rows: list[dict], earlier: dict) -> tuple[list[dict], list[dict]]:
    """This run's scenes and rows, and the earlier table's rows of (scene, model) not rerun, in draw order."""
    order = {s.name: i for i, s in enumerate(draw(split))}
    by_scene = {**earlier.get("scenes", {}), **{r["scene"]: r for r in records}}
    ran = {(r["scene"], r["model"]) for r in rows}
    kept = rows + [r for r in earlier.get("rows", []) if (r["scene"], r["model"]) not in ran]
    scenes = sorted(by_scene.values(), key=lambda s: order.get(s["scene"], len(order)))
    kept.sort(key=lambda r: (order.get(r["scene"], len(order)), r["model"]))
    return scenes, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=SPLITS, required=True)
    parser.add_argument("--rows", nargs="*", default=ROWS)
    parser.add_argument("--scenes", nargs="*", default=None, help="scene names (default: the whole split)")
    parser.add_argument("--checkpoint", action="append", default=[], metavar="LABEL=PATH",
                        help="a row LABEL[@FIT] scores te-pt-tnp with these weights")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=JSON",
                        help="a row LABEL[@FIT] scores the bundled te-pt-tnp changed at inference only")
    parser.add_argument("--fit", action="append", default=[], metavar="LABEL=JSON",
                        help="a row LABEL[@FIT] scores the bundled te-pt-tnp fine-tuned with these FitOptions fields")
    parser.add_argument("--options", action="append", default=[], metavar="LABEL=JSON",
                        help="a row LABEL[@FIT] scores the bundled te-pt-tnp with these fill options (geonp.infill's)")
    parser.add_argument("--samples", type=int, default=0, metavar="N",
                        help="also draw N coherent samples per fill and score them as a whole (issue 55)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse", action="store_true", help="keep the earlier table's rows not run now")
    parser.add_argument("--out", default=None)
    parser.add_argument("--cells", default=None, metavar="DIR",
                        help="also keep each scene's hidden cells and the rows' predictions in DIR/SCENE.npz")
    args = parser.parse_args()
    bad = [row for row in args.rows if not ROW.fullmatch(row)]
    if bad:
        parser.error(f"--rows {bad[0]!r}: a row is LABEL[~sSEED][@FIT_STEPS]")
    out = Path(args.out or REPO / "pipelines" / "results" / f"suite_{args.split}.md")
    earlier = {}
    if args.reuse and out.with_suffix(".json").exists():
        old = suite_table.read(out.with_suffix(".json"))
        earlier = {"scenes": {s["scene"]: s for s in old["scenes"]}, "rows": old["rows"]}
    scenes = draw(args.split)
    if args.scenes:
        unknown = set(args.scenes) - {s.name for s in scenes}
        if unknown:
            parser.error(f"--scenes: not in the {args.split} split: {', '.join(sorted(unknown))}")
        scenes = [s for s in scenes if s.name in args.scenes]
    trained = dict(item.split("=", 1) for item in args.checkpoint)
    text = header(f"Scene suite ({args.split} split)", resolve_device("auto"), BUDGET)  # the commit the run starts at
    with tempfile.TemporaryDirectory() as tmp:
        trained.update(bundled_variants(args.variant, Path(tmp)))
        records, rows, notes = run(scenes, args.rows, trained, args.seed, earlier, fit_rows(parser, args.fit),
                                   args.samples, fill_rows(parser, args.options),
                                   Path(args.cells) if args.cells else None)
    scene_list, rows = merge(args.split, records, rows, earlier)
    body = report(scene_list, rows, args.split) + "".join(f"\n- not scored: {n}" for n in notes)
    out.write_text(text + "\n" + body + "\n")
    suite_table.write(out.with_suffix(".json"), text, args.split, scene_list, rows)
    print(out.read_text())


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
