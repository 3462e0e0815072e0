"""MkDocs hook: the pages that are generated from the repository at build time.

- ``results/<name>.md`` for every ``pipelines/results/<name>.md``: the table file as it is in the
  repository (its command, device, budget, date and commit in a box at the top), followed by the
  figures ``pipelines/results/<name>_*.png``. A hand-written page ``docs/results/<name>.md`` (the
  discussion that belongs with a table) takes the table where it writes
  ``<!-- geonp:results NAME -->``; ``<!-- geonp:results-index -->`` lists every table.
- ``reference/cli.md``: ``geonp --help`` and each command's ``--help``, from the parser itself.
- ``reference/api/<module>.md``: one mkdocstrings page per module of the ``geonp`` package.

The navigation gets the generated pages appended to its "Results" and "API reference" sections,
so a new results file or module appears without editing ``mkdocs.yml``.
"""

from __future__ import annotations

import argparse
import io
import os
import re
from contextlib import redirect_stdout
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "pipelines" / "results"
PACKAGE = ROOT / "geonp"
MARKER = re.compile(r"<!--\s*geonp:results\s+([\w.-]+)\s*-->")
INDEX_MARKER = "<!-- geonp:results-index -->"
PROVENANCE_KEYS = ("command", "device", "budget", "date", "commit", "versions")


# --- results -------------------------------------------------------------------------------------

def result_names() -> list[str]:
    return sorted(p.stem for p in RESULTS.glob("*.md"))


def figures_of(name: str, names: list[str]) -> list[str]:
    """PNG files of table ``name``: ``<name>_*.png`` not claimed by a longer table name."""
    out = []
    for png in sorted(RESULTS.glob(f"{name}_*.png")):
        owner = max((n for n in names if png.stem.startswith(n + "_")), key=len)
        if owner == name:
            out.append(png.name)
    return out


def split_result(text: str) -> tuple[str, list[str], str]:
    """``(title, provenance lines, body)`` of a results file: its ``# `` title, the ``- key: value``
    lines that follow it, and the rest."""
    lines = text.splitlines()
    title = lines[0][2:].strip() if lines and lines[0].startswith("# ") else ""
    rest = lines[1:] if title else lines
    provenance: list[str] = []
    i = 0
    while i < len(rest) and (not rest[i].strip() or rest[i].startswith("- ")) and (
            rest[i].strip() or not provenance):
        if rest[i].startswith("- "):
            provenance.append(rest[i][2:])
        i += 1
    return title, provenance, "\n".join(rest[i:]).strip()


def _shift_headings(body: str, by: int) -> str:
    out, fenced = [], False
    for line in body.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,5} ", line):
            line = "#" * by + line
        out.append(line)
    return "\n".join(out)


def render_result(name: str, names: list[str], standalone: bool) -> str:
    """Markdown of results table ``name``: provenance box, the file's body, its figures."""
    title, provenance, body = split_result((RESULTS / f"{name}.md").read_text())
    parts = [f"# {title or name}", ""] if standalone else [f"## {title or name}", ""]
    source = f"`pipelines/results/{name}.md`"
    parts += [f'!!! info "How this table was made ({source}, generated at build time)"', ""]
    parts += [f"    - {line}" for line in provenance] or ["    - (the file records no provenance lines)"]
    parts += ["", body if standalone else _shift_headings(body, 1), ""]
    figures = figures_of(name, names)
    if figures:
        parts += ["## Figures" if standalone else "### Figures", ""]
        for png in figures:
            label = png[len(name) + 1:-4].replace("_", " ")
            parts += [f"![{name}: {label}]({png})", "", f"*{label}* (`pipelines/results/{png}`)", ""]
    return "\n".join(parts)


