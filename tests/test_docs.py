"""The documentation: the site builds in strict mode, offline; the rendered notebooks are the
notebooks; every function of the API overview has a complete docstring."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API_OVERVIEW = DOCS / "reference" / "index.md"


def _needs(module: str) -> None:
    pytest.importorskip(module, reason=f"{module} is not installed (it comes with pip install -e '.[test]')")


def test_site_builds_strict_offline(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, a page missing from the navigation, a
    docstring cross-reference that resolves to nothing or a bad docstring section fails it."""
    _needs("mkdocs")
    _needs("mkdocstrings_handlers.python")
    _needs("mkdocs_jupyter")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert not re.search(r"^WARNING", log, flags=re.M), log[-6000:]
    home = (site / "index.html").read_text()
    assert "geonp" in home
    # a results page generated from pipelines/results with its figures and provenance
    results = ROOT / "pipelines" / "results"
    page = (site / "results" / "region_transfer_era5_europe_0p25_windows" / "index.html").read_text()
    assert "<img" in page and "commit" in page and "command" in page
    for png in results.glob("*.png"):
        assert (site / "results" / png.name).is_file(), f"pipelines/results/{png.name} is on no page"
    for name in (p.stem for p in results.glob("*.md")):
        assert (site / "results" / name / "index.html").exists(), f"no page for pipelines/results/{name}.md"
    # notebooks rendered with their outputs (figures are inline PNGs)
    for book in sorted((ROOT / "notebooks").glob("*.ipynb")):
        html = (site / "notebooks" / book.stem / "index.html").read_text()
        assert "data:image/png;base64" in html, f"{book.name}: no figure on its page"
    # the API reference: the entry points by name
    engine = (site / "reference" / "api" / "geonp.fill.engine" / "index.html").read_text()
    assert 'id="geonp.fill.engine.infill"' in engine
    assert "geonp infill" in (site / "reference" / "cli" / "index.html").read_text()
    # offline: no page pulls a script, stylesheet or font from the network
    for html_file in site.rglob("*.html"):
        text = html_file.read_text()
        remote = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', text)
        assert not remote, f"{html_file.relative_to(site)} loads {remote[0]}"


def _cells(path: Path) -> list[tuple[str, str]]:
    book = json.loads(path.read_text())
    return [(c["cell_type"], "".join(c["source"])) for c in book["cells"]]


def test_rendered_notebooks_are_the_notebooks():
    """docs/notebooks holds executed copies (the site shows their outputs without running
    anything); they must have the same cells as notebooks/. After editing a notebook, run
    ``python docs/hooks/execute_notebooks.py``."""
    sources = sorted((ROOT / "notebooks").glob("*.ipynb"))
    rendered = sorted((DOCS / "notebooks").glob("*.ipynb"))
    assert [p.name for p in rendered] == [p.name for p in sources], \
        "docs/notebooks differs from notebooks/: run python docs/hooks/execute_notebooks.py"
    for source, copy in zip(sources, rendered):
        assert _cells(copy) == _cells(source), \
            f"docs/notebooks/{copy.name} is stale: run python docs/hooks/execute_notebooks.py {source.name}"
        book = json.loads(copy.read_text())
        code = [c for c in book["cells"] if c["cell_type"] == "code"]
        assert all(c["execution_count"] is not None for c in code), f"{copy.name}: not executed"
        assert not [o for c in code for o in c["outputs"] if o.get("output_type") == "error"], copy.name


# --- docstrings ----------------------------------------------------------------------------------

def public_api() -> list[str]:
    """The objects the API overview page links to (``[text][geonp.path]``)."""
    return sorted(set(re.findall(r"\]\[(geonp(?:\.\w+)+)\]", API_OVERVIEW.read_text())))


def _load_package():
    griffe = pytest.importorskip("griffe", reason="griffe is not installed (it comes with mkdocstrings-python)")
    import logging

    logging.getLogger("mkdocs.plugins.geonp_docs").setLevel(logging.ERROR)
    extensions = griffe.load_extensions(f"{DOCS / 'hooks' / 'griffe_geonp.py'}:GeonpDocstrings")
    return griffe, griffe.load("geonp", search_paths=[str(ROOT)], extensions=extensions,
                               docstring_parser="google", resolve_aliases=False)


def _problems(griffe, obj, documented_as_attributes: bool = False) -> list[str]:
    """What ``obj``'s docstring lacks: parameters not described, a missing Returns section,
    names described that the signature does not have."""
    if obj.docstring is None:
        return [f"{obj.path}: no docstring"]
    sections = obj.docstring.parse("google", warn_missing_types=False, warnings=False)
    described: set[str] = set()
    kinds = set()
    for section in sections:
        kinds.add(section.kind.value)
        if section.kind.value in ("parameters", "other parameters") or (
                documented_as_attributes and section.kind.value == "attributes"):
            described |= {p.name.lstrip("*") for p in section.value}
    function = obj.members["__init__"] if obj.is_class and "__init__" in obj.members else obj
    if obj.is_class and function is obj:
        return []
    params = [p.name for p in function.parameters if p.name not in ("self", "cls")]
    out = []
    missing = [p for p in params if p not in described]
    if missing:
        out.append(f"{obj.path}: parameters not described: {', '.join(missing)}")
    unknown = sorted(described - set(params)) if not documented_as_attributes else []
    if unknown:
        out.append(f"{obj.path}: describes parameters it does not take: {', '.join(unknown)}")
    returns = str(function.returns) if function.returns is not None else ""
    if obj.is_function and obj.name != "__init__" and returns not in ("None", "") and \
            not ({"returns", "yields"} & kinds):
        out.append(f"{obj.path}: no Returns section (returns {returns})")
    if obj.is_function and not returns and not ({"returns", "yields"} & kinds):
        out.append(f"{obj.path}: no return annotation and no Returns section")
    return out


def test_public_functions_have_complete_docstrings():
    """Every function, method and class constructor on the API overview page describes each of
    its parameters (Args) and what it returns (Returns); a dataclass may list its fields as
    Attributes."""
    griffe, package = _load_package()
    problems: list[str] = []
    names = public_api()
    assert len(names) > 20, "the API overview page lists too few objects"
    for path in names:
        try:
            obj = package[path.removeprefix("geonp.")]
        except KeyError:
            problems.append(f"{path}: listed on docs/reference/index.md but not found")
            continue
        if obj.is_alias:
            obj = obj.final_target
        if obj.is_class:
            dataclass = "dataclass" in obj.labels or "dataclass" in {
                str(d.value).rsplit(".", 1)[-1].split("(")[0] for d in obj.decorators}
            problems += _problems(griffe, obj, documented_as_attributes=dataclass)
            for name, member in obj.members.items():
                if member.is_function and not name.startswith("_") and "property" not in member.labels:
                    problems += _problems(griffe, member)
        else:
            problems += _problems(griffe, obj)
    problems = list(dict.fromkeys(problems))  # a method listed on its own and as a member once
    assert not problems, "incomplete docstrings:\n" + "\n".join(problems)
