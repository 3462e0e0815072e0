"""Region transfer (the TE-TNP paper's environmental experiment): train in one region, test in others.

    python -m pipelines.region_transfer pipelines/configs/region_transfer/era5_paper.yaml     # with CDS access
    python -m pipelines.region_transfer pipelines/configs/region_transfer/era5_europe_0p25.yaml
    python -m pipelines.region_transfer CONFIG --models te-pt-tnp gp --steps 200              # a part, a budget

One config is the whole protocol (see ``pipelines/configs/region_transfer/``): ``data`` (a cube
path, or ``fetch:`` keywords of :func:`geonp.data.era5.fetch_era5` to get it first; the variable,
the elevation, the input channels, the window and the context fraction), ``train`` and
``test`` (regions, optionally with a ``time: [first, last]`` slice each), ``training`` (steps,
batch, learning rate), ``models`` (each with its preset and arguments) and ``evaluation``
(tasks per region); optionally ``runs``, the folder of the training runs. Steps: fetch (when
asked and absent) -> train every trainable model on the training region (``geonp.train``; runs
live in ``runs/region_transfer/<name>/<model>`` and resume) -> draw the same fixed tasks in
every region, normalised with the training region's statistics -> score every model on them ->
write the table and one map per region.

Scores per region: mean test log-likelihood per target point (nats, in normalised units, as the
paper's Table 3) +- its standard error over tasks; RMSE, CRPS and 90% coverage in the variable's
units. Models without weights (``gp``, ``linear``, ``window-kriging``) are fitted per task.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from geonp.data import attach_elevation, open_cube
from geonp.data.normalise import Normaliser
from geonp.data.regions import get_region, select_time
from geonp.data.tasks import TaskSampler, sample_tasks
from geonp.data.window_source import data_folder
from geonp.metrics import gaussian_skill, mean_and_stderr, task_log_likelihood
from geonp.models import build, load
from geonp.train import TrainConfig, train
from pipelines.provenance import REPO, git_commit, header

KEYS = {"name", "description", "data", "train", "test", "training", "models", "evaluation", "out", "runs"}


def load_config(path: str | Path) -> dict[str, Any]:
    """The protocol as a dict; unknown top-level keys are an error naming them."""
    cfg = yaml.safe_load(Path(path).read_text())
    unknown = sorted(set(cfg) - KEYS)
    if unknown:
        raise SystemExit(f"{path}: unknown key(s) {', '.join(unknown)}")
    return cfg


def _path(p: str | None) -> str | None:
    """A data path: absolute, or under the repository (``runs/...``), or under the data folder."""
    if p is None:
        return None
    for base in (Path(), REPO, data_folder()):
        if (base / p).exists():
            return str(base / p)
    return str(data_folder() / p)


def fetch_if_asked(data: dict[str, Any]) -> None:
    """``data.fetch``: get the cube from the CDS with ``geonp fetch era5`` first (skipped when present)."""
    if "fetch" not in data or Path(_path(data["path"])).exists():
        return
    from geonp.data.era5 import fetch_era5

    fetch_era5(out=data["path"], **data["fetch"])


def open_split(data: dict[str, Any], split: dict[str, Any]):
    """The cube (with elevation when asked) restricted to a split's time slice."""
    cube = open_cube(_path(data["path"]), [data["variable"]])
    if data.get("elevation"):
        cube = attach_elevation(cube, _path(data["elevation"]))
    return select_time(cube, split.get("time"), data["path"])


