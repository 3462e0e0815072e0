"""The benchmark pipelines run end to end on tiny budgets and write their tables."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.benchmarks import infill_benchmark, memory, scaling, synthetic_gp


def test_synthetic_gp_pipeline_writes_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "t.md"
    monkeypatch.setattr("sys.argv", ["synthetic_gp"])
    for name in ("cnp", "gp"):  # worker mode in-process, then the report
        synthetic_gp.main(["--json-only", "--models", name, "--max-steps", "5", "--test-tasks", "32",
                           "--gp-tasks", "16", "--gp-fit-steps", "5", "--run-dir", str(tmp_path / "runs")])
    record = json.loads((tmp_path / "runs" / "cnp.json").read_text())
    assert record["steps"] == 5 and set(record["log_likelihood"]) == {f"{s:.1f}" for s in synthetic_gp.SHIFTS}
    args = argparse.Namespace(device="cpu", budget_s=None, max_steps=5, batch_size=16, preset="small", gp_fit_steps=5)
    text = synthetic_gp.write_table(args, [record, json.loads((tmp_path / "runs" / "gp.json").read_text())])
    out.write_text(text)
    assert "| cnp | 5 |" in text and "| gp | 0 |" in text and "commit:" in text


def test_memory_pipeline_reports_each_model(tmp_path):
    # Each (model, pass) runs in its own process, as the committed table's rows did.
    out = tmp_path / "memory.md"
    memory.main(["--models", "te-tnp", "te-pt-tnp", "--nc", "50", "--nt", "20", "--device", "cpu",
                 "--out", str(out)])
    rows = [line for line in out.read_text().splitlines() if line.startswith("| te-")]
    assert len(rows) == 4  # two models x (forward, forward + backward)
    for model in ("te-tnp", "te-pt-tnp"):
        for mode in memory.MODES:
            (row,) = [r for r in rows if r.startswith(f"| {model} | {mode} |")]
            assert "GiB" in row and "failed" not in row


def test_infill_benchmark_measures_a_small_cube(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "infill.md"
    infill_benchmark.main(["--size-gb", "0.0001", "--grid", "64", "--chunk", "32", "--gap-cells", "200",
                           "--gap-steps", "2", "--models", "linear", "--scene", "48", "--tmp", str(tmp_path),
                           "--out", str(out)])
    record = json.loads(out.with_suffix(".json").read_text())
    memory = record["memory"]
    assert memory["shape"] == [6, 64, 64] and memory["blocks"] == 24 and memory["filled"] == memory["gap_cells"] > 0
    assert 0 < memory["import_rss"] < memory["peak_rss"] < infill_benchmark.GOAL_BYTES
    assert record["throughput"][0]["filled"] == record["throughput"][0]["targets"] > 0
    assert "| linear |" in out.read_text() and not list(tmp_path.glob("geonp-infill-bench-*"))


def test_scaling_pipeline_times_cells_and_records_oom(tmp_path, monkeypatch):
    # Cells run as subprocesses of `python -m pipelines.benchmarks.scaling`: from the repository root.
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    out = tmp_path / "scaling.md"
    scaling.main(["--models", "tnp", "--sizes", "100", "200", "--sweeps", "both", "--preset", "tiny",
                  "--out", str(out)])
    record = json.loads(out.with_suffix(".json").read_text())["both"]["tnp"]
    assert [record[k]["status"] for k in ("100", "200")] == ["ok", "ok"]
    assert record["200"]["seconds"] > 0 and record["200"]["peak_bytes"] > 50 * 2**20
    assert "## Table 3" in out.read_text()
    # A limit below what Python + torch need: the first cell is OOM and the larger one not run.
    scaling.main(["--models", "tnp", "--sizes", "100", "200", "--sweeps", "context", "--preset", "tiny",
                  "--mem-limit-gb", "0.05", "--out", str(out)])
    record = json.loads(out.with_suffix(".json").read_text())["context"]["tnp"]
    assert record["100"]["status"].startswith("OOM") and record["200"]["status"].startswith("not run (OOM")


def test_reuse_keeps_rows_not_rerun(tmp_path):
    """A rerun's rows replace the earlier table's for the same (model, fit steps); the rest stay."""
    from pipelines import scene_tables

    def result(rows, donors=(3, -1)):
        return {"source": "s", "seed": 0, "donors": list(donors), "hidden_cells": 10,
                "rows": [{"model": m, "fit_steps": f, "rmse": r, "commit": c} for m, f, r, c in rows]}

    old = result([("te-pt-tnp", 0, 1.0, "old"), ("kriging", 0, 2.0, "old"), ("te-pt-tnp", 200, 0.9, "old")])
    new = result([("te-pt-tnp", 0, 0.5, "new")])
    scene_tables.keep_earlier(new, old, "scene")
    assert sorted((r["model"], r["fit_steps"], r["commit"]) for r in new["rows"]) == [
        ("kriging", 0, "old"), ("te-pt-tnp", 0, "new"), ("te-pt-tnp", 200, "old")]
    with pytest.raises(SystemExit, match="scene: rows to combine hid different cells"):
        scene_tables.keep_earlier(result([]), result([], donors=(4, -1)), "scene")

    path = tmp_path / "t.json"  # a table from before rows carried their commit
    table = {"header": "# T\n\n- commit: abc1234\n", "results": [result([("linear", 0, 1.0, "x")])]}
    del table["results"][0]["rows"][0]["commit"]
    path.write_text(json.dumps(table))
    assert scene_tables.earlier_results(path)["s"]["rows"][0]["commit"] == "abc1234"


def test_satellite_cv_merge_combines_runs(tmp_path):
    from pipelines.benchmarks import satellite_cv

    def table(name, rows, device):
        res = {"source": "s", "variable": "sst", "units": "K", "seed": 0, "steps": 1, "observed_cells": 20,
               "donors": [-1], "hidden_cells": 10, "hidden_fraction": 0.5,
               "rows": [{"model": m, "fit_steps": 0, "rmse": r, "crps": r, "n": 10, "commit": c} for m, r, c in rows]}
        path = tmp_path / name
        path.write_text(json.dumps({"header": f"# T\n\n- device: {device}\n", "results": [res]}))
        return str(path)

    a = table("a.json", [("kriging", 2.0, "c1"), ("te-pt-tnp", 1.0, "c1")], "CPU x")
    b = table("b.json", [("te-pt-tnp", 0.5, "c2")], "GPU y")
    out = tmp_path / "m.md"
    satellite_cv.merge([a, b], str(out))
    rows = json.loads(out.with_suffix(".json").read_text())["results"][0]["rows"]
    assert [(r["model"], r["rmse"], r["commit"]) for r in rows] == [("te-pt-tnp", 0.5, "c2"), ("kriging", 2.0, "c1")]
    text = out.read_text()
    assert "a.json: unrecorded at unrecorded on CPU x" in text and "on GPU y" in text and "| commit |" in text


def test_satellite_cv_renders_committed_table_and_mixes_old_and_new_rows(tmp_path):
    from pipelines.benchmarks import satellite_cv
    from pipelines.provenance import REPO

    committed = REPO / "pipelines" / "results" / "satellite_cv.json"  # rows with and without diagnostics
    before = committed.read_text()
    out = tmp_path / "old.md"
    satellite_cv.merge([str(committed)], str(out))
    assert committed.read_text() == before
    text = out.read_text()
    results = json.loads(before)["results"]
    assert text.count("| model | fit steps | RMSE |") == len(results)
    with_distance = sum(any("rmse_by_distance" in r for r in res["rows"]) for res in results)
    assert text.count("| model | fit steps | 1 (n=") == with_distance  # absent diagnostics: no table
    assert text.count("| model | fit steps | cov50 |") == len(results)

    def table(name, rows, extra):
        res = {"source": "s", "variable": "sst", "units": "K", "seed": 0, "steps": 1, "observed_cells": 20,
               "donors": [-1], "hidden_cells": 10, "hidden_fraction": 0.5, **extra,
               "rows": [{"model": m, "fit_steps": 0, "rmse": 1.0, "n": 10, "commit": "c", **r} for m, r in rows]}
        path = tmp_path / name
        path.write_text(json.dumps({"header": "# T\n", "results": [res]}))
        return str(path)

    new_row = {"coverage_50": 0.5, "pit": [1] * 10,
               "rmse_by_distance": {"1": {"n": 4, "rmse": 0.5, "mae": 0.4}, ">12": {"n": 6, "rmse": 2.0, "mae": 1.5}}}
    new = table("new.json", [("te-pt-tnp", new_row)], {"hidden_by_distance": {"1": 4, ">12": 6}})
    old = table("old.json", [("kriging", {})], {})
    for files in ([new, old], [old, new]):  # whichever file wins, the counts by distance stay
        satellite_cv.merge(files, str(out))
        text = out.read_text()
        assert "| te-pt-tnp | 0 | 0.5 | – | – | – | 2 |" in text and "| kriging | 0 | – | – | – | – | – |" in text
        assert "| 1 (n=4) | 2-3 | 4-6 | 7-12 | >12 (n=6) |" in text
        assert "| te-pt-tnp | 0 | 0.5 | – | – | 1 1 1 1 1 1 1 1 1 1 |" in text


def test_a_table_header_names_the_module_it_was_run_as_and_ignores_its_own_results(monkeypatch):
    """``python -m pipelines.benchmarks.X`` is what a header records, whatever the folder depth, and
    tables the run itself is writing do not mark the commit dirty."""
    import sys

    import torch

    from pipelines import provenance

    script = provenance.REPO / "pipelines" / "benchmarks" / "satellite_cv.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--rows", "a b"])
    text = provenance.header("T", torch.device("cpu"), "none")
    assert "- command: `python -m pipelines.benchmarks.satellite_cv --rows 'a b'`" in text
    monkeypatch.setattr(provenance.subprocess, "run", _git_status({"pipelines/results/x.md"}))
    assert not provenance.git_commit().endswith("-dirty")
    monkeypatch.setattr(provenance.subprocess, "run", _git_status({"geonp/train.py"}))
    assert provenance.git_commit().endswith("-dirty")


def _git_status(modified: set[str]):
    """A stand-in for ``subprocess.run`` answering ``git rev-parse`` and ``git status`` (honouring
    the ``:(exclude)`` pathspec) as a tree with ``modified`` files would."""
    import subprocess

    def run(cmd, **kwargs):
        if cmd[1] == "rev-parse":
            return subprocess.CompletedProcess(cmd, 0, "abc1234\n", "")
        excluded = [c.removeprefix(":(exclude)") for c in cmd if c.startswith(":(exclude)")]
        lines = [f" M {m}" for m in sorted(modified) if not any(m.startswith(e) for e in excluded)]
        return subprocess.CompletedProcess(cmd, 0, "\n".join(lines), "")

    return run


def test_history_reuse_keeps_the_scenes_not_run_now():
    from pipelines.benchmarks.history_cv import with_earlier

    def scene(name, where, rows):
        return {"source": f"{name}: v, validation {where}", "rows": rows}

    earlier = {r["source"]: r for r in (scene("alboran", "steps [0]", ["old"]), scene("olci", "crop a", ["old"]),
                                        scene("soil_moisture", "steps [0]", ["old"]))}
    now = [scene("olci", "crop a", ["new", "old"])]
    kept = with_earlier(now, earlier)
    assert [r["source"].split(":")[0] for r in kept] == ["alboran", "olci", "soil_moisture"]
    assert kept[1]["rows"] == ["new", "old"]  # the scene run now, not its earlier copy
    assert with_earlier(now, {}) == now
    moved = [scene("olci", "crop b", ["new"])]  # a scene whose crop changed replaces its earlier copy
    assert [r["source"] for r in with_earlier(moved, earlier)][1] == "olci: v, validation crop b"
    assert len(with_earlier(moved, earlier)) == 3


def test_device_agreement_says_when_there_is_no_gpu(monkeypatch, tmp_path):
    from pipelines.benchmarks import device_agreement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device here"):
        device_agreement.main(["--out", str(tmp_path / "da")])
    assert not list(tmp_path.iterdir())  # nothing written
    cube = device_agreement.synthetic_cube()
    assert cube.sst.shape == (4, 60, 80) and not cube.valid.values[:5, :5].any()
    assert np.isnan(cube.sst.values[:, 8:16, 10:22]).all()


def test_dineof_speed_compares_the_paths_and_names_a_missing_file(monkeypatch, tmp_path):
    from geonp.tasks import eofs as module
    from pipelines.benchmarks import dineof_speed

    monkeypatch.setenv("GEONP_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="era5_t2m_uk_2019-03_hourly.nc not found"):
        dineof_speed.main(["--out", str(tmp_path / "ds")])
    assert not list(tmp_path.iterdir())  # nothing written
    rng = np.random.default_rng(0)  # a long stack of two patterns, a fifth of it missing
    t = np.arange(module.DENSE_EOF_STEPS + 12)[:, None, None]
    yy, xx = np.mgrid[0:8, 0:9]
    stack = np.sin(t / 7.0) * np.cos(yy / 3.0) + np.cos(t / 11.0) * np.sin(xx / 4.0)
    stack = stack + rng.normal(0, 0.05, stack.shape)
    truth = stack.copy()
    stack[rng.random(stack.shape) < 0.2] = np.nan
    calls = []
    real_eigsh = module.eigsh
    monkeypatch.setattr(module, "eigsh", lambda *a, **k: calls.append(1) or real_eigsh(*a, **k))
    row = dineof_speed.compare("toy", stack, np.ones((8, 9), bool), np.random.default_rng(1).bit_generator.state,
                               list(dineof_speed.PATHS), 2, truth)
    assert calls  # Lanczos ran
    modes = row["modes"].split(" / ")  # the columns' order: eigh, lanczos, block, block-fill-threads, block-device
    rmse = [float(x) for x in row["hidden_rmse"].split(" / ")]
    assert row["steps"] == len(t) and len(set(modes)) == 1 and len(rmse) == 5 and row["shipped"] == "block"
    assert abs(rmse[4] - rmse[2]) < 1e-5 and row["device_diff"] < 1e-9  # torch's iterations (on the CPU) as NumPy's
    assert 0 < row["max_diff"] < 0.01  # the block iteration's fill beside fresh eigendecompositions'
    assert max(rmse) < 0.1 and max(rmse) - min(rmse) < 1e-3  # noise 0.05: every path fills the gaps to it
    assert all(row[k] is not None for k in ("eigh_s", "lanczos_s", "block_s", "block_threads_s", "block_device_s"))
    assert row["device"] == "cpu"
    assert row["threads"] == 2
    only = dineof_speed.compare("toy", stack, np.ones((8, 9), bool), np.random.default_rng(1).bit_generator.state,
                                ["block"], 2)
    assert only["eigh_s"] is None and only["lanczos_s"] is None and only["max_diff"] is None
    assert only["hidden_rmse"] is None
    assert only["block_device_s"] is None and only["device"] is None and only["device_diff"] is None
    table = dineof_speed._table([{**only, "commit": "x"}, {k: v for k, v in row.items() if k not in (
        "block_s", "block_threads_s", "block_device_s", "device", "shipped", "hidden_rmse")}
        | {"fill_threads_s": 3.0}, row], torch.device("cpu"))
    assert "| – |" in table  # a path not run: a dash
    assert "| 3.0 | – | – | – | lanczos |" in table  # a row from before the block iteration: Lanczos shipped
    assert f"| {row['block_device_s']} (cpu, {row['device_diff']:.2g} from block) | block |" in table


def test_fill_speed_reports_the_median_of_repeated_runs_and_every_run():
    """``fill_speed --repeats``: one row per setting, the median wall time and its cells a second,
    every run's time beside it, the largest peak memory; a single run keeps its row as it was."""
    from pipelines.benchmarks.fill_speed import cpu_table, median_row

    runs = [{"case": "demo", "model": "kriging", "threads_asked": "auto", "gap_cells": 1000, "wall_s": w,
             "cells_per_s": round(1000 / w), "peak_gb": p, "contended": False, "commit": "abc"}
            for w, p in ((8.0, 0.9), (7.0, 1.1), (10.0, 1.0))]
    row = median_row(runs)
    assert (row["wall_s"], row["cells_per_s"], row["peak_gb"], row["walls_s"]) == (8.0, 125, 1.1, [8.0, 7.0, 10.0])
    assert median_row(runs[:1]) == runs[0]
    busy = median_row([{**r, "contended": True, "wall_s": 2 * r["wall_s"]} for r in runs])
    line = cpu_table([row, busy])[-1]
    assert "| 8.0 | 16.0 | 2.00 |" in line and line.endswith("| 8.0 7.0 10.0 |")
    # A quiet rerun of other code beside the older contended row: no ratio across the two.
    line = cpu_table([{**row, "commit": "new"}, busy])[-1]
    assert "| 8.0 | 16.0 (abc) | – |" in line
    # Rows of two kinds of machine stay apart (a session may run on either): no ratio across them.
    lines = cpu_table([{**row, "machine": "CPU A"}, {**busy, "machine": "CPU B"}])[2:]
    assert len(lines) == 2
    assert "| 8.0 | – | – |" in lines[0] and "| CPU A |" in lines[0]
    assert "| – | 16.0 | – |" in lines[1] and "| CPU B |" in lines[1]


