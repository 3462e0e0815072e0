"""Do coherent samples (geonp.fill.samples) say more than independent per-cell draws? (issue 55)

    python -m pipelines.experiments.samples_check --split validation --models kriging te-pt-tnp
    python -m pipelines.experiments.samples_check --split validation --scenes olci_chl#0 --samples 32
    python -m pipelines.experiments.samples_check --split validation --models kriging \
        --variants scene no-nugget range2 --out pipelines/results/samples_variants_validation

Each scene of the suite (``pipelines.suite_scenes``) is hidden and filled as the suite does
(``geonp.evaluate``, the model's defaults) with ``--samples`` coherent samples (conditional
simulation of the errors, :mod:`geonp.fill.samples`), and as many independent per-cell draws are
taken from the same mean and sigma. Both are scored at the hidden cells
(:func:`geonp.sample_scores.cube_sample_scores`): energy score, variogram score, 90% coverage of
the means of each contiguous hidden patch and of each 8 x 8 block (groups of 2 cells or more);
and the samples' per-cell spread over the fill's sigma (median). Writes
``pipelines/results/samples_check_<split>.md`` and ``.json``.

``--variants`` draws the samples of one fill with other rules for the errors' correlation
(:data:`VARIANTS`; ``scene`` is geonp's, the scene's own variogram; ``head`` and ``head-window``
te-pt-tnp's kriging head's, :mod:`pipelines.experiments.head_samples`), one row each, and
``oracle-sigma`` is a diagnostic that knows the truth (:func:`oracle_sigma`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from geonp.device import resolve_device
from geonp.evaluate import evaluate
from geonp.fill.output import FLAG_INFILLED
from geonp.fill.samples import CorrelationFit, scene_correlation, with_samples
from pipelines.experiments.head_samples import (
    HEAD_ATTR,
    WINDOWS_ATTR,
    head_correlation,
    head_lines,
    head_sampler,
    head_window_spread,
    head_windows,
    recording_head_covariance,
    window_sampler,
)
from pipelines.experiments.sequential_samples import sequential_samples
from pipelines.provenance import REPO, git_commit, header, rows_json
from pipelines.suite_rule import geometric_interval, load_rows
from pipelines.suite_scenes import SPLITS, draw, load

FIGURES = ("energy", "variogram", "patch_cov90", "block_cov90")


def _no_nugget(values: np.ndarray) -> tuple[float, float]:
    return scene_correlation(values)[0], 0.0


def _scaled_range(factor: float) -> CorrelationFit:
    """The scene's variogram with its range multiplied by ``factor`` (longer above 1, shorter below)."""
    def fit(values: np.ndarray) -> tuple[float, float]:
        range_cells, nugget_share = scene_correlation(values)
        return factor * range_cells, nugget_share
    return fit


#: ``(fill, masked data, variable, model, n, seed, infill keywords)`` -> the fill with ``n`` samples.
Sampler = Callable[[xr.Dataset, xr.Dataset, str, str, int, int, dict[str, Any]], xr.Dataset]


def _by_correlation(fit: CorrelationFit, other_seed: int = 0) -> Sampler:
    """geonp's conditional simulation with the errors' correlation from ``fit``; ``other_seed`` > 0
    draws the samples from another seed (a replicate: how far a scene's scores move by chance)."""
    def sample(fill: xr.Dataset, data: xr.Dataset, name: str, model: str, n: int, seed: int,
               kwargs: dict[str, Any]) -> xr.Dataset:
        return with_samples(fill, [name], n, seed + 7919 * other_seed, fit)
    return sample


#: Samplers by name. Rules for the errors' correlation (``geonp.fill.samples.draw_samples``'
#: ``correlation_fit``): the scene's variogram as fitted (geonp's), without its nugget (the fill's
#: sigma already holds the noise; the errors are the smooth part's), and with twice its range
#: (errors of a fill vary more slowly than the field), and 1.5, 3 or 4 times, or half of it (the
#: kriging head's range over a fill's windows spans x0.5 to x1.8 of the median window's); the model's own
#: sequential sampling, coarse to fine (:mod:`pipelines.experiments.sequential_samples`);
#: te-pt-tnp's kriging head's own covariance over the fill (``head``) and each window's own, conditioned
#: across windows (``head-window``; both :mod:`pipelines.experiments.head_samples`);
#: and geonp's rule drawn from other seeds (``scene~s1``, ``scene~s2``: the scores' own noise per scene).
VARIANTS: dict[str, Sampler] = {
    "scene": _by_correlation(scene_correlation), "no-nugget": _by_correlation(_no_nugget),
    **{f"range{m:g}": _by_correlation(_scaled_range(m)) for m in (0.5, 1.5, 2, 3, 4)},
    "sequential": sequential_samples,
    **{f"scene~s{k}": _by_correlation(scene_correlation, k) for k in (1, 2)},
    "head": head_sampler, "head-window": window_sampler,
}
#: A diagnostic beside the samplers, one that needs the truth (:func:`oracle_sigma`).
ORACLE = "oracle-sigma"


