"""The ``geonp`` command: parses arguments, calls one function, maps errors to exit codes.

Exit codes: 0 success, 2 bad input or usage (one-line message naming the
problem), 1 an unexpected failure or a download that failed after its retries
(one line; set ``GEONP_DEBUG=1`` for the traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys

from geonp import __version__

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geonp",
        description="Fill gaps in gridded geospatial fields with neural processes, with calibrated uncertainty.",
    )
    parser.add_argument("--version", action="version", version=f"geonp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="run the embedded default job (offline, about a minute on 2 CPU cores)")
    demo.add_argument("-o", "--out", default="geonp-demo", help="output folder (default: %(default)s)")
    demo.add_argument("--steps", type=int, default=600, help="training steps (default: %(default)s)")
    demo.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    demo.add_argument("--overwrite", action="store_true", help="replace an existing output folder")

    train = sub.add_parser("train", help="train a model from a YAML configuration")
    train.add_argument("config", help="YAML file with the TrainConfig settings (see geonp.train)")
    train.add_argument("--device", default=None, help="auto, cpu or cuda (overrides the config)")
    train.add_argument("--resume", action="store_true", help="continue the run in the config's out_dir")
    train.add_argument("--steps", type=int, default=None, help="total steps (overrides the config)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    models = sub.add_parser("models", help="list the model names and their presets")
    models.set_defaults()

    fetch = sub.add_parser("fetch", help="download input data into a local Zarr store")
    sources = fetch.add_subparsers(dest="source", metavar="SOURCE")
    era5 = sources.add_parser(
        "era5", help="ERA5 hourly single levels from the Copernicus Climate Data Store (needs a CDS API key)",
        description="Fetch ERA5 single-level fields, one CDS request per month, into a chunked Zarr store; "
                    "rerun the same command to resume an interrupted fetch or to extend the store forward. "
                    "Credentials: CDSAPI_URL and CDSAPI_KEY, or ~/.cdsapirc.")
    era5.add_argument("--variable", action="append", required=True, metavar="NAME",
                      help="CDS variable name, e.g. 2m_temperature (repeat for several)")
    era5.add_argument("--start", required=True, help="first day, YYYY-MM-DD")
    era5.add_argument("--end", required=True, help="last day, YYYY-MM-DD (inclusive)")
    era5.add_argument("--area", required=True, metavar="N/W/S/E", help="bounding box in degrees, e.g. 60/-10/35/30")
    era5.add_argument("--grid", type=float, default=0.25, help="grid spacing in degrees (default: %(default)s)")
    era5.add_argument("--hours", default=None, help="hours of the day (UTC), e.g. 0,6,12,18 (default: all 24)")
    era5.add_argument("--orography", action="store_true", help="also store elevation (m) from ERA5 geopotential")
    era5.add_argument("-o", "--out", default="era5.zarr", help="output Zarr store (default: %(default)s)")
    era5.add_argument("--overwrite", action="store_true", help="replace an existing store holding another fetch")
    era5.add_argument("--retries", type=int, default=3, help="retries per request (default: %(default)s)")
    era5.add_argument("--backoff", type=float, default=30.0,
                      help="seconds before the first retry, doubling after each (default: %(default)s)")
    era5.add_argument("--zarr-format", type=int, default=3, choices=(2, 3), help="for a new store (default: 3)")
    era5.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from geonp.demo import run_demo

        run_demo(out=args.out, steps=args.steps, device=args.device, overwrite=args.overwrite)
    elif args.command == "train":
        from geonp.train import TrainConfig, train

        cfg = TrainConfig.from_yaml(args.config)
        if args.device is not None:
            cfg.device = args.device
        if args.steps is not None:
            cfg.steps = args.steps
        result = train(cfg, resume=args.resume, progress=not args.no_progress)
        print(f"trained {cfg.model} for {result.step} steps: validation NLL {result.val_nll:.4f}; "
              f"model written to {result.out_dir / 'model.safetensors'}")
    elif args.command == "models":
        from geonp.models import available, presets

        for name in available():
            print(f"{name:12s} presets: {', '.join(presets(name))}")
    elif args.command == "fetch":
        if args.source is None:
            raise ValueError("fetch: name a source, e.g. geonp fetch era5 --help")
        from geonp.data.era5 import FetchError, fetch_era5

        try:
            out = fetch_era5(args.variable, args.start, args.end, args.area, args.grid, args.hours, args.out,
                             orography=args.orography, overwrite=args.overwrite, retries=args.retries,
                             backoff=args.backoff, zarr_format=args.zarr_format, verbose=not args.quiet)
        except FetchError as err:  # a network failure, not bad input: exit 1, and say how to resume
            print(f"geonp: error: {err}", file=sys.stderr)
            return EXIT_FAILURE
        print(f"ERA5 store ready: {out}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``geonp`` console script; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("geonp: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"geonp: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as err:  # noqa: BLE001 - one line for users, traceback on request
        if os.environ.get("GEONP_DEBUG"):
            raise
        print(f"geonp: unexpected error: {type(err).__name__}: {err} (set GEONP_DEBUG=1 for details)", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
