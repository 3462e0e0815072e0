"""Safe loading (issue #16 §4): nothing geonp reads can run code.

A scan of every module in geonp/ and pipelines/ for the calls that can execute what a file
holds: ``torch.load`` without ``weights_only=True``, ``pickle``/``dill``/``joblib`` loading,
``yaml.load``/``unsafe_load``/``full_load`` (``safe_load`` only), ``numpy.load`` with
``allow_pickle=True``, and the builtins ``eval``/``exec``. The checkpoint reader's own refusal
of a pickle payload is a case of tests/test_bad_input.py; credentials never printed, of
tests/test_era5.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.joinpath("geonp").rglob("*.py"), *ROOT.joinpath("pipelines").rglob("*.py")])


def _name(node: ast.expr) -> str:
    """Dotted name of a called function (``torch.load``, ``yaml.safe_load``, ``eval``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _keyword(call: ast.Call, name: str) -> object:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value.value if isinstance(kw.value, ast.Constant) else "not a constant"
    return None


def unsafe_calls(source: str) -> list[str]:
    """``"line: call"`` for each call in ``source`` that could execute code from a file."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        bad = (
            (name.endswith("torch.load") and _keyword(node, "weights_only") is not True)
            or name.split(".")[0] in ("pickle", "dill", "cloudpickle", "joblib", "marshal", "shelve")
            and name.split(".")[-1] in ("load", "loads", "open", "Unpickler")
            or name in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all", "yaml.unsafe_load_all")
            or (name in ("np.load", "numpy.load") and _keyword(node, "allow_pickle") not in (None, False))
            or name in ("eval", "exec")
        )
        if bad:
            found.append(f"{node.lineno}: {name}")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_can_run_code_from_a_file(path: Path) -> None:
    assert unsafe_calls(path.read_text()) == []


def test_the_scan_finds_what_it_looks_for() -> None:
    risky = "\n".join([
        "torch.load(f)", "torch.load(f, weights_only=False)", "pickle.loads(b)", "yaml.load(t)",
        "np.load(f, allow_pickle=True)", "eval(s)", "exec(s)",
    ])
    assert len(unsafe_calls(risky)) == 7
    fine = "\n".join(["torch.load(f, weights_only=True)", "yaml.safe_load(t)", "np.load(f)", "model.eval()"])
    assert unsafe_calls(fine) == []



def test_whole_file_writes_get_the_usual_permissions(tmp_path):
    """A file written whole-or-not-at-all gets the permissions of any new file (0666 less the
    umask), not only its owner's as the temporary file it started from."""
    import geonp.atomic

    path = geonp.atomic.write_text_atomic(tmp_path / "table.md", "x")
    plain = tmp_path / "plain.md"
    plain.write_text("x")
    assert path.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