def oracle_sigma(truth: xr.DataArray, scales: dict[str, float]) -> Sampler:
    """Not a sampler a user could run, a diagnostic: geonp's rule with the fill's sigma scaled, per
    scene, by the factor that makes the hidden cells' 90% intervals cover 0.90 of their ``truth``
    (the input before hiding, shaped as the fill), ``q90(|truth - mean| / sigma) / 1.645``, kept in
    ``scales`` under the variable. Block-mean coverage then shows what the errors' correlation
    leaves once the fill's per-cell calibration is made right; the scores of the fill itself (RMSE,
    CRPS), the independent draws and the samples' spread / sigma are against the fill's own, unscaled
    sigma (so the row's spread / sigma is about the scale)."""
    def sample(fill: xr.Dataset, data: xr.Dataset, name: str, model: str, n: int, seed: int,
               kwargs: dict[str, Any]) -> xr.Dataset:
        mean, std, flag = (fill[v].values for v in (name, f"{name}_std", f"{name}_flag"))
        if set(truth.dims) != set(fill[name].dims) or truth.transpose(*fill[name].dims).shape != mean.shape:
            raise ValueError(f"--variants {ORACLE}: the truth {dict(truth.sizes)} is not shaped as the fill "
                             f"{dict(fill[name].sizes)}")
        known = truth.transpose(*fill[name].dims).values
        hidden = (flag == FLAG_INFILLED) & np.isfinite(known) & (std > 0)
        z = np.abs(known[hidden] - mean[hidden]) / std[hidden]
        scales[name] = float(np.quantile(z, 0.9) / 1.6449) if z.size else 1.0
        drawn = with_samples(fill.assign({f"{name}_std": fill[f"{name}_std"] * scales[name]}), [name], n, seed)
        return fill.assign({f"{name}_sample": drawn[f"{name}_sample"]})
    return sample


def check_scene(ds: xr.Dataset, variable: str, under: np.ndarray, model: str, n: int, seed: int,
                variants: list[str] | None = None) -> list[dict]:
    """Fill one scene as the suite does, with ``n`` samples, and score them both ways (``geonp.evaluate``);
    one row per sampler (:data:`VARIANTS`), all drawing from the one fill."""
    from geonp.fill.engine import infill

    fills: dict[str, xr.Dataset] = {}
    spread: dict[str, dict[str, float | int]] = {}  # the head's covariance over the fill's windows

    def fill_once(sampler: Sampler):
        def fill(data, name, model_name, samples=0, seed=0, **kwargs):
            if name not in fills:
                if {"head", "head-window"} & set(variants or []):
                    with recording_head_covariance() as record:
                        fills[name] = infill(data, name, model_name, seed=seed, **kwargs).compute()
                    fit = head_correlation(record)
                    if fit is not None:
                        fills[name].attrs[HEAD_ATTR] = fit
                        fills[name].attrs[WINDOWS_ATTR] = {"windows": head_windows(record), "axes": record["axes"]}
                        spread[name] = head_window_spread(record)
                else:
                    fills[name] = infill(data, name, model_name, seed=seed, **kwargs).compute()
            return sampler(fills[name], data, name, model_name, samples, seed, kwargs)
        return fill

    rows = []
    scales: dict[str, float] = {}
    for variant in variants or ["scene"]:
        sampler = oracle_sigma(ds[variable], scales) if variant == ORACLE else VARIANTS[variant]
        res = evaluate(ds, variable, [model], seed=seed, options={"device": "auto"}, hide_under=under, samples=n,
                       infill_fn=fill_once(sampler))
        row = res["rows"][0]
        rows.append({"variant": variant, "hidden_cells": res["hidden_cells"], "rmse": row["rmse"],
                     "crps": row["crps"], "wall_s": row["wall_s"], **row["samples"]})
        if variant in ("head", "head-window"):  # the correlation the head's samples used
            rows[-1]["range_cells"], rows[-1]["nugget_share"] = fills[variable].attrs[HEAD_ATTR]
            rows[-1].update(spread.get(variable, {}))
        if variant == ORACLE:
            rows[-1]["sigma_scale"] = scales[variable]
    return rows


