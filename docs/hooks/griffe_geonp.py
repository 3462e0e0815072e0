"""Griffe extension for the API reference: geonp's docstrings as mkdocstrings should read them.

- Sphinx roles (``:func:`infill```, ``:mod:`geonp.fill.layout```, ``:class:`~geonp.x.Y```) become
  cross-references, resolved the way Python would from the docstring's own module or class. A
  role that names a public geonp object links to its entry (and autorefs fails the strict build
  if the entry is missing); one naming a private or outside object is shown as code; one naming
  nothing that exists is logged as a warning, which fails ``mkdocs build --strict``.
- A module constant documented by ``#:`` comments above it (Sphinx's convention, used across
  geonp) gets those comments as its docstring.
- Undocumented instance attributes (``self.x = ...``, dataclass fields) are left out of the
  reference: the signature or the class's ``Attributes:`` section already names them.
- A ``Returns:`` block whose first line holds a colon gets the return annotation as its type,
  so griffe does not split the prose at that colon.
- An ``Args:`` entry naming several parameters at once (``low, high: the range``, geonp's habit
  for parameters that go together) becomes one entry per parameter with the shared text, so
  each parameter is checked against the signature and listed.
"""

from __future__ import annotations

import logging
import re

import griffe

ROLE = re.compile(r":(?:py:)?(func|meth|class|mod|data|attr|obj|exc|const):`(~?)([\w.]+)(?:\(\))?`")
logger = logging.getLogger("mkdocs.plugins.geonp_docs")


class GeonpDocstrings(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.path != "geonp":
            return
        self._collection = loader.modules_collection
        # Dataclasses get their __init__ from their fields: build it before fields are dropped below
        # (griffe's own dataclass extension runs after this one and skips a class that has one).
        griffe.DataclassesExtension().on_package(pkg=pkg)
        for obj in list(_walk(pkg)):
            if obj.is_attribute and obj.docstring is None and "instance-attribute" in obj.labels:
                # An undocumented field (``self.x = ...``, a dataclass field): the signature or the
                # class's Attributes section says it already; a heading per field is noise.
                del obj.parent.members[obj.name]
                continue
            if obj.is_attribute and obj.docstring is None:
                _comment_docstring(obj)
            if obj.docstring is not None:
                text = ROLE.sub(lambda m, o=obj: self._role(o, m), obj.docstring.value)
                text = split_joint_parameters(text)
                if obj.is_function:
                    text = typed_returns(text, "" if obj.returns is None else str(obj.returns))
                obj.docstring.value = text

    def _lookup(self, path: str) -> griffe.Object | griffe.Alias | None:
        try:
            return self._collection.get_member(path)
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None

    def _resolve(self, obj: griffe.Object, name: str) -> str | None:
        """Full path of ``name`` as seen from ``obj``'s scope, or None when it names nothing."""
        first, _, rest = name.partition(".")
        candidates = [name] if first == "geonp" else []
        scope: griffe.Object | None = obj
        while scope is not None:  # the object, its class, its module, the modules above
            try:
                base = scope.resolve(first)
            except (griffe.NameResolutionError, AttributeError):
                base = None
            if base:
                candidates.append(f"{base}.{rest}" if rest else base)
            scope = scope.parent
        if not candidates and rest:
            return name  # a dotted name whose first part is not in scope: outside the package
        for path in candidates:
            if path.split(".")[0] != "geonp":
                return path  # outside the package: not ours to check
            target = self._lookup(path)
            if target is not None:
                try:
                    return target.final_target.path if target.is_alias else target.path
                except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                    return path if first == "geonp" else None
        return None

    def _role(self, obj: griffe.Object, match: re.Match) -> str:
        kind, short, name = match.groups()
        text = name.rsplit(".", 1)[-1] if short else name
        if kind in ("func", "meth"):
            text += "()"
        path = self._resolve(obj, name)
        if path is None:
            logger.warning("docstring of %s (%s:%s): %s does not name anything in geonp",
                           obj.path, obj.relative_filepath, obj.lineno, match.group(0))
            return f"`{text}`"
        if not path.startswith("geonp") or any(part.startswith("_") for part in path.split(".")):
            return f"`{text}`"
        return f"[`{text}`][{path}]"


SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Params|Keyword Args|Other Parameters):\s*$")
JOINT = re.compile(r"^(\s+)(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)+)(\s*\([^)]*\))?:(.*)$")


def split_joint_parameters(text: str) -> str:
    """``a, b: text`` entries of a Google ``Args:`` section as ``a: text`` and ``b: text``."""
    lines = text.splitlines()
    out: list[str] = []
    section_indent: int | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        header = SECTION.match(line)
        if header:
            section_indent = len(header.group(1))
            out.append(line)
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        if section_indent is not None and line.strip() and indent <= section_indent:
            section_indent = None
        match = JOINT.match(line) if section_indent is not None else None
        if not match or len(match.group(1)) <= section_indent:
            out.append(line)
            i += 1
            continue
        body = [line[len(match.group(1)) + len(match.group(2)) + len(match.group(3) or "") + 1:]]
        i += 1
        while i < len(lines) and (not lines[i].strip() or
                                  len(lines[i]) - len(lines[i].lstrip()) > len(match.group(1))):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        for name in (n.strip() for n in match.group(2).split(",")):
            out.append(f"{match.group(1)}{name}{match.group(3) or ''}:{body[0]}")
            out.extend(body[1:])
    return "\n".join(out)


RETURNS = re.compile(r"^(\s*)(Returns|Yields):\s*$")


def typed_returns(text: str, annotation: str) -> str:
    """A ``Returns:`` block written as prose whose first line holds a colon (``(mask, how): a
    bool ...``) would be read as ``type: description`` and split there; give it the function's
    return annotation as its type instead, so the prose stays whole."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        header = RETURNS.match(line)
        if not header:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j < len(lines) and ":" in lines[j] and len(lines[j]) - len(lines[j].lstrip()) > len(header.group(1)):
            indent = lines[j][: len(lines[j]) - len(lines[j].lstrip())]
            lines[j] = f"{indent}{annotation}: {lines[j].lstrip()}"
    return "\n".join(lines)


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if member.is_alias:
            continue
        yield from _walk(member)


def _comment_docstring(attr: griffe.Attribute) -> None:
    """Give ``attr`` the ``#:`` comment lines right above its assignment as docstring."""
    if attr.lineno is None or not attr.parent or not attr.parent.is_module:
        return
    try:
        lines = attr.parent.lines_collection[attr.filepath]
    except (KeyError, TypeError):
        return
    comments: list[str] = []
    i = attr.lineno - 2
    while i >= 0 and lines[i].lstrip().startswith("#:"):
        comments.insert(0, lines[i].lstrip()[2:].strip())
        i -= 1
    if comments:
        attr.docstring = griffe.Docstring("\n".join(comments), parent=attr, lineno=i + 2)
