"""Do coherent samples (geonp.fill.samples) say more than independent per-cell draws? (issue 55)

    python -m pipelines.experiments.samples_check --split validation --models kriging te-pt-tnp
    python -m pipelines.experiments.samples_check --split validation --scenes olci_chl#0 --samples 32

Each scene of the suite (``pipelines.suite_scenes``) is hidden and filled as the suite does
(``geonp.evaluate``, the model's defaults); its target step is then sampled ``--samples`` times by
conditional simulation of the errors (:func:`geonp.fill.samples.draw_samples`), and ``--samples``
independent per-cell draws are taken from the same mean and sigma. Both are scored at the hidden
cells by :func:`geonp.sample_scores.sample_scores`: energy score, variogram score, 90% coverage of
the means of each contiguous hidden patch and of each 8 x 8 block (groups of 2 cells or more);
and the samples' per-cell spread over the fill's sigma (median). Writes
``pipelines/results/samples_check_<split>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import xarray as xr

from geonp.device import resolve_device
from geonp.evaluate import evaluate
from geonp.fill.engine import infill
from geonp.fill.samples import draw_samples
from geonp.sample_scores import independent_draws, sample_scores
from pipelines.provenance import REPO, git_commit, header
from pipelines.suite_scenes import SPLITS, draw, load

FIGURES = ("energy", "variogram", "patch_cov90", "block_cov90")


def check_scene(ds: xr.Dataset, variable: str, under: np.ndarray, model: str, n: int, seed: int) -> dict:
    """Fill one scene as the suite does, sample its target step both ways and score both."""
    kept: dict = {}

    def keeping(masked: xr.Dataset, var: str, name: str, **options) -> xr.Dataset:
        kept["masked"], kept["out"] = masked[var], infill(masked, var, name, **options)
        return kept["out"]

    evaluate(ds, variable, [model], seed=seed, options={"device": "auto"}, hide_under=under, infill_fn=keeping)
    step = int(np.flatnonzero(under.reshape(under.shape[0], -1).any(1))[0])
    values = np.asarray(kept["masked"].values[step], np.float64)
    truth = np.asarray(ds[variable].values[step], np.float64)
    mean = np.asarray(kept["out"][variable].values[step], np.float64)
    std = np.asarray(kept["out"][f"{variable}_std"].values[step], np.float64)
    gaps = ~np.isfinite(values) & np.isfinite(mean) & np.isfinite(std)
    hidden = gaps & np.isfinite(truth) & under[step]
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    coherent = draw_samples(values, mean, std, gaps, n, rng)
    wall = time.perf_counter() - started
    row = {"hidden_cells": int(hidden.sum()), "sample_s": round(wall, 2),
           "spread_ratio": float(np.median(coherent[:, gaps].std(0, ddof=1) / std[gaps]))}
    for label, draws in (("coherent", coherent), ("independent", independent_draws(mean, std, n, rng))):
        row[label] = sample_scores(truth, draws, hidden, np.random.default_rng(seed))
    return row


def write(path: Path, text: str, rows: list[dict], n: int) -> None:
    """The table: one line per scene and model, coherent | independent for each figure."""
    lines = [text, "", f"{n} samples per scene; each figure coherent | independent per-cell draws "
             "(energy and variogram scores: lower is better; block-mean 90% coverage: 0.90).", "",
             "| scene | model | hidden | energy | variogram | patch cov90 (patches) | 8x8 block cov90 (blocks) "
             "| spread / sigma | sampling s |", "|---|---|---:|---|---|---|---|---:|---:|"]
    for r in rows:
        c, i = r["coherent"], r["independent"]
        lines.append(f"| {r['scene']} | {r['model']} | {r['hidden_cells']} | {c['energy']:.4g} \\| {i['energy']:.4g} "
                     f"| {c['variogram']:.4g} \\| {i['variogram']:.4g} "
                     f"| {c['patch_cov90']:.2f} \\| {i['patch_cov90']:.2f} ({c['patches']}) "
                     f"| {c['block_cov90']:.2f} \\| {i['block_cov90']:.2f} ({c['blocks']}) "
                     f"| {r['spread_ratio']:.3f} | {r['sample_s']:.1f} |")
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        better = {f: sum(r["coherent"][f] < r["independent"][f] for r in mine) for f in ("energy", "variogram")}
        cov = {f: [np.nanmean([r[k][f] for r in mine]) for k in ("coherent", "independent")]
               for f in ("patch_cov90", "block_cov90")}
        lines.append(f"\n- {model}: coherent samples score better on {better['energy']} / {len(mine)} scenes by "
                     f"energy score, {better['variogram']} / {len(mine)} by variogram score; mean block-mean "
                     f"coverage, patches {cov['patch_cov90'][0]:.2f} against {cov['patch_cov90'][1]:.2f}, "
                     f"8x8 blocks {cov['block_cov90'][0]:.2f} against {cov['block_cov90'][1]:.2f}")
    path.write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps({"header": text, "rows": rows}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=SPLITS, default="validation")
    parser.add_argument("--models", nargs="*", default=["kriging", "te-pt-tnp"])
    parser.add_argument("--scenes", nargs="*", default=None)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    scenes = [s for s in draw(args.split) if not args.scenes or s.name in args.scenes]
    if args.scenes and len(scenes) != len(set(args.scenes)):
        parser.error(f"--scenes: not all in the {args.split} split")
    out = REPO / "pipelines" / "results" / f"samples_check_{args.split}.md"
    text = header(f"Coherent samples against independent draws ({args.split} split)", resolve_device("auto"),
                  f"{args.samples} samples; each model with its defaults, as the suite fills")
    rows = []
    for scene in scenes:
        ds, variable, under = load(scene)
        for model in args.models:
            row = {"scene": scene.name, "model": model, "commit": git_commit(),
                   **check_scene(ds, variable, under, model, args.samples, args.seed)}
            rows.append(row)
            print(f"{scene.name} {model}: " + ", ".join(f"{f} {row['coherent'][f]:.4g}|{row['independent'][f]:.4g}"
                                                       for f in FIGURES), flush=True)
        write(out, text, rows, args.samples)
    print(out.read_text())


if __name__ == "__main__":
    main()