def _label(r: dict) -> str:
    """A row's model, with its correlation rule when not geonp's."""
    return r["model"] if r.get("variant", "scene") == "scene" else f"{r['model']} ({r['variant']})"


def variant_lines(rows: list[dict]) -> list[str]:
    """Each variant against geonp's rule (``scene``), per model: the geometric mean over scenes of the
    energy and variogram score ratios with 95% intervals (scenes resampled), how far the mean
    block-mean coverages lie from 0.90 (the paired difference with its interval), and, where the
    table holds replicates of geonp's rule from other seeds (``scene~s1``...), the scenes on which
    the variant scores worse than geonp's rule by more than the replicates differ from it. A
    replicate is judged so against the other replicates (with two or more): the count that chance
    alone reaches, the yardstick for a variant's."""
    lines = []
    for model in sorted({r["model"] for r in rows}):
        by_variant: dict[str, dict[str, dict]] = {}
        for r in rows:
            if r["model"] == model:
                by_variant.setdefault(r.get("variant", "scene"), {})[r["scene"]] = r
        base = by_variant.get("scene", {})
        replicates = [(k, v) for k, v in by_variant.items() if k.startswith("scene~")]
        for variant, mine in sorted(by_variant.items()):
            both = sorted(set(mine) & set(base))
            if variant == "scene" or not both:
                continue
            parts = []
            for f in ("energy", "variogram"):
                g, low, high = geometric_interval([mine[s][f] / base[s][f] for s in both])
                parts.append(f"{f} x{g:.4f} [{low:.4f}, {high:.4f}]")
            for f in ("patch_cov90", "block_cov90"):
                diff = np.array([abs(mine[s][f] - 0.9) - abs(base[s][f] - 0.9) for s in both])
                diff = diff[np.isfinite(diff)]
                low, high = mean_interval(diff)
                parts.append(f"{f} mean |cov - 0.90| {diff.mean():+.3f} [{low:+.3f}, {high:+.3f}]")
            # A replicate is judged against the other replicates: how often chance alone is "worse".
            others = [rep for name, rep in replicates if name != variant]
            if others:
                worse = sorted(s for s in both if all(s in rep for rep in others) and any(
                    mine[s][f] - base[s][f] > max(abs(rep[s][f] - base[s][f]) for rep in others)
                    for f in ("energy", "variogram")))
                what = "by chance, " if variant.startswith("scene~") else ""
                parts.append(f"{what}worse beyond the seeds' spread on {len(worse)}: {', '.join(worse) or '-'}")
            lines.append(f"- {model} ({variant}) against {model} ({len(both)} scenes): " + "; ".join(parts))
    return lines


