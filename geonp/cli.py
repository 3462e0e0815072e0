"""The ``geonp`` command: parses arguments, calls one function, maps errors to exit codes.

Exit codes: 0 success, 2 bad input or usage (one-line message naming the
problem), 1 an unexpected failure or a download that failed after its retries
(one line; set ``GEONP_DEBUG=1`` for the traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import sys
import warnings
from typing import NoReturn

from geonp.fill.finished import finished_message, refused_early
from geonp.fill.options import HISTORY_CHOICES, NUGGET_CHOICES, FillOptions, FitOptions
from geonp.interrupt import catch_ctrl_c
from geonp.output_paths import check_report_path, check_store_path
from geonp.version import __version__

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the problem and where to read more, not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="geonp",
        description="Fill gaps in gridded geospatial fields with neural processes, with calibrated uncertainty.",
    )
    parser.add_argument("--version", action="version", version=f"geonp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = sub.add_parser("demo", help="fill synthetic clouds over HadISST SST (offline, about half a minute on "
                                       "2 CPU cores)")
    demo.add_argument("-o", "--out", default="geonp-demo", help="output folder (default: %(default)s)")
    demo.add_argument("--fit-steps", type=int, default=FitOptions().steps,
                      help="fine-tuning steps on the scene's visible cells (default: %(default)s)")
    demo.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    demo.add_argument("--overwrite", action="store_true", help="replace an existing output folder")

    train = sub.add_parser("train", help="train a model from a YAML configuration")
    train.add_argument("config", help="YAML file with the TrainConfig settings (see geonp.train_config)")
    train.add_argument("--device", default=None, help="auto, cpu or cuda (overrides the config)")
    train.add_argument("--resume", action="store_true", help="continue the run in the config's out_dir")
    train.add_argument("--steps", type=int, default=None, help="total steps (overrides the config)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.add_argument("--ddp", type=int, default=None, metavar="N",
                       help="data-parallel over N processes on this machine (torchrun --standalone; one GPU "
                            "each on CUDA, gloo on CPU); several nodes: run torchrun yourself (README)")

    infill = sub.add_parser(
        "infill", help="fill the gaps of a cube into a CF Zarr store with a 1-sigma uncertainty layer and flags",
        description="Predict every missing cell inside the valid area of each selected variable, window by window "
                    "with halos, and write VAR (observed or predicted), VAR_std (1-sigma) and VAR_flag (0 observed, "
                    "1 infilled, 2 outside the valid area) to a Zarr store. Rerun the same command to resume.")
    infill.add_argument("input", help="cube to fill: Zarr, NetCDF, GRIB or GeoTIFF (path or URL)")
    infill.add_argument("-o", "--out", required=True, help="output Zarr store")
    infill.add_argument("--model", default="te-pt-tnp", help="model name, see `geonp models` (default: %(default)s)")
    infill.add_argument("--var", action="append", default=None, metavar="NAME",
                        help="variable to fill (repeat for several; default: every gridded field)")
    infill.add_argument("--checkpoint", default=None, help="weights to use instead of the bundled ones")
    infill.add_argument("--elevation", default=None, metavar="FILE",
                        help="DEM or ERA5 geopotential: an input of models trained with it, an external drift "
                             "of --model kriging")
    infill.add_argument("--valid-mask", default=None, metavar="VAR|FILE",
                        help="where data may exist (e.g. sea for SST): a variable of INPUT, a mask file, "
                             "'observed' (cells observed at least once) or 'all'; default: INPUT's 'valid', else "
                             "every cell")
    infill.add_argument("--satellite", action="store_true",
                        help="open INPUT as a satellite product (QC flags to gaps, product valid area)")
    infill.add_argument("--fit-steps", type=int, default=FitOptions().steps,
                        help="fine-tune on INPUT's own observations for N steps first (default: %(default)s)")
    infill.add_argument("--calibrate-sigma", action="store_true",
                        help="scale sigma by distance to the nearest observation so that INPUT's own cells, "
                             "hidden under its own gap patterns, get 90%% coverage (slower by --check-windows "
                             "windows' predictions)")
    infill.add_argument("--nugget", choices=NUGGET_CHOICES, default="auto",
                        help="for weights whose kriging head takes the scene's nugget: choose it per field on "
                             "INPUT's own hidden cells, or always the scene's, or always the network's "
                             "(default: %(default)s)")
    infill.add_argument("--history", choices=HISTORY_CHOICES, default=FillOptions.history,
                        help="for weights with history covariates: use each field's history, never use it "
                             "(flat maps, as for one scene), or check it per field on INPUT's own hidden cells "
                             "(default: %(default)s)")
    infill.add_argument("--samples", type=int, default=0, metavar="N",
                        help="also write N coherent samples of the fill as VAR_sample (observed cells as "
                             "observed, filled cells drawn with errors correlated as the scene's variogram "
                             "says; default: none)")
    infill.add_argument("--check-windows", type=int, default=FillOptions.check_windows, metavar="N",
                        help="windows of INPUT's own cells the nugget check, --history auto and "
                             "--calibrate-sigma score (each hides 100-400 cells; default: 32 for the nugget "
                             "check, 64 for the others)")
    infill.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    infill.add_argument("--batch-size", type=int, default=16, help="windows per model call (default: %(default)s)")
    infill.add_argument("--window", default=None, metavar="T,R,C",
                        help="cells each window predicts along time, rows, cols (or R,C: one step) (default: 1,16,16)")
    infill.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="dask.distributed scheduler to spread blocks over (default: this process)")
    infill.add_argument("--workers", type=int, default=None, metavar="N",
                        help="start a local dask cluster of N worker processes and spread blocks over it")
    infill.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    infill.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads, at most the machine's (default: the cores this process may use)")
    infill.add_argument("--zarr-format", type=int, default=3, choices=(2, 3), help="(default: 3)")
    infill.add_argument("--overwrite", action="store_true", help="replace an existing output store")
    infill.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    infill.add_argument("-v", "--verbose", action="store_true",
                        help="after the fill, print how it was made: the model's inputs from the cube's history, "
                             "the noise level chosen and why, sigma's calibration (the store's geonp_* attributes)")

    evaluate = sub.add_parser(
        "evaluate", help="artificial-gap cross-validation of several models on a cube (markdown + JSON table)",
        description="Hide observed cells under real gap patterns of other time steps (random clouds for a single "
                    "scene), infill with each model and score the hidden cells.")
    evaluate.add_argument("input", help="cube or satellite product")
    evaluate.add_argument("--var", action="append", required=True, metavar="NAME", help="variable (repeatable)")
    evaluate.add_argument("--model", action="append", required=True, metavar="NAME", help="model (repeatable)")
    evaluate.add_argument("-o", "--out", default="evaluation.md", help="markdown table; JSON beside it")
    evaluate.add_argument("--checkpoint", action="append", default=[], metavar="MODEL=PATH",
                          help="weights for one model (repeatable)")
    evaluate.add_argument("--valid-mask", default=None, metavar="VAR|FILE", help="as for infill")
    evaluate.add_argument("--satellite", action="store_true", help="open INPUT as a satellite product")
    evaluate.add_argument("--elevation", default=None, metavar="FILE",
                          help="DEM for the models whose weights take elevation and for kriging's external drift "
                               "(the others fill without it)")
    evaluate.add_argument("--fit-steps", type=int, default=FitOptions().steps,
                          help="fine-tuning steps for trainable models, as infill's (default: %(default)s)")
    evaluate.add_argument("--samples", type=int, default=0, metavar="N",
                          help="also score N coherent samples of each fill as a whole (energy and variogram "
                               "scores, coverage of patch and 8x8 block means) beside independent draws")
    evaluate.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    evaluate.add_argument("--seed", type=int, default=0, help="random seed of the hidden cells (default: 0)")
    evaluate.add_argument("--threads", type=int, default=None, metavar="N",
                          help="CPU threads (default: the cores this process may use)")

    plot = sub.add_parser(
        "plot", help="draw an infill output as map panels (observed, truth, mean, sigma, flags) into a PNG",
        description="Cartopy map panels of one variable at one time: observed input, ground truth (--truth), "
                    "predicted mean, 1-sigma and status flags, with coastlines and borders shipped in the package "
                    "(nothing is downloaded). --point adds a cell's time series with its +-2 sigma band.")
    plot.add_argument("output", help="an output store of `geonp infill` (Zarr or NetCDF)")
    plot.add_argument("-o", "--out", required=True, help="PNG to write")
    plot.add_argument("--var", default=None, metavar="NAME", help="filled variable (default: the only one)")
    plot.add_argument("--time", default="0", help="time index or date/time, e.g. 2019-01-01T06 (default: 0)")
    plot.add_argument("--region", default=None, metavar="NAME|S,N,W,E", help="crop to a named region or a box")
    plot.add_argument("--projection", default=None,
                      help="robinson, platecarree, mollweide, orthographic, lambertconformal, mercator, equalearth, "
                           "northpolarstereo, southpolarstereo or native (default: the grid's own CRS)")
    plot.add_argument("--truth", default=None, metavar="FILE", help="complete field on the same grid: adds truth "
                      "and error panels")
    plot.add_argument("--point", default=None, metavar="LAT,LON", help="add this cell's time series")
    plot.add_argument("--select", action="append", default=None, metavar="DIM=VALUE",
                      help="level, member ... to draw, by coordinate value or index (repeatable; default: the first)")
    plot.add_argument("--dpi", type=int, default=110, help="PNG resolution (default: %(default)s)")
    plot.add_argument("--samples", type=int, default=0, metavar="N",
                      help="also draw the first N coherent samples (an output of geonp infill --samples)")

    models = sub.add_parser("models", help="list the model names and their presets")
    models.set_defaults()

    fetch = sub.add_parser("fetch", help="download input data into a local Zarr store")
    sources = fetch.add_subparsers(dest="source", metavar="SOURCE", parser_class=_Parser)
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


def _check_paths(args: argparse.Namespace) -> None:
    """Refuse a missing input, checkpoint or DEM, an ``-o`` that would replace or hold the input
    (:mod:`geonp.output_paths`), and a finished output without ``--overwrite``, before the heavy
    imports (torch, xarray's readers): a typo must cost a second, not the ten it takes to load them."""
    named = {"infill": ("input", "checkpoint", "elevation"), "evaluate": ("input", "elevation")}
    for attr in named.get(args.command, ()):
        path = getattr(args, attr)
        if path is None or ("://" in path and not path.startswith("file://")):
            continue
        local = path[len("file://"):] if path.startswith("file://") else path
        if not os.path.exists(local):
            option = "" if attr == "input" else f"--{attr} "
            raise FileNotFoundError(f"{option}{path}: no such file or directory")
    if args.command == "infill":
        check_store_path(args.out, args.input)
    elif args.command == "evaluate":
        check_report_path(args.out, args.input)
    if args.command == "infill" and not args.overwrite and refused_early(args.out):
        raise FileExistsError(finished_message(args.out))
    pairs = args.checkpoint if args.command == "evaluate" else []  # MODEL=PATH items
    for item in pairs:
        _, _, path = item.partition("=")
        if path and "://" not in path and not os.path.exists(path):
            raise FileNotFoundError(f"--checkpoint {item}: no such file or directory")


def _imports_done(args: argparse.Namespace) -> None:
    """Put what the command imported out of the garbage collector's way (``gc.freeze``), when the
    command is the process (the console script, ``python -m geonp``).

    torch, xarray, dask, pandas and scipy leave about 270,000 long-lived objects (classes, functions,
    modules) that live until the process ends; every full collection walked them again, and so
    did the interpreter's last one at exit: 0.6 s of ``geonp demo``'s 32 s went to that alone.
    Frozen objects are never collected, which is what module-level objects are anyway. Not when
    ``main`` is called with arguments from another program (the tests call it hundreds of times in
    one process): there the freeze would also pin the garbage of every earlier call.
    """
    if args.process:
        gc.freeze()


def _run(args: argparse.Namespace) -> int:
    _check_paths(args)
    if args.command == "demo":
        from geonp.demo import run_demo

        _imports_done(args)
        run_demo(out=args.out, fit_steps=args.fit_steps, device=args.device, overwrite=args.overwrite)
    elif args.command == "train":
        from geonp.train import TrainConfig, train_file

        _imports_done(args)
        if args.ddp is not None:
            TrainConfig.from_yaml(args.config)  # checked here, before starting N processes
            return _train_ddp(args)
        line = train_file(args.config, device=args.device, steps=args.steps, resume=args.resume,
                          progress=not args.no_progress)
        if line:
            print(line)
    elif args.command == "infill":
        from geonp.fill.engine import infill_file

        _imports_done(args)
        options = FillOptions(fit=FitOptions(steps=args.fit_steps), calibrate_sigma=args.calibrate_sigma,
                              nugget=args.nugget, history=args.history, check_windows=args.check_windows,
                              samples=args.samples,
                              batch_size=args.batch_size,
                              seed=args.seed, device=args.device,
                              threads=args.threads, window=args.window)
        infill_file(args.input, args.out, args.var, args.model, satellite=args.satellite, checkpoint=args.checkpoint,
                    elevation=args.elevation, valid_mask=args.valid_mask, options=options, scheduler=args.scheduler,
                    workers=args.workers, zarr_format=args.zarr_format, overwrite=args.overwrite,
                    progress=not args.quiet, command=args.command_line)
        if args.verbose:
            _print_how_made(args.out)
    elif args.command == "evaluate":
        from geonp.evaluate import run_evaluate

        _imports_done(args)
        checkpoints = dict(_pair(c, "--checkpoint") for c in args.checkpoint)
        results = run_evaluate(args.input, args.var, args.model, args.out, valid_mask=args.valid_mask,
                               checkpoints=checkpoints, fit_steps=args.fit_steps, seed=args.seed,
                               satellite=args.satellite, options={"device": args.device, "threads": args.threads},
                               elevation=args.elevation, progress=True, samples=args.samples)
        print(f"wrote {args.out} ({len(results)} variable(s), {len(args.model)} model(s))")
    elif args.command == "plot":
        from geonp.maps import plot_file

        _imports_done(args)
        png = plot_file(args.output, args.out, variable=args.var, time=args.time, region=args.region,
                        projection_name=args.projection, truth=args.truth, point=args.point, dpi=args.dpi,
                        select=args.select, samples=args.samples)
        print(f"wrote {png}")
    elif args.command == "models":
        from geonp.fill.predictor import model_lines

        print("\n".join(model_lines()))
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


#: The store's attributes ``geonp infill -v`` prints, in the words it prints them with.
HOW_MADE = {"geonp_model": "model", "geonp_checkpoint": "weights", "geonp_fit_steps": "fine-tuning steps",
            "geonp_history": "from the cube's history", "geonp_nugget": "noise level (nugget)",
            "geonp_history_used": "history used",
            "geonp_sigma_scales": "sigma calibration"}


def _print_how_made(store: str) -> None:
    """The details of a finished fill that progress leaves out, from its store's attributes."""
    import xarray as xr

    attrs = xr.open_zarr(store).attrs
    for key, words in HOW_MADE.items():
        if key in attrs:
            print(f"{words}: {attrs[key]}")


def _train_ddp(args: argparse.Namespace) -> int:
    """``geonp train --ddp N``: torchrun with N processes on this machine, each running ``geonp.train``."""
    import subprocess

    if args.ddp < 1:
        raise ValueError(f"--ddp must be >= 1 processes, got {args.ddp}")
    forwarded = [args.config] + (["--resume"] if args.resume else []) + (["--no-progress"] if args.no_progress else [])
    forwarded += [] if args.device is None else ["--device", args.device]
    forwarded += [] if args.steps is None else ["--steps", str(args.steps)]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ddp}",
               "-m", "geonp.train", *forwarded]
    code = subprocess.run(command).returncode
    if code != 0:
        print(f"geonp: error: distributed training exited with status {code} (the processes' messages are above)",
              file=sys.stderr)
    return EXIT_OK if code == 0 else EXIT_FAILURE


