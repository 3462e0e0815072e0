"""The scene suite's decision rule: a change is adopted only when noise cannot explain its gain.

    python -m pipelines.suite_rule --split validation --candidate LABEL --baseline te-pt-tnp
    python -m pipelines.suite_rule --split validation --candidate LABEL --record "what LABEL is"

Two levels of noise, both by resampling with replacement (percentile 95% intervals):

- **Within a scene**, over blocks of hidden cells (``block`` x ``block`` cells of their step,
  ``pipelines/suite.yaml``): neighbouring errors are correlated, so cells are not independent
  draws but blocks nearly are. Both rows of a comparison scored the same hidden cells, so the
  blocks are resampled in pairs. A scene is *worse beyond its noise* when the whole interval of
  its ratio (candidate over baseline) lies above 1.
- **Across scenes**, for the suite: the geometric mean over scenes of the per-scene ratio, its
  interval from resampling scenes (paired: each draw takes both rows of the drawn scenes).

**Adopt** when the suite intervals of the RMSE ratio and of the CRPS ratio both lie below 1 and
no scene is worse beyond its noise in RMSE or CRPS. ``--record`` appends the verdict to
``pipelines/results/suite_decisions.md`` (every variant measured, adopted or not).

**Fine-tuning's own randomness** is a third noise: te-pt-tnp fine-tunes on windows drawn at random,
so a rerun with another seed moves each scene's score although nothing changed, and the block
bootstrap alone calls such moves real (the seed-1 rerun of the shipped row against itself: see
``suite_decisions.md``). ``--replicate LABEL`` names reruns of the baseline with other seeds (same
cells, same settings); per scene and metric the spread of their log scores with the baseline's
(``sqrt(2)`` x its standard deviation: both rows of a comparison carry it) widens that scene's
interval, drawn as a normal term added to each bootstrap draw of the log ratio. A scene without a
replicate keeps the block interval.

**Cost cuts** (``--cut``: the same model doing less work, issue 54: accuracy "unchanged or
better") cannot win, so they pass a test of equivalence instead: adopted when both suite intervals'
upper ends lie below ``1 + CUT_MARGIN`` (a loss of more than 1% excluded at 95%) and no scene is
worse beyond its noise, seeds included. The margin is a third of what fine-tuning itself gains in
CRPS on the suite (``te-pt-tnp@0`` against ``te-pt-tnp``: x1.0331). A cut must also keep the
intervals calibrated: the mean over scenes of ``|cov90 - 0.90|`` (each scene's 90% coverage) may not
rise beyond its noise (the lower end of its 95% interval over scenes, seeds included, above 0);
CRPS can stay level while sigma narrows. Cuts are judged against the last row adopted at full cost
(``--baseline``), not the previous cut, so small losses cannot compound: fine-tuning on 2 windows a
step against 4 (``b2``) stays within 1% of the shipped row, but its calibration error against the
batch-8 row it cuts from is +0.020 [0.008, 0.033].

A row of ``pipelines/results/suite_<split>.json`` carries ``blocks``: per (block, distance bin)
the hidden cells ``n`` scored, the sum of squared errors ``sse``, the sum of CRPS ``crps`` and the
cells inside the central 90% interval ``in90`` (written by ``pipelines.benchmarks.suite``; on disk
each scene's layout is stored once, ``pipelines.suite_table`` reads the rows back whole).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipelines import suite_table

N_BOOT = 2000  # draws per interval: the 2.5% / 97.5% percentiles move by well under 0.1% between seeds
COVERAGE_RANGE = (0.85, 0.95)
MIN_BIN_CELLS = 30  # a distance bin with fewer hidden cells is reported, never judged
#: Ratios within this of 1 are ties: block sums are stored to 6 significant digits, so two rows with
#: the same predictions can differ by a few parts in a million.
TIE = 1e-5
CUT_MARGIN = 0.01  # --cut: the largest suite-level loss a cost cut may not exclude (module docstring)


def block_sums(row: dict, bins: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Per block, the row's sums over its hidden cells (in ``bins`` only, when given).

    Returns ``{"block": ids [nb], "n", "sse", "crps", "in90": [nb]}``, blocks in increasing id order."""
    b = row["blocks"]
    keep = np.ones(len(b["block"]), bool) if bins is None else np.isin(b["bin"], list(bins))
    ids, where = np.unique(np.asarray(b["block"])[keep], return_inverse=True)
    out = {"block": ids}
    for key in ("n", "sse", "crps", "in90"):
        out[key] = np.bincount(where, weights=np.asarray(b[key], float)[keep], minlength=ids.size)
    return out