def mean_interval(values: np.ndarray, draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean of ``values`` over scenes, by resampling scenes."""
    if values.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, (draws, values.size))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def calibration_lines(rows: list[dict], split: str, threshold: float = 0.85) -> list[str]:
    """Block-mean coverage beside the fill's own per-cell 90% coverage, which the suite's table
    (``suite_<split>.json``, the same fills) holds: scenes whose fill covers at least ``threshold``
    per cell against the rest, and the correlation of the two over scenes."""
    table = REPO / "pipelines" / "results" / f"suite_{split}.json"
    if not table.exists():  # no suite run of this split yet: nothing to join
        return []
    cells = {(r["scene"], r["model"]): r["cov90"] for r in load_rows(split, table)}
    lines = []
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model and r.get("variant", "scene") == "scene"
                and (r["scene"], model) in cells and np.isfinite(r["block_cov90"])]
        if len(mine) < 3:
            continue
        cell = np.array([cells[r["scene"], model] for r in mine])
        block = np.array([r["block_cov90"] for r in mine])
        good = cell >= threshold
        rest = f"{block[~good].mean():.2f} on the other {(~good).sum()}" if (~good).any() else "no other"
        lines.append(f"- {model}: 8x8 block-mean coverage {block[good].mean():.2f} on the {good.sum()} scenes whose "
                     f"fill covers at least {threshold} of its cells (per-cell 90% coverage, suite table), "
                     f"{rest}; "
                     f"correlation of the two over scenes {np.corrcoef(cell, block)[0, 1]:.2f}")
    return lines


def write(path: Path, text: str, rows: list[dict], n: int, split: str | None = None) -> None:
    """The table: one line per scene and model, coherent | independent for each figure."""
    lines = [text, "", f"{n} samples per scene; each figure coherent / independent per-cell draws "
             "(energy and variogram scores: lower is better; block-mean 90% coverage: 0.90).", "",
             "| scene | model | hidden | energy | variogram | patch cov90 | 8x8 block cov90 "
             "| spread / sigma | fill and samples s |", "|---|---|---:|---|---|---|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['scene']} | {_label(r)} | {r['hidden_cells']} "
                     + " ".join(f"| {r[f]:.4g} / {r['independent_' + f]:.4g}" for f in FIGURES)
                     + f" | {r['spread_ratio']:.3f} | {r['wall_s']:.0f} |")
    for model in sorted({_label(r) for r in rows}):
        mine = [r for r in rows if _label(r) == model]
        better = {f: sum(r[f] < r["independent_" + f] for r in mine) for f in ("energy", "variogram")}
        cov = {f: [np.nanmean([r[k + f] for r in mine]) for k in ("", "independent_")]
               for f in ("patch_cov90", "block_cov90")}
        lines.append(f"\n- {model}: coherent samples score better on {better['energy']} / {len(mine)} scenes by "
                     f"energy score, {better['variogram']} / {len(mine)} by variogram score; mean block-mean "
                     f"coverage, patches {cov['patch_cov90'][0]:.2f} against {cov['patch_cov90'][1]:.2f}, "
                     f"8x8 blocks {cov['block_cov90'][0]:.2f} against {cov['block_cov90'][1]:.2f}; "
                     f"spread / sigma {np.nanmedian([r['spread_ratio'] for r in mine]):.2f} (median over scenes)")
    compared = variant_lines(rows)
    if compared:
        lines += ["", "Other rules for the errors' correlation against the scene's variogram (ratios: rule / scene's):",
                  "", *compared]
    spread = head_lines(rows)
    if spread:
        lines += ["", "How the kriging head's covariance varies between the windows of one fill:", "", *spread]
    limits = calibration_lines(rows, split) if split else []
    if limits:
        lines += ["", "What limits block-mean coverage: the fill's own per-cell calibration.", "", *limits]
    path.write_text("\n".join(lines) + "\n")
    # Six significant digits: the table prints four, and full float reprs were half the file.
    short = [{k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in r.items()} for r in rows]
    path.with_suffix(".json").write_text(rows_json({"header": text, "samples": n}, short))


def stored_samples(stored: dict) -> int:
    """The samples per scene of a stored table: its ``samples``, or in tables written before that was
    kept, the count its header's budget line names (``- budget: 64 samples; ...``)."""
    if "samples" in stored:
        return int(stored["samples"])
    budget = [line for line in stored["header"].splitlines() if line.startswith("- budget:")]
    if not budget:
        raise ValueError("--rewrite: the stored table names no sample count (no 'samples', no budget line)")
    return int(budget[0].split(":", 1)[1].split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=SPLITS, default="validation")
    parser.add_argument("--models", nargs="*", default=["kriging", "te-pt-tnp"])
    parser.add_argument("--scenes", nargs="*", default=None)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="*", default=["scene"], choices=[*VARIANTS, ORACLE],
                        help="rules for the errors' correlation, each drawn from the same fill (default: "
                        f"geonp's), or the {ORACLE} diagnostic")
    parser.add_argument("--out", type=Path, default=None,
                        help="results path without suffix (default: pipelines/results/samples_check_<split>)")
    parser.add_argument("--rewrite", action="store_true",
                        help="write the table again from its JSON (the summary only; nothing is filled)")
    args = parser.parse_args()
    out = (args.out or REPO / "pipelines" / "results" / f"samples_check_{args.split}").with_suffix(".md")
    if args.rewrite:
        if not out.with_suffix(".json").exists():
            parser.error(f"--rewrite: {out.with_suffix('.json')} not found")
        stored = json.loads(out.with_suffix(".json").read_text())  # the samples it was run with, not --samples
        write(out, stored["header"], stored["rows"], stored_samples(stored), args.split)
        print(out.read_text())
        return
    scenes = [s for s in draw(args.split) if not args.scenes or s.name in args.scenes]
    if args.scenes and len(scenes) != len(set(args.scenes)):
        parser.error(f"--scenes: not all in the {args.split} split")
    text = header(f"Coherent samples against independent draws ({args.split} split)", resolve_device("auto"),
                  f"{args.samples} samples; each model with its defaults, as the suite fills")
    rows = []
    for scene in scenes:
        ds, variable, under = load(scene)
        for model in args.models:
            for row in check_scene(ds, variable, under, model, args.samples, args.seed, args.variants):
                rows.append({"scene": scene.name, "model": model, "commit": git_commit(), **row})
                print(f"{scene.name} {model} {row['variant']}: " + ", ".join(
                    f"{f} {row[f]:.4g} / {row['independent_' + f]:.4g}" for f in FIGURES), flush=True)
        write(out, text, rows, args.samples, args.split)
    print(out.read_text())


if __name__ == "__main__":
    main()
