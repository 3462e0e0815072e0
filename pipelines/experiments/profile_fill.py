"""Where a default te-pt-tnp fill spends its time (issue 54, item 2): cProfile of one ``geonp.infill``.

    python -m pipelines.experiments.profile_fill --case demo                 # CPU
    python -m pipelines.experiments.profile_fill --case scene150k --device cuda
    python -m pipelines.experiments.profile_fill --case cube1m --steps 192  # a long stack's first 192 hours

The case is one of :mod:`pipelines.benchmarks.fill_speed`'s (its data, its gaps), filled with
geonp's defaults (30 fit steps, the nugget check). The device is started before the profile (a
CUDA context, the fused CPU kernel's one-time build), so what is left is what every fill pays in a
fresh process: lazy imports included. cProfile adds its own overhead to Python-heavy code, so the
profiled wall time is longer than ``fill_speed``'s; read the shares, not the seconds. On a GPU,
kernels run asynchronously and cProfile books their time at the next synchronisation (a
``.item()``, a ``bool()`` of a tensor, a copy to the host), so there the call counts are exact but
the seconds of a function may include other functions' kernels.
Writes ``pipelines/results/fill_profile_{device}_{case}.md`` (``..._{case}_{steps}steps.md`` with
``--steps``): the top functions by cumulative time, then by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from pipelines.benchmarks.fill_speed import CASES, load_case
from pipelines.provenance import REPO, header


def profile(case: str, device: str, top: int, steps: int | None = None) -> tuple[float, str]:
    """``(profiled wall seconds, pstats text)`` of one default te-pt-tnp fill of ``case`` (its first
    ``steps`` time steps when given: a long stack's costs that grow with its length, in minutes)."""
    import geonp
    from geonp.models import cpu_build

    ds, variable, _ = load_case(case)
    if steps is not None:
        if "time" not in ds.dims:
            raise ValueError(f"--steps: case {case!r} has no time dimension")
        ds = ds.isel(time=slice(0, steps))
    if device == "cuda":
        torch.zeros(1, device="cuda")
    else:
        cpu_build.build_all()
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    geonp.infill(ds, variable, "te-pt-tnp", device=device)
    if device == "cuda":
        torch.cuda.synchronize()
    prof.disable()
    wall = time.perf_counter() - start
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top // 2)
    return wall, text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="demo", choices=CASES)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--top", type=int, default=70, help="functions listed by cumulative time (half as many by own)")
    parser.add_argument("--steps", type=int, default=None, help="only the case's first STEPS time steps")
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "profile_fill: --device cuda: no CUDA device here\n")
    try:
        wall, text = profile(args.case, args.device, args.top, args.steps)
    except ValueError as err:
        parser.exit(2, f"profile_fill: {err}\n")
    name = args.case if args.steps is None else f"{args.case}_{args.steps}steps"
    out = REPO / "pipelines" / "results" / f"fill_profile_{args.device}_{name}.md"
    what = args.case if args.steps is None else f"{args.case}, its first {args.steps} steps"
    out.write_text(header(f"Where a default te-pt-tnp fill spends its time: {what}", torch.device(args.device),
                          "one geonp.infill with the defaults under cProfile, the device started first")
                   + f"- profiled wall: {wall:.1f} s\n\n```text\n{text.strip()}\n```\n")
    print(f"{out.relative_to(REPO)}: profiled wall {wall:.1f} s")


if __name__ == "__main__":
    main()
