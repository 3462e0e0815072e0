"""Forward-pass wall time and peak memory against the number of context and target points.

The layout follows the TNP-KR paper's Tables 1-2: one table varies the number of targets at a
fixed context size, one the context at a fixed number of targets, and a third grows both
together (the 10^6 context + 10^6 targets goal of ``tnp-kr-fast``). Each cell is one forward
pass of one task (batch 1, 2-D inputs uniform on [-2, 2]^2, standard normal outputs) under
``torch.inference_mode`` with random weights (speed does not depend on the weight values) and
TE attention blocks at infill's size, after a warm-up call at 100 points, in a fresh subprocess
so peaks do not mix.

A cell that exceeds ``--mem-limit-gb`` (resident set, watched from outside) is killed and
recorded as OOM, like a CUDA out-of-memory error; one that runs past ``--timeout`` is recorded
as a timeout. Larger sizes of the same model in the same sweep are then not run.

    python -m pipelines.benchmarks.scaling --out pipelines/results/scaling.md
    python -m pipelines.benchmarks.scaling --device cuda --out pipelines/results/scaling_gpu.md
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch

from geonp.device import resolve_device
from geonp.models import build
from pipelines.benchmarks.memory import high_water
from pipelines.provenance import header

MODELS = ["tnp", "te-pt-tnp", "tnp-kr", "tnp-kr-fast", "convcnp"]
SIZES = [10**2, 10**3, 10**4, 10**5, 10**6]
#: sweep name -> (context size, target size) as functions of the swept size n.
SWEEPS = {
    "targets": ("Table 1: targets grow, 1,000 context points", lambda n: (1000, n)),
    "context": ("Table 2: context grows, 1,000 targets", lambda n: (n, 1000)),
    "both": ("Table 3: context and targets grow together", lambda n: (n, n)),
}
DIM_X = 2


def _task(nc: int, nt: int, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    xc = (torch.rand(1, nc, DIM_X, generator=g) * 4 - 2).to(device)  # [1, Nc, 2]
    yc = torch.randn(1, nc, 1, generator=g).to(device)  # [1, Nc, 1]
    xt = (torch.rand(1, nt, DIM_X, generator=g) * 4 - 2).to(device)  # [1, Nt, 2]
    return xc, yc, xt


def measure(name: str, preset: str, nc: int, nt: int, device: torch.device) -> dict:
    """One cell in this process: ``{seconds, peak_bytes}`` of one forward pass."""
    torch.manual_seed(0)
    # Blocks as geonp infill sets them for this device without autograd (on a CPU the presets'
    # larger training blocks outgrow the caches: 20x slower forwards, see set_block_elems).
    model = build(name, dim_x=DIM_X, dim_y=1, preset=preset).to(device).for_prediction()
    with torch.inference_mode():
        model(*_task(100, 100, device)).loc.sum().item()  # warm-up: allocator, kernels
        inputs = _task(nc, nt, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        dist = model(*inputs)
        dist.loc.sum().item()  # forces the computation (and a device sync)
        seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else high_water()
    return {"seconds": seconds, "peak_bytes": peak}


def _run_cell(name: str, args: argparse.Namespace, nc: int, nt: int) -> dict:
    """Run one cell in a subprocess, killing it past the time or memory limit."""
    cmd = [sys.executable, "-m", "pipelines.benchmarks.scaling", "--worker", name, str(nc), str(nt),
           "--preset", args.preset, "--device", args.device]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watched, limit, start = psutil.Process(proc.pid), args.mem_limit_gb * 2**30, time.monotonic()
    status = None
    while proc.poll() is None:
        try:
            rss = watched.memory_info().rss
        except psutil.NoSuchProcess:
            break
        if rss > limit:
            status = f"OOM (> {args.mem_limit_gb:g} GB)"
        elif time.monotonic() - start > args.timeout:
            status = f"timeout (> {args.timeout:g} s)"
        if status:
            proc.kill()
            proc.wait()
            return {"status": status}
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["killed"])[-1]
        oom = any(s in last.lower() for s in ("out of memory", "can't allocate memory", "memoryerror"))
        return {"status": f"OOM (> {args.mem_limit_gb:g} GB)" if oom else f"failed: {last[:60]}"}
    return {"status": "ok", **json.loads(out.strip().splitlines()[-1])}


def _cell_text(r: dict) -> str:
    if r["status"] != "ok":
        return r["status"]
    return f"{r['seconds']:.3g} s / {r['peak_bytes'] / 2**30:.2f} GB"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--sizes", nargs="+", type=int, default=SIZES)
    p.add_argument("--sweeps", nargs="+", choices=list(SWEEPS), default=list(SWEEPS))
    p.add_argument("--preset", default="paper", help="architecture sizes of every model (default: the papers')")
    p.add_argument("--device", default="cpu")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per cell, the model build included")
    p.add_argument("--mem-limit-gb", type=float, default=22.0, help="resident-set limit per cell (CPU)")
    p.add_argument("--out", default="pipelines/results/scaling.md")
    p.add_argument("--worker", nargs=3, metavar=("MODEL", "NC", "NT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    if args.worker:
        name, nc, nt = args.worker
        if device.type == "cpu":  # allocations past the limit fail cleanly instead of swapping
            limit = int(args.mem_limit_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        print(json.dumps(measure(name, args.preset, int(nc), int(nt), device)))
        return

    results: dict[str, dict[str, dict[int, dict]]] = {}
    for sweep in args.sweeps:
        for name in args.models:
            row: dict[int, dict] = {}
            for n in args.sizes:
                failed = next((r for r in row.values() if r["status"] != "ok"), None)
                if failed:
                    row[n] = {"status": "not run (" + failed["status"].split(" ")[0] + " at a smaller size)"}
                    continue
                row[n] = _run_cell(name, args, *SWEEPS[sweep][1](n))
                print(f"{sweep:8s} {name:12s} n={n:>8d} {_cell_text(row[n])}", flush=True)
            results.setdefault(sweep, {})[name] = row

    peak = "peak GPU memory allocated" if device.type == "cuda" else "peak resident set of the process (VmHWM)"
    lines = [header("Scaling: one forward pass against context and target size", device,
                    f"one forward per cell, batch 1, Dx = 2, preset `{args.preset}`, random weights; "
                    f"limits {args.timeout:g} s and {args.mem_limit_gb:g} GB per cell"), "",
             f"Each cell: wall seconds of the forward pass (after a warm-up) / {peak}. "
             "Goal (issue #5): `tnp-kr-fast` runs 10^6 context + 10^6 targets in one forward within 24 GB on "
             "CPU, in under a second on an H200.", ""]
    for sweep, rows in results.items():
        lines += [f"## {SWEEPS[sweep][0]}", "", "| model | " + " | ".join(f"{n:,}" for n in args.sizes) + " |",
                  "|---|" + "---|" * len(args.sizes)]
        lines += [f"| {name} | " + " | ".join(_cell_text(row[n]) for n in args.sizes) + " |"
                  for name, row in rows.items()]
        lines.append("")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))
    Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