def _pair(text: str, option: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise ValueError(f"{option} {text!r}: expected MODEL=PATH")
    return name, value


def _resume_hint(args: argparse.Namespace) -> str:
    """What to do after a stop, when a command that resumes left its output behind."""
    out = getattr(args, "out", None)
    if args.command in ("infill", "fetch") and out and os.path.exists(out):
        return f"; run the same command again to resume {out}"
    return ""


def _one_line(err: BaseException) -> str:
    """An error message on one line (some libraries' messages span several)."""
    return " ".join(part.strip() for part in str(err).splitlines() if part.strip())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``geonp`` console script; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.command_line = shlex.join(["geonp", *(sys.argv[1:] if argv is None else argv)])
    args.process = argv is None  # the command is this process: see _imports_done
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    catch_ctrl_c()
    try:
        with warnings.catch_warnings():
            # xarray falls back to cftime for a climate-model calendar or a date beyond
            # datetime64's range and says so on every read; geonp works in cftime there on purpose.
            warnings.filterwarnings("ignore", message="Unable to decode time axis into full numpy.datetime64")
            return _run(args)
    except KeyboardInterrupt:
        print(f"geonp: interrupted{_resume_hint(args)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"geonp: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as err:  # the machine, not the input: a full disk, a read-only folder
        where = f": {err.filename}" if err.filename else ""
        print(f"geonp: error: {err.strerror or err}{where}{_resume_hint(args)}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as err:  # noqa: BLE001 - one line for users, traceback on request
        if os.environ.get("GEONP_DEBUG"):
            raise
        print(f"geonp: unexpected error: {type(err).__name__}: {_one_line(err)} (set GEONP_DEBUG=1 for details)",
              file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