def train_models(cfg: dict[str, Any], names: list[str], steps: int | None) -> dict[str, str]:
    """Train (or resume) every trainable model on the training region; ``{model: checkpoint}``."""
    data, tr = cfg["data"], cfg["training"]
    out = {}
    for name in names:
        spec = cfg["models"][name] or {}
        if not build(name, len(data["inputs"]), 1, preset=spec.get("preset", "tiny"), **spec.get("args", {})).trainable:
            continue  # fitted per task (gp, linear, window-kriging)
        run = Path(cfg.get("runs", REPO / "runs" / "region_transfer" / cfg["name"])) / name
        source = {"name": "cube", "path": _path(data["path"]), "variables": [data["variable"]],
                  "elevation": _path(data.get("elevation")), "inputs": data["inputs"], "window": data["window"],
                  "context_fraction": data["context_fraction"], "gap_fill": 0.0, "region": cfg["train"]["region"],
                  "time": cfg["train"].get("time")}
        config = TrainConfig(model=name, out_dir=str(run), preset=spec.get("preset", "tiny"),
                             model_args=spec.get("args", {}), data=source, steps=steps or tr["steps"],
                             batch_size=tr.get("batch_size", 16), lr=tr.get("lr", 5e-4),
                             checkpoint_every=tr.get("checkpoint_every", 250), val_every=tr.get("val_every", 500),
                             log_every=50, val_tasks=tr.get("val_tasks", 64), seed=tr.get("seed", 0), device="auto")
        summary = run / "summary.json"
        done = json.loads(summary.read_text())["step"] if summary.exists() else 0
        if done < config.steps:
            started = time.perf_counter()
            train(config, resume=(run / "state.safetensors").exists(), progress=False)
            print(f"{name}: trained to step {config.steps} ({time.perf_counter() - started:.0f} s)", flush=True)
        out[name] = str(run / "model.safetensors")
    return out


