"""TE attention speed on CPU: training steps/s and infill targets/s, reference form vs fast path.

    python -m pipelines.te_speed                 # writes pipelines/results/te_speed_cpu.md
    python -m pipelines.te_speed --repeats 7 --threads 1

The forms compute the same function (tests/test_te_attention.py holds the fast one to the
reference within 1e-5, gradients included). The tasks are infill windows as training and
infill draw them (synthetic fields, ``WindowSource``): a training step is forward + backward +
AdamW on a batch of 16 windows with at most 512 context cells (the bundled configs); infill is
a no-grad forward over 16 windows with at most 1024 context cells. Each figure is the median of
``--repeats`` timed runs after one warm-up, alternating the two forms so that a busy machine
slows both alike.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from geonp.data.window_source import WindowSource
from geonp.fill.predictor import PREDICT_BLOCK_ELEMS
from geonp.models import build
from geonp.models.te_attention import TEAttention, set_block_elems
from pipelines.provenance import REPO, header

#: (label, model name, build keywords): the bundled te-pt-tnp and its local-attention variant.
MODELS = [
    ("te-pt-tnp tiny M=32", "te-pt-tnp", {"preset": "tiny", "num_pseudo": 32}),
    ("te-pt-tnp tiny M=32 k=16", "te-pt-tnp", {"preset": "tiny", "num_pseudo": 32, "num_neighbours": 16,
                                                "neighbour_weights": [0.25, 1.0, 1.0]}),
    ("te-pt-tnp flagship (k=16, kriging k=64)", "te-pt-tnp",
     {"preset": "tiny", "num_pseudo": 32, "num_neighbours": 16, "neighbour_weights": [2.0, 1.0, 1.0],
      "local_kriging": True, "kriging_neighbours": 64}),
    ("te-tnp tiny", "te-tnp", {"preset": "tiny"}),
]


def batches(max_context: int, count: int, seed: int) -> list:
    source = WindowSource(synthetic=1.0, window={"max_context": max_context})
    g = torch.Generator().manual_seed(seed)
    return [source.sample(16, g) for _ in range(count)]


def time_training(model: torch.nn.Module, data: list) -> float:
    """Seconds per training step (forward, backward, AdamW) over ``data``."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    start = time.perf_counter()
    for b in data:
        dist = model(b.xc, b.yc, b.xt, b.mask_c, b.mask_t)
        loss = -(dist.log_prob(b.yt)[..., 0] * b.mask_t).sum() / b.mask_t.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (time.perf_counter() - start) / len(data)


@torch.no_grad()
def time_infill(model: torch.nn.Module, data: list) -> float:
    """Targets per second of no-grad forward passes over ``data``."""
    start = time.perf_counter()
    targets = 0
    for b in data:
        model(b.xc, b.yc, b.xt, b.mask_c, b.mask_t)
        targets += int(b.mask_t.sum())
    return targets / (time.perf_counter() - start)


#: (label, fast path, training block cap): the form as shipped before #13, the fast path, and the
#: fast path with a training block cap large enough that no row block is recomputed in backward.
FORMS = [("reference", False, 2**25), ("fast", True, 2**25), ("fast, no recompute", True, 2**28)]


def measure(name: str, kwargs: dict, train_data: list, infill_data: list, repeats: int) -> dict[str, dict]:
    """``{form label: {"steps_s", "targets_s", "runs"}}``: medians over ``repeats`` rounds."""
    torch.manual_seed(0)
    model = build(name, 3, 1, **kwargs)
    figures: dict[str, dict[str, list[float]]] = {f: {"train": [], "infill": []} for f, _, _ in FORMS}
    for i in range(repeats + 1):  # the first round warms up
        for label, fast, elems in FORMS:
            TEAttention.fast = fast
            step = time_training(set_block_elems(model.train(), elems), train_data)
            rate = time_infill(set_block_elems(model.eval(), PREDICT_BLOCK_ELEMS), infill_data)
            if i:
                figures[label]["train"].append(step)
                figures[label]["infill"].append(rate)
    TEAttention.fast = True
    return {label: {"steps_s": 1 / statistics.median(d["train"]), "targets_s": statistics.median(d["infill"]),
                    "runs": len(d["train"])} for label, d in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, default=3, help="batches of 16 windows per timed run")
    parser.add_argument("--out", default=str(REPO / "pipelines" / "results" / "te_speed_cpu.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train_data, infill_data = batches(512, args.batches, 0), batches(1024, args.batches, 1)
    rows = []
    for label, name, kwargs in MODELS:
        r = measure(name, kwargs, train_data, infill_data, args.repeats)
        rows.append((label, r))
        print(label, r, flush=True)
    text = header("TE attention speed on CPU: reference form vs fast path", torch.device("cpu"),
                  f"{args.batches} batches of 16 synthetic infill windows per timed run (training: <= 512 "
                  f"context cells, infill: <= 1024), median of {args.repeats} runs after a warm-up, the forms "
                  "alternating within each run")
    labels = [f for f, _, _ in FORMS]
    lines = [text, "", "Training steps per second (forward, backward, AdamW; batch of 16 windows):", "",
             "| model | " + " | ".join(labels) + " | speed-up |", "|---|" + "---:|" * (len(labels) + 1)]
    for label, r in rows:
        lines.append(f"| {label} | " + " | ".join(f"{r[f]['steps_s']:.3f}" for f in labels)
                     + f" | {r[labels[-1]]['steps_s'] / r[labels[0]]['steps_s']:.2f}x |")
    lines += ["", f"Infill targets per second (no-grad forward, block cap {PREDICT_BLOCK_ELEMS}; the training "
              "cap does not apply):", "", "| model | reference | fast | speed-up |", "|---|---:|---:|---:|"]
    for label, r in rows:
        lines.append(f"| {label} | {r['reference']['targets_s']:.0f} | {r['fast']['targets_s']:.0f} | "
                     f"{r['fast']['targets_s'] / r['reference']['targets_s']:.2f}x |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
