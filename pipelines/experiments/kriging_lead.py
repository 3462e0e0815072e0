"""Why does the whole-scene ``kriging`` baseline lead te-pt-tnp on OLCI chlorophyll? Four probes.

    python -m pipelines.experiments.kriging_lead                          # OLCI, validation split
    python -m pipelines.experiments.kriging_lead --scene alboran --split validation
    python -m pipelines.experiments.kriging_lead --probes variogram   # probe 4, its own table

te-pt-tnp's mean is its local kriging head's (:mod:`geonp.models.local_kriging`), whose covariance
(a lengthscale per input, a sill and a nugget) the network predicts per target; the baseline
(:mod:`geonp.models.field_kriging`) fits one variogram per scene. On the history benchmark's
(``pipelines.benchmarks.history_cv``) hidden cells of a scene (same stacks, steps and seed) this
compares:

1. *the covariances*: the variogram the baseline fits to each step (exponential, in grid cells;
   ``ell`` is the range over 3, the exponential kernel's lengthscale) against the head's predicted
   lengthscales (in cells: input units times the window's cells per unit), sill and nugget share
   over every target of the bundled te-pt-tnp's fill (10th, 50th, 90th percentiles);
2. *a nugget or longer lengthscales*: the same weights, the head's nugget raised to at least a
   share of its sill + nugget, or its lengthscales multiplied, at inference only (no weight
   changed; the decoder sees the head's new log variance too, so sigma moves with it);
3. *log space*: ``linear``, ``kriging`` and te-pt-tnp filling ``log(y)`` and returning the
   lognormal's mean ``exp(mu + s^2 / 2)`` and s.d. ``mean sqrt(exp(s^2) - 1)``, as chlorophyll is
   often filled; scored in the field's own units like every other row;
4. *the scene's own variogram in the head*: each hidden step filled on its own, the head's nugget
   share and spatial lengthscales set to the variogram of probe 1 for that step (the network's
   time lengthscale and sill kept), or its time lengthscale made so short that only the target's
   own step counts (the history then enters through the drift alone), against ``kriging`` on the
   same step.

All at 0 fit steps (the bundled weights as they are). Writes
``pipelines/results/kriging_lead_<scene>_<split>.md`` (probes 1-3) or ``..._variogram.md`` (probe 4).
A diagnosis: what it finds is reported in
the history benchmark's page, nothing here is shipped.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import xarray as xr

from geonp.data.readers import data_folder
from geonp.evaluate import evaluate
from geonp.fill.engine import infill
from geonp.models import local_kriging
from geonp.variogram import step_variograms
from pipelines.benchmarks.history_cv import SCENES, split_steps
from pipelines.provenance import REPO, header

#: (nugget share floor, lengthscale factor) of probe 2; (0, 1) is the bundled head as it is.
HEAD_CHANGES = [(0.0, 1.0), (0.1, 1.0), (0.3, 1.0), (0.0, 2.0), (0.3, 2.0)]
BASELINES = ["linear", "kriging", "te-pt-tnp"]
#: A time lengthscale (steps) that leaves the other steps' neighbours uncorrelated with a target
#: (exponential kernel: exp(-20) a step away): the head krigs from the target's own step, as the
#: baseline does, the history entering only through the drift.
STEP_ALONE = 0.05
CELLS_PER_UNIT = 8.0  # the bundled windows' (geonp/weights/te-pt-tnp.safetensors: infill.window)


@contextmanager
def head_covariance(nugget_share: float = 0.0, lengthscale: float = 1.0, record: list | None = None,
                    set_share: float | None = None, set_space: float | None = None,
                    set_time: float | None = None) -> Iterator[None]:
    """While open, every local kriging head's predicted covariance is changed before use: the
    nugget at least ``nugget_share`` of sill + nugget, the lengthscales times ``lengthscale``;
    ``set_share`` (not None) sets the nugget to exactly that share, ``set_space`` every spatial
    lengthscale to that many input units, ``set_time`` the time lengthscale (the sill stays the network's);
    ``record`` (a list) gets each call's ``[targets, lengthscales..., sill, nugget]`` as used."""
    original = local_kriging.LocalKriging._targets

    def changed(head: local_kriging.LocalKriging, zt: torch.Tensor) -> torch.Tensor:
        p = head._modules["covariance"](zt).float().clamp(-12.0, 8.0)  # [B, Nt, Dx + 2], logs
        d = head.dim_x
        ell, sill, nugget = p[..., :d] + math.log(lengthscale), p[..., d], p[..., d + 1]
        if nugget_share > 0:  # n / (s + n) >= share  <=>  log n >= log s + log(share / (1 - share))
            nugget = torch.maximum(nugget, sill + math.log(nugget_share / (1 - nugget_share)))
        if set_share is not None:  # the floor keeps log n finite at a share of 0
            nugget = sill + math.log(max(set_share, 1e-6) / (1 - set_share))
        if set_space is not None:  # inputs are (time, space...): every column after the first
            ell = torch.cat([ell[..., :1], torch.full_like(ell[..., 1:], math.log(set_space))], -1)
        if set_time is not None:  # the first input is time
            ell = torch.cat([torch.full_like(ell[..., :1], math.log(set_time)), ell[..., 1:]], -1)
        out = torch.cat([ell, sill[..., None], nugget[..., None]], -1)
        if record is not None:
            record.append(out.detach().reshape(-1, d + 2).exp().numpy())
        return out

    def targets(head, zt, *args, **kwargs):
        head.__dict__["covariance"] = lambda z: changed(head, z)  # shadows the submodule for this call
        try:
            return original(head, zt, *args, **kwargs)
        finally:
            del head.__dict__["covariance"]

    local_kriging.LocalKriging._targets = targets
    try:
        yield
    finally:
        local_kriging.LocalKriging._targets = original


def log_space_infill(ds: xr.Dataset, variable: str, model: str, **options) -> xr.Dataset:
    """``infill`` of ``log(ds[variable])`` (values <= 0 become gaps), back to the field's units as
    the lognormal's mean and s.d."""
    logged = ds.assign({variable: np.log(ds[variable].where(ds[variable] > 0))})
    out = infill(logged, variable, model, **options)
    mu, s = out[variable], out[f"{variable}_std"]
    mean = np.exp(mu + s**2 / 2)
    return out.assign({variable: mean, f"{variable}_std": mean * np.sqrt(np.expm1(s**2))})


def scene_variograms(values: np.ndarray) -> dict[int, tuple[int, float, float, float]]:
    """Per step of ``values [T, R, C]`` with enough observed cells: ``(observed cells, s.d.,
    lengthscale in cells, nugget share)`` of the exponential variogram the baseline would fit (on
    the whole step, hidden cells included: the scene's structure, not the baseline's exact fit)."""
    found = {}
    for t, fit in enumerate(step_variograms(values)):
        if fit is not None:
            n, scale, (psill, rng, nugget) = fit
            found[t] = (n, scale, rng / 3, nugget / (psill + nugget))
    return found


def pooled(results: list[dict]) -> dict:
    """One row from per-step scores of the same model: RMSE by pooled squared error, CRPS and
    coverage weighted by hidden cells, per distance bin alike."""
    n = np.array([r["n"] for r in results], float)

    def rmse(values: list[float], weights: np.ndarray) -> float:
        return float(np.sqrt(np.sum(weights * np.square(values)) / weights.sum()))

    bins = results[0]["rmse_by_distance"]
    return {"rmse": rmse([r["rmse"] for r in results], n),
            "crps": float(np.sum(n * [r["crps"] for r in results]) / n.sum()),
            "coverage_90": float(np.sum(n * [r["coverage_90"] for r in results]) / n.sum()),
            "rmse_by_distance": {b: {"rmse": rmse([r["rmse_by_distance"][b]["rmse"] for r in results],
                                                  np.array([r["rmse_by_distance"][b]["n"] for r in results], float))}
                                 for b in bins}}


def row(label: str, r: dict) -> str:
    far = " / ".join(f"{v['rmse']:.4g}" for v in r["rmse_by_distance"].values())
    return f"| {label} | {r['rmse']:.4g} | {r['crps']:.4g} | {r['coverage_90']:.3f} | {far} |"


def variogram_probe(ds: xr.Dataset, variable: str, steps: list[int],
                    variograms: dict[int, tuple[int, float, float, float]], seed: int) -> tuple[list[str], str]:
    """Probe 4: each of ``steps`` hidden and filled on its own, the head's nugget share and spatial
    lengthscales set to that step's variogram (what a geostatistician fits per scene), against
    ``kriging``; one table row per setting, scores pooled over the steps, and the distance bins."""
    settings = {"kriging": None, "te-pt-tnp, the head as it is": {},
                "te-pt-tnp, the step's nugget share": {"share": True},
                "te-pt-tnp, the step's lengthscale": {"space": True},
                "te-pt-tnp, both": {"share": True, "space": True},
                "te-pt-tnp, the step alone": {"alone": True},
                "te-pt-tnp, the step alone, its nugget share": {"alone": True, "share": True}}
    lines = []
    for label, setting in settings.items():
        per_step = []
        for t in steps:
            _, _, ell, share = variograms[t]
            if setting is None:
                per_step.append(evaluate(ds, variable, ["kriging"], seed=seed, hide_steps=[t])["rows"][0])
                continue
            with head_covariance(set_share=share if setting.get("share") else None,
                                 set_space=ell / CELLS_PER_UNIT if setting.get("space") else None,
                                 set_time=STEP_ALONE if setting.get("alone") else None):
                res = evaluate(ds, variable, ["te-pt-tnp"], seed=seed, hide_steps=[t], options={"device": "cpu"})
            per_step.append(res["rows"][0])
        scores = pooled(per_step)
        lines.append(row(label, scores))
        print(lines[-1], flush=True)
    return lines, " / ".join(scores["rmse_by_distance"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scene", default="olci", choices=list(SCENES))
    parser.add_argument("--split", default="validation", choices=["validation", "test"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probes", default="head", choices=["head", "variogram"],
                        help="head: probes 1-3; variogram: probe 4 (its own table, ..._variogram.md)")
    args = parser.parse_args()
    variable, opener, by_place = SCENES[args.scene]
    ds = opener(data_folder(), args.split)
    steps = list(range(ds.sizes["time"])) if by_place else split_steps(ds.sizes["time"], args.split)
    variograms = scene_variograms(ds[variable].values)
    variogram_table = ["## 1. The scene's variograms (exponential, the baseline's fit on each whole step)", "",
                       "| step | observed cells | s.d. | lengthscale (cells) | nugget share |",
                       "|---:|---:|---:|---:|---:|",
                       *[f"| {t} | {n} | {sd:.4g} | {ell:.1f} | {share:.2f} |"
                         for t, (n, sd, ell, share) in variograms.items()], ""]
    budget = "bundled te-pt-tnp weights and history drift, 0 fit steps; inference-only changes"
    results = REPO / "pipelines" / "results"
    if args.probes == "variogram":
        fitted = [t for t in steps if t in variograms]
        lines, bins = variogram_probe(ds, variable, fitted, variograms, args.seed)
        title = f"The scene's variogram in the head: {args.scene}, {args.split} split"
        text = "\n".join([
            header(title, torch.device("cpu"), budget),
            "", *variogram_table,
            f"## 2. The head's covariance from the step's own variogram (steps {fitted}, each hidden and filled alone, "
            "scores pooled over them)", "",
            f"| fill | RMSE | CRPS | cov90 | RMSE by distance ({bins} cells) |", "|---|---:|---:|---:|---|",
            *lines, ""])
        (results / f"kriging_lead_{args.scene}_{args.split}_variogram.md").write_text(text)
        print(text)
        return

    def score(model: str, **kwargs) -> dict:
        res = evaluate(ds, variable, [model], seed=args.seed, hide_steps=steps, options={"device": "cpu"}, **kwargs)
        print(f"{args.scene} {model}: RMSE {res['rows'][0]['rmse']:.4g}", flush=True)
        return res

    used: list[np.ndarray] = []
    with head_covariance(record=used):
        plain = score("te-pt-tnp")
    p = np.concatenate(used)
    q = np.percentile(p, [10, 50, 90], axis=0)  # [3, Dx + 2]
    dims = ["time (steps)"] + [f"space {i} (cells)" for i in range(1, p.shape[1] - 2)]
    unit = [1.0] + [CELLS_PER_UNIT] * (len(dims) - 1)  # time in steps, space in cells
    head = [f"| lengthscale, {name} | " + " / ".join(f"{v * unit[i]:.3g}" for v in q[:, i]) + " |"
            for i, name in enumerate(dims)]
    share = np.percentile(p[:, -1] / (p[:, -1] + p[:, -2]), [10, 50, 90])
    head.append("| nugget share | " + " / ".join(f"{v:.3g}" for v in share) + " |")

    bins = " / ".join(plain["hidden_by_distance"])
    probe2 = []
    for nugget_share, factor in HEAD_CHANGES:
        if (nugget_share, factor) == (0.0, 1.0):
            r = plain["rows"][0]
        else:
            with head_covariance(nugget_share, factor):
                r = score("te-pt-tnp")["rows"][0]
        probe2.append(row(f"nugget >= {nugget_share:g}, lengthscales x{factor:g}", r))
    probe3 = []
    for model in BASELINES:
        base = plain["rows"][0] if model == "te-pt-tnp" else score(model)["rows"][0]
        probe3.append(row(f"{model}, the field", base))
        probe3.append(row(f"{model}, log space", score(model, infill_fn=log_space_infill)["rows"][0]))

    title = f"Why kriging leads: {args.scene}, {args.split} split ({plain['hidden_cells']} hidden cells)"
    cols = f"| fill | RMSE | CRPS | cov90 | RMSE by distance ({bins} cells) |\n|---|---:|---:|---:|---|"
    text = "\n".join([
        header(title, torch.device("cpu"), budget), "",
        *variogram_table,
        "## 2. The head's covariance over every target (10th / 50th / 90th percentile)", "",
        "| parameter | value |", "|---|---|", *head, "",
        "## 3. The head's nugget raised or lengthscales stretched (same weights)", "", cols, *probe2, "",
        "## 4. Filled in log space (lognormal mean and s.d.)", "", cols, *probe3, ""])
    out = results / f"kriging_lead_{args.scene}_{args.split}.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
