"""The scene suite's markdown: the issue's goals with their noise, then the scenes and every row's scores.

:func:`report` is what ``pipelines.benchmarks.suite`` writes under its provenance header; the
noise comes from ``pipelines.suite_rule`` (blocks within a scene, scenes within the suite).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from geonp.metrics import WIDE_DISTANCE_BINS
from pipelines.suite_rule import (
    COVERAGE_RANGE,
    MIN_BIN_CELLS,
    TIE,
    coverage_interval,
    geometric_interval,
    ratio_interval,
    rows_by_scene,
)

BASELINES = ("linear", "kriging", "dineof")
BIN_LABELS = [label for label, _ in WIDE_DISTANCE_BINS]
DENSE_MEDIAN = 3.0  # a single-date scene whose hidden cells lie at a median <= 3 cells from an observation is dense


def models(rows: Sequence[dict]) -> list[str]:
    """Row labels, baselines first, then the rest in the order first seen."""
    seen = list(dict.fromkeys(r["model"] for r in rows))
    return [m for m in BASELINES if m in seen] + [m for m in seen if m not in BASELINES]


def _best_other(by: dict[str, dict[str, dict]], scene: str) -> dict | None:
    """The better (by RMSE) of kriging and dineof on a scene, where either was scored."""
    rows = [by[m][scene] for m in ("kriging", "dineof") if scene in by.get(m, {})]
    return min(rows, key=lambda r: r["rmse"], default=None)


def _fmt(t: tuple[float, float, float]) -> str:
    return "–" if not math.isfinite(t[0]) else f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"


def goals(scenes: Sequence[dict], rows: Sequence[dict]) -> str:
    """One line per candidate row (not a baseline): the issue's goals on this split, with 95% intervals."""
    by = {m: rows_by_scene(rows, m) for m in models(rows)}
    lines = ["| row | scenes | RMSE / linear | RMSE / best of kriging, dineof | CRPS / best of kriging, dineof | "
             "scenes with CRPS below both | scenes worse than linear (RMSE, beyond noise) | bins worse than linear "
             "(beyond noise) | bins with 90% coverage in 0.85-0.95 | bins out of it beyond noise | wall s / kriging |",
             "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for m in models(rows):
        if m in BASELINES:
            continue
        names = [s["scene"] for s in scenes if s["scene"] in by[m] and s["scene"] in by.get("linear", {})]
        others = {s: _best_other(by, s) for s in names}
        lin = [ratio_interval(by[m][s], by["linear"][s], "rmse")[0] for s in names]
        vs = [s for s in names if others[s] is not None]
        rmse_o = [by[m][s]["rmse"] / others[s]["rmse"] for s in vs]
        crps_o = [by[m][s]["crps"] / others[s]["crps"] for s in vs]
        below = sum(all(by[m][s]["crps"] < by[k][s]["crps"] for k in ("kriging", "dineof") if s in by.get(k, {}))
                    for s in vs)
        worse = sum(ratio_interval(by[m][s], by["linear"][s], "rmse")[1] > 1 + TIE for s in names)
        judged = worse_bins = in_range = out_noise = 0
        for s in names:
            for i in range(len(BIN_LABELS)):
                cov, low, high, n = coverage_interval(by[m][s], [i])
                if n < MIN_BIN_CELLS:
                    continue
                judged += 1
                worse_bins += ratio_interval(by[m][s], by["linear"][s], "rmse", [i])[1] > 1 + TIE
                in_range += COVERAGE_RANGE[0] <= cov <= COVERAGE_RANGE[1]
                out_noise += high < COVERAGE_RANGE[0] or low > COVERAGE_RANGE[1]
        kw = [by[m][s]["wall_s"] / by["kriging"][s]["wall_s"] for s in names if s in by.get("kriging", {})]
        lines.append(f"| {m} | {len(names)} | {_fmt(geometric_interval(lin))} | {_fmt(geometric_interval(rmse_o))} | "
                     f"{_fmt(geometric_interval(crps_o))} | {below} / {len(vs)} | {worse} | {worse_bins} / {judged} | "
                     f"{in_range} / {judged} | {out_noise} | "
                     f"{math.exp(sum(map(math.log, kw)) / len(kw)) if kw else math.nan:.1f} |")
    dense = [s["scene"] for s in scenes if s["kind"] == "single" and s["median_distance"] <= DENSE_MEDIAN]
    kriging_worse = [s for s in dense if s in by.get("kriging", {}) and s in by.get("linear", {})
                     and ratio_interval(by["kriging"][s], by["linear"][s], "rmse")[1] > 1 + TIE]
    kriging_above = [s for s in dense if s in by.get("kriging", {}) and s in by.get("linear", {})
                     and by["kriging"][s]["rmse"] > by["linear"][s]["rmse"]]
    return ("Goals (issue 53), each with its 95% interval: geometric-mean RMSE <= 0.85x linear's and <= 0.92x the "
            "better of kriging and dineof; CRPS below both on every scene; no scene and no distance bin worse than "
            "linear beyond noise; 90% coverage 0.85-0.95 in every bin (bins of at least "
            f"{MIN_BIN_CELLS} hidden cells are judged). Ratios are per scene, then a geometric mean over scenes; "
            "intervals resample scenes (suite) or blocks of cells (a scene, a bin).\n\n" + "\n".join(lines) +
            f"\n\nKriging on the {len(dense)} dense single-date scenes (median hidden cell at most "
            f"{DENSE_MEDIAN:g} cells from an observation): RMSE above linear's on {len(kriging_above)}"
            f"{' (' + ', '.join(kriging_above) + ')' if kriging_above else ''}, beyond noise on {len(kriging_worse)}"
            f"{' (' + ', '.join(kriging_worse) + ')' if kriging_worse else ''}.\n")


def _table(title: str, scenes: Sequence[dict], rows: Sequence[dict], key: str, lower_better: bool = True) -> str:
    labels = models(rows)
    by = {m: rows_by_scene(rows, m) for m in labels}
    out = [f"### {title}", "", "| scene | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for s in scenes:
        values = {m: by[m][s["scene"]][key] for m in labels if s["scene"] in by[m]}
        best = (min if lower_better else max)(values.values(), default=None) if key in ("rmse", "crps") else None
        cells = [("–" if m not in values else (f"**{values[m]:.4g}**" if values[m] == best else f"{values[m]:.4g}"))
                 for m in labels]
        out.append(f"| {s['scene']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def by_distance(scenes: Sequence[dict], rows: Sequence[dict], model: str) -> str:
    """``model``'s RMSE over linear's per scene and distance bin (``*``: worse beyond noise), and its 90% coverage."""
    by = {m: rows_by_scene(rows, m) for m in (model, "linear")}
    head = "| scene | " + " | ".join(BIN_LABELS) + " |"
    rule = "|---|" + "---:|" * len(BIN_LABELS)
    ratio, cover = [head, rule], [head, rule]
    for s in scenes:
        name = s["scene"]
        if name not in by[model] or name not in by["linear"]:
            continue
        rcells, ccells = [], []
        for i in range(len(BIN_LABELS)):
            cov, low, high, n = coverage_interval(by[model][name], [i])
            if n == 0:
                rcells.append("–")
                ccells.append("–")
                continue
            r, rlow, _ = ratio_interval(by[model][name], by["linear"][name], "rmse", [i])
            judged = n >= MIN_BIN_CELLS
            rcells.append(f"{r:.2f}{'*' if judged and rlow > 1 + TIE else ''}" + ("" if judged else " (few)"))
            out = judged and (high < COVERAGE_RANGE[0] or low > COVERAGE_RANGE[1])
            ccells.append(f"{cov:.2f}{'*' if out else ''}" + ("" if judged else " (few)"))
        ratio.append(f"| {name} | " + " | ".join(rcells) + " |")
        cover.append(f"| {name} | " + " | ".join(ccells) + " |")
    return (f"### {model}: RMSE / linear's by distance to the nearest observation (cells)\n\n`*`: worse beyond "
            f"noise (the bin's block-bootstrap interval above 1); (few): under {MIN_BIN_CELLS} hidden cells.\n\n"
            + "\n".join(ratio) + f"\n\n### {model}: 90% coverage by distance\n\n`*`: out of 0.85-0.95 beyond noise.\n\n"
            + "\n".join(cover) + "\n")


def report(scenes: Sequence[dict], rows: Sequence[dict], split: str) -> str:
    """The whole markdown body of ``suite_<split>.md``."""
    lines = ["| scene | product | kind | trained on / tuned on | hidden cells | beyond 12 cells | median distance | "
             "what |", "|---|---|---|---|---:|---:|---:|---|"]
    for s in scenes:
        flags = " / ".join(w for w, on in (("trained", s["in_training"]), ("tuned", s["tuned"])) if on) or "–"
        lines.append(f"| {s['scene']} | {s['product']} | {s['kind']} | {flags} | {s['hidden_cells']} | "
                     f"{s['beyond_12']:.0%} | {s['median_distance']:.1f} | {s['what']} |")
    products = sorted({s["product"] for s in scenes})
    parts = [goals(scenes, rows),
             f"## Scenes ({split}: {len(scenes)} scenes of {len(products)} fields)\n\n" + "\n".join(lines) + "\n",
             "## Scores\n", _table("RMSE", scenes, rows, "rmse"), _table("CRPS", scenes, rows, "crps"),
             _table("90% coverage", scenes, rows, "cov90"), _table("Wall time (s)", scenes, rows, "wall_s")]
    parts += [by_distance(scenes, rows, m) for m in models(rows) if m not in BASELINES]
    return "\n".join(parts)