def _paired(a: dict, b: dict) -> tuple[dict, dict]:
    """The two rows' block sums on the union of their blocks (a block one row left unscored counts 0 there)."""
    ids = np.union1d(a["block"], b["block"])
    def spread(s):
        out = {"block": ids}
        pos = np.searchsorted(ids, s["block"])
        for key in ("n", "sse", "crps", "in90"):
            out[key] = np.zeros(ids.size)
            out[key][pos] = s[key]
        return out
    return spread(a), spread(b)


def _weights(n_blocks: int, rng: np.random.Generator, n_boot: int = N_BOOT) -> np.ndarray:
    """``[n_boot, n_blocks]`` resampling counts (each draw takes ``n_blocks`` blocks with replacement)."""
    return rng.multinomial(n_blocks, np.full(n_blocks, 1.0 / n_blocks), size=n_boot).astype(float)


def score(sums: dict, metric: str, w: np.ndarray | None = None) -> np.ndarray | float:
    """RMSE, CRPS (mean per cell) or 90% coverage from block sums, optionally under resampling weights ``w``."""
    total = (lambda k: w @ sums[k]) if w is not None else (lambda k: sums[k].sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        if metric == "rmse":
            return np.sqrt(total("sse") / total("n"))
        if metric == "crps":
            return total("crps") / total("n")
        if metric == "cov90":
            return total("in90") / total("n")
    raise ValueError(f"unknown metric {metric!r}; rmse, crps or cov90")


def ratio_interval(cand: dict, base: dict, metric: str, bins: Sequence[int] | None = None,
                   seed: int = 0, seed_sd: float = 0.0) -> tuple[float, float, float]:
    """``(ratio, low, high)``: candidate over baseline on one scene, its 95% interval over paired blocks,
    widened by fine-tuning's randomness when ``seed_sd`` (the standard deviation of the log ratio it
    alone gives, :func:`seed_spread`) is above 0."""
    a, b = _paired(block_sums(cand, bins), block_sums(base, bins))
    if a["n"].sum() == 0 or b["n"].sum() == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    w = _weights(a["block"].size, rng)
    draws = score(a, metric, w) / score(b, metric, w)
    if seed_sd > 0:
        draws = draws * np.exp(rng.normal(0.0, seed_sd, draws.size))
    low, high = np.nanpercentile(draws, [2.5, 97.5])
    return float(score(a, metric) / score(b, metric)), float(low), float(high)


def coverage_interval(row: dict, bins: Sequence[int] | None = None, seed: int = 0) -> tuple[float, float, float, int]:
    """``(coverage, low, high, cells)`` of the 90% interval on one scene (a bin), 95% interval over blocks."""
    s = block_sums(row, bins)
    n = int(s["n"].sum())
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    draws = score(s, "cov90", _weights(s["block"].size, np.random.default_rng(seed)))
    low, high = np.nanpercentile(draws, [2.5, 97.5])
    return float(score(s, "cov90")), float(low), float(high), n


def seed_spread(base: dict, replicates: Sequence[dict], value: str | Callable[[dict], float]) -> float:
    """The standard deviation of a difference that fine-tuning's seeds alone give on one scene: ``sqrt(2)``
    x the standard deviation of ``value`` over ``base`` and its reruns with other seeds (0 without a
    rerun). ``value``: a metric name (its log score: the difference is a log ratio) or a function of
    a row. ``sqrt(2)``: candidate and baseline each carry their own draw."""
    if not replicates:
        return 0.0
    of = value if callable(value) else (lambda row: math.log(score(block_sums(row), value)))
    return float(np.sqrt(2 * np.var([of(r) for r in (base, *replicates)], ddof=1)))


def geometric_interval(ratios: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """``(geometric mean, low, high)`` of per-scene ratios, 95% interval from resampling scenes."""
    logs = np.log(np.asarray(ratios, float))
    if logs.size == 0:
        return math.nan, math.nan, math.nan
    w = _weights(logs.size, np.random.default_rng(seed))
    draws = np.exp(w @ logs / logs.size)
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(np.exp(logs.mean())), float(low), float(high)


@dataclass
class Comparison:
    """A candidate row against a baseline row on every scene both scored.

    ``scenes``: ``{scene: {"rmse": (ratio, low, high), "crps": (...)}}``; ``suite``: ``{"rmse":
    (geometric mean, low, high), "crps": (...)}``; ``worse``: scenes whose RMSE or CRPS interval
    lies above 1; ``adopt``: the rule's verdict."""

    candidate: str
    baseline: str
    scenes: dict[str, dict[str, tuple[float, float, float]]]
    suite: dict[str, tuple[float, float, float]]
    worse: list[str]
    commits: str = ""  # the commits the candidate's rows were measured at
    replicates: tuple[str, ...] = ()  # reruns of the baseline whose spread widened the scenes' intervals
    cut: bool = False  # judged as a cost cut (equivalence within CUT_MARGIN), not as a gain
    # The candidate's mean |cov90 - 0.90| over scenes less the baseline's (difference, low, high).
    calibration: tuple[float, float, float] = (math.nan, math.nan, math.nan)

    @property
    def calibration_worse(self) -> bool:
        """Whether the candidate's 90% intervals are further from 0.90 coverage beyond noise."""
        return bool(self.calibration[1] > 0)

    @property
    def adopt(self) -> bool:
        limit = 1 + CUT_MARGIN if self.cut else 1 - TIE
        accurate = all(self.suite[m][2] < limit for m in ("rmse", "crps")) and not self.worse
        return bool(self.scenes) and accurate and not (self.cut and self.calibration_worse)

    def text(self) -> str:
        """The verdict, the suite intervals and the scenes worse beyond noise, in a few lines."""
        def fmt(t):
            return f"{t[0]:.4f} [{t[1]:.4f}, {t[2]:.4f}]"
        noise = f", seeds from {', '.join(self.replicates)}" if self.replicates else ""
        lines = [f"{self.candidate} against {self.baseline} on {len(self.scenes)} scenes"
                 f"{' as a cost cut' if self.cut else ''}{noise}: {'ADOPT' if self.adopt else 'reject'}",
                 f"  geometric-mean RMSE ratio {fmt(self.suite['rmse'])}, CRPS ratio {fmt(self.suite['crps'])}",
                 f"  scenes worse beyond their noise: {', '.join(self.worse) or 'none'}",
                 f"  mean |cov90 - 0.90| change {self.calibration[0]:+.4f} [{self.calibration[1]:+.4f}, "
                 f"{self.calibration[2]:+.4f}]{' (worse beyond noise)' if self.calibration_worse else ''}"]
        return "\n".join(lines)


def rows_by_scene(rows: Iterable[dict], label: str) -> dict[str, dict]:
    """``{scene: row}`` of the rows whose model label is ``label``."""
    return {r["scene"]: r for r in rows if r["model"] == label}


def compare(rows: Sequence[dict], candidate: str, baseline: str, scenes: Sequence[str] | None = None,
            replicates: Sequence[str] = (), cut: bool = False) -> Comparison:
    """Apply the rule (module docstring) to ``candidate`` against ``baseline`` over the scenes both scored;
    ``replicates``: labels of the baseline's reruns with other seeds; ``cut``: judge a cost cut."""
    a, b = rows_by_scene(rows, candidate), rows_by_scene(rows, baseline)
    reps = [rows_by_scene(rows, label) for label in replicates]
    names = [s for s in (scenes or a) if s in a and s in b]
    per = {s: {m: ratio_interval(a[s], b[s], m, seed_sd=seed_spread(b[s], [r[s] for r in reps if s in r], m))
               for m in ("rmse", "crps")} for s in names}
    suite = {m: geometric_interval([per[s][m][0] for s in names]) for m in ("rmse", "crps")}
    worse = [s for s in names if any(per[s][m][1] > 1 + TIE for m in ("rmse", "crps"))]
    commits = ", ".join(sorted({str(a[s].get("commit", "unrecorded")) for s in names}))
    calibration = calibration_interval([a[s] for s in names], [b[s] for s in names],
                                       [[r[s] for r in reps if s in r] for s in names])
    return Comparison(candidate, baseline, per, suite, worse, commits, tuple(replicates), cut, calibration)


def calibration_interval(cand: Sequence[dict], base: Sequence[dict], replicates: Sequence[Sequence[dict]],
                         seed: int = 0) -> tuple[float, float, float]:
    """``(difference, low, high)``: the mean over scenes of ``|cov90 - 0.90|``, candidate less baseline
    (one row of each per scene, in the same order), its 95% interval from resampling scenes; each
    scene's baseline reruns (``replicates``, a list per scene) add ``sqrt(2)`` x the spread of their
    calibration errors as a normal term (:func:`seed_spread`), as for the scores."""
    def error(row: dict) -> float:
        return abs(score(block_sums(row), "cov90") - 0.90)

    if not cand:
        return math.nan, math.nan, math.nan
    diff = np.array([error(c) - error(b) for c, b in zip(cand, base)])
    spread = np.array([seed_spread(b, reps, error) for b, reps in zip(base, replicates)])
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, diff.size, (N_BOOT, diff.size))
    draws = (diff[pick] + rng.normal(0.0, 1.0, pick.shape) * spread[pick]).mean(1)
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(diff.mean()), float(low), float(high)


def load_rows(split: str, path: Path | None = None) -> list[dict]:
    """The rows of ``pipelines/results/suite_<split>.json`` (or ``path``)."""
    from pipelines.provenance import REPO

    path = path or REPO / "pipelines" / "results" / f"suite_{split}.json"
    if not path.exists():
        raise SystemExit(f"{path}: no suite table yet; run python -m pipelines.benchmarks.suite --split {split}")
    return suite_table.read(path)["rows"]


def record(comparison: Comparison, split: str, what: str, out: Path) -> None:
    """Append one line for ``comparison`` to the decisions table ``out`` (created with its header)."""
    import datetime as dt

    if not out.exists():
        out.write_text("# Suite decisions: every variant measured against the shipped row\n\n"
                       "The rule (`pipelines/suite_rule.py`): adopt when the paired bootstrap 95% intervals (over "
                       "scenes) of the geometric-mean RMSE and CRPS ratios both lie below 1 and no scene is worse "
                       "beyond its own noise (block bootstrap; with `--replicate`, also the spread of the "
                       "baseline's reruns with other seeds). A cost cut (`--cut`) is adopted when a loss above 1% is "
                       "excluded on both suite ratios, no scene is worse beyond its noise and the scenes' mean "
                       "distance of 90% coverage from 0.90 does not rise beyond noise. Ratios are candidate / "
                       "baseline.\n\n"
                       "| date | measured at | split | candidate | baseline | what | scenes | RMSE ratio [95%] | "
                       "CRPS ratio [95%] | scenes worse | verdict |\n|---|---|---|---|---|---|---:|---|---|---|---|\n")
    c = comparison
    fmt = lambda t: f"{t[0]:.4f} [{t[1]:.4f}, {t[2]:.4f}]"  # noqa: E731
    calibration = " (calibration worse: mean abs(cov90 - 0.90) {:+.3f} [{:+.3f}, {:+.3f}])".format(*c.calibration)
    line = (f"| {dt.date.today().isoformat()} | {c.commits} | {split} | `{c.candidate}` | `{c.baseline}` | {what} | "
            f"{len(c.scenes)} | {fmt(c.suite['rmse'])} | {fmt(c.suite['crps'])} | {', '.join(c.worse) or '–'} | "
            f"{('adopt' if c.adopt else 'reject') + (' (cost cut)' if c.cut else '')}"
            f"{calibration if c.cut and c.calibration_worse else ''}"
            f"{' (seeds: ' + ', '.join(c.replicates) + ')' if c.replicates else ''} |\n")
    with out.open("a") as f:
        f.write(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=["validation", "test"], default="validation")
    parser.add_argument("--candidate", required=True, help="the row label to judge")
    parser.add_argument("--baseline", default="te-pt-tnp", help="the row it must beat (default: the shipped row)")
    parser.add_argument("--record", metavar="WHAT", help="append the verdict to pipelines/results/suite_decisions.md")
    parser.add_argument("--table", type=Path, default=None, help="another suite JSON than the split's")
    parser.add_argument("--replicate", action="append", default=[], metavar="LABEL",
                        help="a rerun of the baseline with another seed: its spread widens each scene's interval")
    parser.add_argument("--cut", action="store_true",
                        help=f"judge a cost cut: adopted when a loss above {100 * CUT_MARGIN:g}%% is excluded "
                             "and calibration is no worse (module docstring)")
    args = parser.parse_args()
    comparison = compare(load_rows(args.split, args.table), args.candidate, args.baseline,
                         replicates=args.replicate, cut=args.cut)
    if not comparison.scenes:
        raise SystemExit(f"no scene has both {args.candidate!r} and {args.baseline!r} rows")
    print(comparison.text())
    for scene, r in comparison.scenes.items():
        print(f"  {scene:26} RMSE {r['rmse'][0]:.3f} [{r['rmse'][1]:.3f}, {r['rmse'][2]:.3f}]  "
              f"CRPS {r['crps'][0]:.3f} [{r['crps'][1]:.3f}, {r['crps'][2]:.3f}]")
    if args.record:
        from pipelines.provenance import REPO

        record(comparison, args.split, args.record, REPO / "pipelines" / "results" / "suite_decisions.md")


if __name__ == "__main__":
    main()
