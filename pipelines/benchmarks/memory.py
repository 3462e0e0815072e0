"""Peak memory of TE attention models at Nc=5000, Nt=1000, Dx=1 (issue goal: < 1 GB).

The TE-TNP thesis measured 13.5 GB for its TETNP forward at this size: the
kernel MLP's hidden activation over all (query, key) pairs. geonp's TE
attention processes key blocks with an online softmax and row blocks under
activation checkpointing, so peak memory is bounded by ``max_block_elems``.

Each measurement runs in a fresh subprocess. On CPU the figure is the growth of
the process's peak resident set (``ru_maxrss``) over its resident set just
before the call; on CUDA it is ``max_memory_allocated`` over the memory
allocated before the call. ``--unchunked`` also measures with blocking off
(one block holds every pair), for comparison, where the device can hold it.

    python -m pipelines.benchmarks.memory --out pipelines/results/memory_cpu.md
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from geonp.device import resolve_device
from geonp.models import build
from pipelines.provenance import header

MODES = ("forward (no grad)", "forward + backward")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def high_water(pid: int | str = "self") -> int:
    """The kernel's peak resident set (``VmHWM``) of process ``pid``'s address space, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def measure(name: str, mode: str, device: torch.device, nc: int, nt: int, unchunked: bool) -> dict:
    """One measurement in this process: returns peak extra bytes and wall seconds."""
    torch.manual_seed(0)
    overrides = {"max_block_elems": 2**62} if unchunked else {}
    model = build(name, dim_x=1, dim_y=1, preset="paper", **overrides).to(device)
    xc = torch.rand(1, nc, 1, device=device) * 4 - 2
    yc = torch.randn(1, nc, 1, device=device)
    xt = torch.rand(1, nt, 1, device=device) * 6 - 3
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_bytes()
    start = time.perf_counter()
    if mode == MODES[0]:
        with torch.no_grad():
            model(xc, yc, xt).loc.sum().item()
    else:
        model(xc, yc, xt).log_prob(torch.zeros(1, nt, 1, device=device)).mean().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {"model": name, "mode": mode, "unchunked": unchunked, "peak_bytes": peak,
            "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["te-tnp", "te-pt-tnp"])
    p.add_argument("--nc", type=int, default=5000)
    p.add_argument("--nt", type=int, default=1000)
    p.add_argument("--device", default="auto")
    p.add_argument("--unchunked", action="store_true", help="also measure with blocking switched off")
    p.add_argument("--backward-models", nargs="*", default=None,
                   help="models whose forward + backward is measured (default: all of --models)")
    p.add_argument("--out", default="pipelines/results/memory_cpu.md")
    p.add_argument("--worker", nargs=3, metavar=("MODEL", "MODE", "UNCHUNKED"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    if args.worker:
        name, mode, unchunked = args.worker
        print(json.dumps(measure(name, MODES[int(mode)], device, args.nc, args.nt, unchunked == "1")))
        return
    rows = []
    backward = args.models if args.backward_models is None else args.backward_models
    for name in args.models:
        for m in range(len(MODES) if name in backward else 1):
            for unchunked in ([0, 1] if args.unchunked else [0]):
                cmd = [sys.executable, "-m", "pipelines.benchmarks.memory", "--worker", name, str(m), str(unchunked),
                       "--nc", str(args.nc), "--nt", str(args.nt), "--device", args.device]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode == 0:
                    rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                else:  # out of memory or killed: recorded as such
                    err = (proc.stderr.strip().splitlines() or ["killed"])[-1][:80]
                    rows.append({"model": name, "mode": MODES[m], "unchunked": bool(unchunked),
                                 "peak_bytes": None, "seconds": None, "error": err})
    lines = [header(f"TE attention peak memory at Nc={args.nc}, Nt={args.nt}, Dx=1, batch 1", device,
                    "one forward (and one forward + backward) per row, `paper` preset (Dz=128, 8 heads, 5 layers, "
                    "kernel MLP width 128, M=32)"), "",
             "Goal (issue #2): < 1 GB per forward. Thesis TETNP forward at this size: 13.5 GB.", "",
             "| model | pass | blocking | peak extra memory | wall s |", "|---|---|---|---|---|"]
    for r in rows:
        mem = f"{r['peak_bytes'] / 2**30:.3f} GiB" if r["peak_bytes"] is not None else f"failed ({r['error']})"
        secs = f"{r['seconds']:.2f}" if r["seconds"] is not None else "–"
        block = "off (one block)" if r["unchunked"] else "on (default 2^24 elements)"
        lines.append(f"| {r['model']} | {r['mode']} | {block} | {mem} | {secs} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