def results_index(names: list[str]) -> str:
    rows = ["| table | date | commit | figures |", "|---|---|---|---:|"]
    for name in names:
        title, provenance, _ = split_result((RESULTS / f"{name}.md").read_text())
        meta = dict(line.split(": ", 1) for line in provenance if ": " in line)
        commit = meta.get("commit", "–").split(" ")[0]
        rows.append(f"| [{title or name}]({name}.md) | {meta.get('date', '–')} | `{commit}` | "
                    f"{len(figures_of(name, names))} |")
    return "\n".join(rows)


# --- command line --------------------------------------------------------------------------------

def _help(parser) -> str:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        parser.print_help()
    return buffer.getvalue().rstrip()


def cli_page() -> str:
    from geonp.cli import _parser

    # argparse wraps to the terminal's width; the page should not depend on it (and fits 80 columns)
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    try:
        return _cli_markdown(_parser())
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def _cli_markdown(parser: argparse.ArgumentParser) -> str:
    parts = ["# Command line", "",
             "Every command and option of `geonp`, as `--help` prints them (generated from the parser "
             "at build time). The [user guide](../guide/infill.md) explains what they do.", "",
             "## `geonp`", "", "```text", _help(parser), "```", ""]

    def walk(p, prefix: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    parts.extend([f"## `{prefix} {name}`", "", "```text", _help(sub), "```", ""])
                    walk(sub, f"{prefix} {name}")

    walk(parser, "geonp")
    return "\n".join(parts)


# --- API reference -------------------------------------------------------------------------------

def modules() -> list[str]:
    """Dotted names of every module of the package, packages first within each folder."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__main__" or any(p.startswith(".") or p == "__pycache__" for p in parts):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return sorted(names, key=lambda n: (n.split(".")[:-1], n.count("."), n))


def module_page(name: str) -> str:
    return f"::: {name}\n"


def _module_nav(names: list[str]) -> list:
    groups: dict[str, list] = {}
    for name in names:
        folder = PACKAGE.parent / name.replace(".", "/")
        package = name if (folder / "__init__.py").is_file() else name.rsplit(".", 1)[0]
        groups.setdefault(package, []).append({name: f"reference/api/{name}.md"})
    return [{package: entries} for package, entries in groups.items()]


# --- MkDocs events -------------------------------------------------------------------------------

def _section(nav: list, title: str) -> list:
    for entry in nav:
        if isinstance(entry, dict) and title in entry:
            return entry[title]
    raise ValueError(f"mkdocs.yml: the nav has no {title!r} section for the generated pages")


def _listed(entries: list) -> set[str]:
    out: set[str] = set()
    for entry in entries:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            if isinstance(value, list):
                out |= _listed(value)
            else:
                out.add(value)
    return out


def on_config(config, **kwargs):
    names = result_names()
    results = _section(config["nav"], "Results")
    listed = _listed(results)
    extra = [f"results/{n}.md" for n in names if f"results/{n}.md" not in listed]
    if extra:
        results.append({"All tables": extra})
    reference = _section(config["nav"], "API reference")
    reference.append({"Modules": _module_nav(modules())})
    return config


def on_files(files: Files, config, **kwargs):
    names = result_names()
    for name in names:
        uri = f"results/{name}.md"
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, content=f"<!-- geonp:results {name} -->\n"))
        for png in figures_of(name, names):
            files.append(File.generated(config, f"results/{png}", abs_src_path=str(RESULTS / png)))
    files.append(File.generated(config, "reference/cli.md", content=cli_page()))
    for name in modules():
        files.append(File.generated(config, f"reference/api/{name}.md", content=module_page(name)))
    return files


def on_page_markdown(markdown: str, page, config, files, **kwargs):
    names = result_names()
    if INDEX_MARKER in markdown:
        markdown = markdown.replace(INDEX_MARKER, results_index(names))

    def table(match: re.Match) -> str:
        name = match.group(1)
        if name not in names:
            raise ValueError(f"{page.file.src_uri}: no pipelines/results/{name}.md")
        standalone = not markdown.lstrip().startswith("# ")
        return render_result(name, names, standalone)

    return MARKER.sub(table, markdown)