def test_fill_speed_keeps_gpu_rows_of_each_batch_size_apart():
    """``fill_speed --device cuda --batch-size N``: a row of another batch size is not a rerun of the
    default's; the table names each row's windows a call (16 for rows from before the option)."""
    from geonp.fill.options import FillOptions
    from pipelines.benchmarks.fill_speed import DEFAULT_BATCH, gpu_table, row_key

    assert DEFAULT_BATCH == FillOptions().batch_size

    row = {"case": "stack", "model": "te-pt-tnp", "gap_cells": 100, "wall_s": 4.0, "cells_per_s": 25, "peak_gb": 2.0,
           "contended": False, "commit": "abc"}
    wide = {**row, "batch_size": 128}
    assert row_key(row, True) != row_key(wide, True) and row_key({**row, "batch_size": 16}, True) == row_key(row, True)
    lines = gpu_table([row, wide])
    assert lines[2].startswith("| stack | te-pt-tnp | 16 | 100 | 4.0 |") and "| 128 |" in lines[3]


def test_results_tables_write_one_row_a_line_and_read_back_the_same():
    """Results JSON (pipelines.provenance.rows_json, geonp.skill_table.results_json): the same value
    read back, one row a line, no padding; a table keyed by model is not a list of rows."""
    import json as _json

    import pytest as _pytest

    from geonp.skill_table import results_json
    from pipelines.provenance import rows_json

    rows = [{"model": "a", "rmse": 0.5, "by": {"1": 2}}, {"model": "b", "rmse": None}]
    text = rows_json({"header": "# t\n"}, rows)
    assert _json.loads(text) == {"header": "# t\n", "rows": rows} and text.count("\n") == 4
    assert _json.loads(rows_json({}, [])) == {"rows": []}
    with _pytest.raises(TypeError, match="must be a list"):
        rows_json({"header": ""}, {"a": rows[0]})
    results = [{"source": "x", "rows": rows}, {"source": "y"}]
    assert _json.loads(results_json("# h", results)) == {"header": "# h", "results": results}
    with _pytest.raises(ValueError):
        results_json("# h", [{"rows": [{"v": float("nan")}]}])
