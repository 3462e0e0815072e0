"""TE attention speed on CPU: training steps/s and infill targets/s of its three forms, and peers.

    python -m pipelines.benchmarks.te_speed                 # writes pipelines/results/te_speed_cpu.md
    python -m pipelines.benchmarks.te_speed --repeats 7 --threads 1

The forms compute the same function: the reference (direct) form, the Python fast path, and
the fused C++ kernel (geonp/models/te_fused.py); tests/test_te_attention.py and
tests/test_te_fused.py hold them to each other within 1e-5, gradients included. The peers are
the models without TE attention that take the same tasks: TNP-D (tnp) and PT-TNP, tiny presets.
The tasks are infill windows as training and infill draw them (synthetic fields,
``WindowSource``): a training step is forward + backward + AdamW on a batch of 16 windows with
at most 512 context cells (the bundled configs); infill is a no-grad forward over 16 windows
with at most 1024 context cells. Each figure is the median of ``--repeats`` timed runs after
one warm-up, the forms alternating within each run so that a busy machine slows all alike.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from geonp.models import build
from geonp.models.te_attention import PREDICT_BLOCK_ELEMS, TRAIN_BLOCK_ELEMS, attention_backend, set_block_elems
from geonp.tasks.window_source import WindowSource
from pipelines.provenance import REPO, header

#: (label, model name, build keywords): the bundled te-pt-tnp and its local-attention variant.
MODELS = [
    ("te-pt-tnp tiny M=32", "te-pt-tnp", {"preset": "tiny", "num_pseudo": 32}),
    ("te-pt-tnp tiny M=32 k=16", "te-pt-tnp", {"preset": "tiny", "num_pseudo": 32,
                                                "local_attention": {"neighbours": 16, "weights": [0.25, 1.0, 1.0]}}),
    ("te-pt-tnp flagship (k=16, kriging k=64)", "te-pt-tnp",
     {"preset": "tiny", "num_pseudo": 32, "local_attention": {"neighbours": 16, "weights": [2.0, 1.0, 1.0]},
      "kriging": {"neighbours": 64}}),
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


#: (label, TE attention backend): the direct form, the Python fast path (split first layer of rho,
#: row blocks recomputed in backward), and the fused kernel.
FORMS = [("reference", "direct"), ("fast", "fast"), ("fused", "fused")]

#: (label, model name, build keywords): models with standard attention on the same tasks.
PEERS = [("tnp (TNP-D) tiny", "tnp", {"preset": "tiny"}), ("pt-tnp tiny", "pt-tnp", {"preset": "tiny"})]


def measure(name: str, kwargs: dict, train_data: list, infill_data: list, repeats: int) -> dict[str, dict]:
    """``{form label: {"steps_s", "targets_s", "runs"}}``: medians over ``repeats`` rounds."""
    torch.manual_seed(0)
    model = build(name, 3, 1, **kwargs)
    figures: dict[str, dict[str, list[float]]] = {f: {"train": [], "infill": []} for f, _ in FORMS}
    for i in range(repeats + 1):  # the first round warms up
        for label, backend in FORMS:
            with attention_backend(model, backend):
                step = time_training(set_block_elems(model.train(), TRAIN_BLOCK_ELEMS), train_data)
                rate = time_infill(set_block_elems(model.eval(), PREDICT_BLOCK_ELEMS), infill_data)
            if i:
                figures[label]["train"].append(step)
                figures[label]["infill"].append(rate)
    return {label: {"steps_s": 1 / statistics.median(d["train"]), "targets_s": statistics.median(d["infill"]),
                    "runs": len(d["train"])} for label, d in figures.items()}


def measure_peer(name: str, kwargs: dict, train_data: list, infill_data: list, repeats: int) -> dict[str, float]:
    """``{"steps_s", "targets_s"}`` of a model without TE attention, medians as in ``measure``."""
    torch.manual_seed(0)
    model = build(name, 3, 1, **kwargs)
    steps, rates = [], []
    for i in range(repeats + 1):
        step, rate = time_training(model.train(), train_data), time_infill(model.eval(), infill_data)
        if i:
            steps.append(step)
            rates.append(rate)
    return {"steps_s": 1 / statistics.median(steps), "targets_s": statistics.median(rates)}


def table(rows: list, key: str, digits: int) -> list[str]:
    """Markdown rows: each form's figure and the fused kernel's speed-up over the two others."""
    labels = [f for f, _, _ in FORMS]
    out = ["| model | " + " | ".join(labels) + " | fused / reference | fused / fast |", "|---|" + "---:|" * 5]
    for label, r in rows:
        out.append(f"| {label} | " + " | ".join(f"{r[f][key]:.{digits}f}" for f in labels)
                   + f" | {r['fused'][key] / r['reference'][key]:.2f}x | {r['fused'][key] / r['fast'][key]:.2f}x |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, default=3, help="batches of 16 windows per timed run")
    parser.add_argument("--out", default=str(REPO / "pipelines" / "results" / "te_speed_cpu.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train_data, infill_data = batches(512, args.batches, 0), batches(1024, args.batches, 1)
    rows, peers = [], []
    for label, name, kwargs in MODELS:
        rows.append((label, measure(name, kwargs, train_data, infill_data, args.repeats)))
        print(*rows[-1], flush=True)
    for label, name, kwargs in PEERS:
        peers.append((label, measure_peer(name, kwargs, train_data, infill_data, args.repeats)))
        print(*peers[-1], flush=True)
    text = header("TE attention speed on CPU: reference form, Python fast path and fused kernel; peers",
                  torch.device("cpu"),
                  f"{args.batches} batches of 16 synthetic infill windows per timed run (training: <= 512 "
                  f"context cells, infill: <= 1024), median of {args.repeats} runs after a warm-up, the forms "
                  "alternating within each run")
    lines = [text, "", f"Training steps per second (forward, backward, AdamW; batch of 16 windows; the Python "
             f"forms' block cap {TRAIN_BLOCK_ELEMS}):", "", *table(rows, "steps_s", 3), "",
             f"Infill targets per second (no-grad forward; the Python forms' block cap {PREDICT_BLOCK_ELEMS}):",
             "", *table(rows, "targets_s", 0), "",
             "Peers, the same batches through models with standard (not TE) attention:", "",
             "| model | training steps/s | infill targets/s |", "|---|---:|---:|"]
    lines += [f"| {label} | {r['steps_s']:.3f} | {r['targets_s']:.0f} |" for label, r in peers]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
