"""Does a choice made on one validation crop carry over? te-pt-tnp weights on more crops of one product.

    python -m pipelines.experiments.more_crops                                   # MODIS LST, bundled vs wide clouds
    python -m pipelines.experiments.more_crops --scene olci --crops 600:800 400:1100

The accuracy ablation chooses on one validation crop per product. This scores the same te-pt-tnp
checkpoints on further crops of a product (each 200 x 300 cells, ``--crops ROW:COL`` giving the
top-left cell), hidden as ``geonp evaluate`` hides them with the validation seed (1), without
fine-tuning. Crops must not overlap satellite_cv's test crop (checked), and for a product the
weights trained on they must lie outside its training part: the default product, MODIS LST, is
never trained on; OLCI's are inside the box its training excludes (e.g. ``--scene olci --crops
600:800 400:1100``). Writes ``pipelines/results/more_crops_<scene>.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from geonp.data import open_satellite
from geonp.data.readers import data_folder
from geonp.evaluate import evaluate
from pipelines.provenance import REPO, header
from pipelines.scenes import CROP_SIZE as SIZE
from pipelines.scenes import MORE_CORNERS
from pipelines.scenes import TEST as SCENES

SEED = 1  # the validation seed of the accuracy ablation
DEFAULT_WEIGHTS = {"bundled": "geonp/weights/te-pt-tnp.safetensors",
                   "flagship-wide-trained": "pipelines/weights/te-pt-tnp-wide-clouds.safetensors"}


def crop_boxes(crops: list[str], test: dict[str, slice]) -> list[tuple[int, int]]:
    """``ROW:COL`` strings as top-left cells; raises SystemExit for a malformed one or one overlapping ``test``."""
    boxes = []
    rows, cols = (test[d] for d in list(test)[-2:])
    for text in crops:
        try:
            r, c = (int(v) for v in text.split(":"))
        except ValueError:
            raise SystemExit(f"--crops: {text!r} is not ROW:COL (two integers)") from None
        if r < rows.stop and rows.start < r + SIZE[0] and c < cols.stop and cols.start < c + SIZE[1]:
            raise SystemExit(f"--crops: {text} overlaps satellite_cv's test crop {rows.start}:{rows.stop}, "
                             f"{cols.start}:{cols.stop}")
        boxes.append((r, c))
    return boxes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scene", default="modis", choices=list(SCENES))
    parser.add_argument("--crops", nargs="*", default=[f"{r}:{c}" for r, c in MORE_CORNERS["modis"]])
    parser.add_argument("--weights", nargs="*", help="NAME=CHECKPOINT (default: bundled and flagship-wide-trained)")
    parser.add_argument("--out", help="results file (default: pipelines/results/more_crops_<scene>.md)")
    args = parser.parse_args()
    out = Path(args.out or REPO / "pipelines" / "results" / f"more_crops_{args.scene}.md")
    weights = dict(w.split("=", 1) for w in args.weights) if args.weights else DEFAULT_WEIGHTS
    for name, path in weights.items():
        if not (REPO / path).is_file():
            raise SystemExit(f"--weights {name}: {REPO / path} does not exist")
    path, variable, kwargs, test = SCENES[args.scene]
    boxes = crop_boxes(args.crops, test)
    torch.set_num_threads(1)
    ds = open_satellite(data_folder() / path, variable, **kwargs)
    rows_dim, cols_dim = list(test)[-2:]
    lines = ["| crop (rows, cols) | weights | RMSE | CRPS | cov90 | hidden cells |", "|---|---|---:|---:|---:|---:|"]
    for r, c in boxes:
        sub = ds.isel({rows_dim: slice(r, r + SIZE[0]), cols_dim: slice(c, c + SIZE[1])})
        for name, checkpoint in weights.items():
            res = evaluate(sub, variable, ["te-pt-tnp"], checkpoints={"te-pt-tnp": str(REPO / checkpoint)},
                           seed=SEED, fit_steps=0, options={"device": "cpu"})
            row = res["rows"][0]
            lines.append(f"| {r}:{r + SIZE[0]}, {c}:{c + SIZE[1]} | {name} | {row['rmse']:.4g} | {row['crps']:.4g} "
                         f"| {row['coverage_90']:.3f} | {row['n']} |")
            print(lines[-1], flush=True)
    text = header(f"te-pt-tnp weights on more crops of {args.scene} ({variable})", torch.device("cpu"),
                  f"no fine-tuning; hidden cells as geonp evaluate hides them, seed {SEED}; crops of "
                  f"{SIZE[0]} x {SIZE[1]} cells")
    out.write_text(text + "\n" + "\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