def region_tasks(cfg: dict[str, Any], split: dict[str, Any], normaliser, seed: int) -> list:
    """The fixed evaluation tasks of one region: the same for every model."""
    data, ev = cfg["data"], cfg.get("evaluation", {})
    sampler = TaskSampler(open_split(data, split), data["variable"], window=data["window"], region=split["region"],
                          inputs=data["inputs"], batch_size=ev.get("batch_size", 16),
                          context_fraction=tuple(data["context_fraction"]), normaliser=normaliser, seed=seed)
    return sample_tasks(sampler, max(1, ev.get("tasks", 256) // ev.get("batch_size", 16)))


def baseline(name: str, spec: dict[str, Any], inputs: list[str]):
    """A model without trained weights, told which inputs are time and space."""
    args = dict(spec.get("args", {}))
    if name in ("linear", "window-kriging"):
        args.setdefault("time_input", inputs.index("time") if "time" in inputs else None)
        args.setdefault("space_inputs", [inputs.index("lat"), inputs.index("lon")])
    return build(name, len(inputs), 1, preset=spec.get("preset", "small"), **args)


@torch.no_grad()
def score(model, batches: list, std: float) -> dict[str, float]:
    """Log-likelihood per target (normalised units) +- standard error over tasks; RMSE, CRPS, coverage in units."""
    model.eval()
    lls, ys, means, sds = [], [], [], []
    start = time.perf_counter()
    for b in batches:
        dist = model(b.xc, b.yc, b.xt, b.mask_c, b.mask_t)
        lls.append(task_log_likelihood(dist, b.yt, b.mask_t))
        m = b.mask_t.numpy()
        ys.append(b.yt[..., 0].numpy()[m])
        means.append(dist.loc[..., 0].float().numpy()[m])
        sds.append(dist.scale[..., 0].float().numpy()[m])
    ll, se = mean_and_stderr(torch.cat(lls))
    skill = gaussian_skill(np.concatenate(ys) * std, np.concatenate(means) * std, np.concatenate(sds) * std)
    return {"ll": ll, "ll_se": se, "rmse": skill["rmse"], "crps": skill["crps"], "coverage_90": skill["coverage_90"],
            "wall_s": time.perf_counter() - start}


def region_label(split: dict[str, Any]) -> str:
    r = get_region(split["region"])
    return f"{r.name} (lat {r.lat[0]:g}-{r.lat[1]:g}, lon {r.lon[0]:g}-{r.lon[1]:g})"


def write_table(cfg: dict[str, Any], rows: dict[str, dict[str, dict]], text: str, path: Path) -> None:
    splits = [cfg["train"], *cfg["test"]]
    names = [get_region(s["region"]).name for s in splits]
    head = "| model | " + " | ".join(f"{n}{' (train)' if i == 0 else ''}" for i, n in enumerate(names)) + " | commit |"
    sep = "|---|" + "---:|" * len(names) + "---|"
    ll, skill = [head, sep], [head, sep]
    for model, by_region in rows.items():
        cells = [by_region.get(n) for n in names]
        commit = next((c["commit"] for c in cells if c), "–")
        ll.append(f"| {model} | " + " | ".join(f"{c['ll']:.3f} ± {c['ll_se']:.3f}" if c else "–" for c in cells)
                  + f" | {commit} |")
        skill.append(f"| {model} | " + " | ".join(f"{c['rmse']:.3g} / {c['crps']:.3g} / {c['coverage_90']:.2f}"
                                                  if c else "–" for c in cells) + f" | {commit} |")
    regions = "; ".join(region_label(s) + (f", {s['time'][0]} to {s['time'][1]}" if s.get("time") else "")
                        for s in splits)
    body = [text, "", cfg.get("description", "").strip(), "", f"Regions: {regions}.", "",
            "Mean test log-likelihood per target point (nats, normalised units; higher is better) ± standard "
            "error over tasks:", "", *ll, "",
            f"RMSE / CRPS ({cfg['data'].get('units', 'units of the variable')}) / 90% coverage:", "", *skill, ""]
    path.write_text("\n".join(body))
    path.with_suffix(".json").write_text(json.dumps({"header": text, "rows": rows}, indent=1))


def draw_maps(cfg: dict[str, Any], model, name: str, tasks_by_region: dict[str, list], normaliser,
              folder: Path) -> list[Path]:
    """One figure per region: truth, context, predicted mean and sigma of the first task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data, out = cfg["data"], []
    lat_i, lon_i = data["inputs"].index("lat"), data["inputs"].index("lon")
    for region, batches in tasks_by_region.items():
        b = batches[0]
        with torch.no_grad():
            dist = model.eval()(b.xc[:1], b.yc[:1], b.xt[:1], b.mask_c[:1], b.mask_t[:1])
        mc, mt = b.mask_c[0].numpy(), b.mask_t[0].numpy()

        def geo(x):
            x = x.numpy()
            return (normaliser.denormalise_input("lon", x[:, lon_i]), normaliser.denormalise_input("lat", x[:, lat_i]))

        values = lambda y: normaliser.denormalise_values(data["variable"], y)  # noqa: E731
        truth = values(b.yt[0, mt, 0].numpy())
        ctx = values(b.yc[0, mc, 0].numpy())
        mean = values(dist.loc[0, mt, 0].numpy())
        sigma = dist.scale[0, mt, 0].numpy() * normaliser.values[data["variable"]][1]
        lo, hi = float(min(truth.min(), ctx.min())), float(max(truth.max(), ctx.max()))
        fig, axes = plt.subplots(1, 4, figsize=(16, 3.8), constrained_layout=True)
        panels = [("truth (targets)", geo(b.xt[0, mt]), truth), ("context", geo(b.xc[0, mc]), ctx),
                  (f"{name} mean", geo(b.xt[0, mt]), mean), (f"{name} sigma", geo(b.xt[0, mt]), sigma)]
        for ax, (title, (x, y), z) in zip(axes, panels):
            sc = ax.scatter(x, y, c=z, s=14, marker="s", cmap="viridis" if "sigma" in title else "coolwarm",
                            **({} if "sigma" in title else {"vmin": lo, "vmax": hi}))
            ax.set_title(title)
            ax.set_xlabel("longitude")
            fig.colorbar(sc, ax=ax, label=data.get("units", ""))
        axes[0].set_ylabel("latitude")
        fig.suptitle(f"{cfg['name']}: {region}, one test window")
        path = folder / f"region_transfer_{cfg['name']}_{region}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        out.append(path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--models", nargs="*", help="a subset of the config's models (default: all)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the config's)")
    parser.add_argument("--tasks", type=int, default=None, help="test tasks per region (default: the config's)")
    parser.add_argument("--out", default=None, help="results file (default: the config's out)")
    parser.add_argument("--runs", default=None,
                        help="folder of the training runs, one per model (default: the config's runs, else "
                             "runs/region_transfer/<name>); a run there resumes")
    parser.add_argument("--train-only", action="store_true",
                        help="train (or resume) to --steps and stop: a long run in parts, scored when complete")
    args = parser.parse_args()
    cfg = load_config(args.config)
    if args.runs is not None:
        cfg["runs"] = args.runs
    if args.tasks is not None:
        cfg.setdefault("evaluation", {})["tasks"] = args.tasks
    names = args.models or list(cfg["models"])
    unknown = [m for m in names if m not in cfg["models"]]
    if unknown:
        raise SystemExit(f"--models: not in {args.config}: {', '.join(unknown)}")
    out = Path(args.out or REPO / cfg["out"])
    fetch_if_asked(cfg["data"])
    checkpoints = train_models(cfg, names, args.steps)
    if args.train_only:
        return
    data = cfg["data"]
    # The training region's statistics, as the checkpoints record them (fitted afresh when only
    # models without weights run): every region is normalised with them.
    normaliser = Normaliser.load(next(iter(checkpoints.values()))) if checkpoints else \
        TaskSampler(open_split(data, cfg["train"]), data["variable"], window=data["window"],
                    region=cfg["train"]["region"], inputs=data["inputs"]).normaliser
    std = normaliser.values[data["variable"]][1]
    seed = cfg.get("evaluation", {}).get("seed", 7)
    splits = [cfg["train"], *cfg["test"]]
    tasks = {get_region(s["region"]).name: region_tasks(cfg, s, normaliser, seed) for s in splits}
    earlier = json.loads(out.with_suffix(".json").read_text())["rows"] if out.with_suffix(".json").exists() else {}
    rows: dict[str, dict] = {m: earlier.get(m, {}) for m in cfg["models"]}
    commit, models = git_commit(), {}
    for name in names:
        spec = cfg["models"][name] or {}
        model = load(checkpoints[name]) if name in checkpoints else baseline(name, spec, data["inputs"])
        models[name] = model
        for region, batches in tasks.items():
            rows[name][region] = {**score(model, batches, std), "commit": commit}
            r = rows[name][region]
            print(f"{name} {region}: LL {r['ll']:.3f} ± {r['ll_se']:.3f}, RMSE {r['rmse']:.3g}, "
                  f"CRPS {r['crps']:.3g}, cov90 {r['coverage_90']:.2f} ({r['wall_s']:.0f} s)", flush=True)
    tr = cfg["training"]
    text = header(f"Region transfer: {cfg['name']}", torch.device("cpu"),
                  f"{args.steps or tr['steps']} steps x {tr.get('batch_size', 16)} tasks per trained model; "
                  f"{cfg.get('evaluation', {}).get('tasks', 256)} test tasks per region (seed {seed})")
    rows = {m: r for m, r in rows.items() if r}
    out.parent.mkdir(parents=True, exist_ok=True)
    write_table(cfg, rows, text, out)
    # The maps show a TE model; a run of other models alone keeps the maps an earlier run drew.
    shown = next((m for m in ("te-pt-tnp", "te-tnp") if m in models), None)
    if shown is None and models and not any(out.parent.glob(f"region_transfer_{cfg['name']}_*.png")):
        shown = next(iter(models))
    if shown is None:
        print("maps kept: they show te-pt-tnp or te-tnp, and neither ran now")
    else:
        for path in draw_maps(cfg, models[shown], shown, tasks, normaliser, out.parent):
            print(f"wrote {path}")
    print(out.read_text())


if __name__ == "__main__":
    main()
