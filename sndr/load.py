"""Load patch files (``patches/*.toml``) into validated :class:`Patch` models.

Patch files are data: they are parsed with ``tomllib`` and validated, never
executed or imported. Every error names the file, and the key or line.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import typing
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ValidationError

from . import env
from .errors import EXIT_BAD_INPUT, Problem, SndrError
from .model import Patch, canonical_json
from .state import STATE_DIR


def shipped_patches_dir() -> Path:
    """The patch set shipped with sndr (the rule lives in :func:`sndr.env.shipped_dir`)."""
    return env.shipped_patches_dir()


def _shipped(name: str) -> Path:
    return env.shipped_dir(name)


def shipped_anchors_dir() -> Path:
    return _shipped("anchors")


@dataclass
class PatchSet:
    patches: list[Patch]
    directory: Path | None = None
    sources: dict[str, str] = field(default_factory=dict)  # id -> file the patch came from
    #: What is accepted but said (a file name that disagrees with its id): apply prints them as notes.
    warnings: list[Problem] = field(default_factory=list)

    @cached_property
    def by_id(self) -> dict[str, Patch]:
        return {p.id: p for p in self.patches}

    def source_of(self, patch_id: str) -> str:
        return self.sources.get(patch_id, patch_id)

    def digest(self, ids: list[str] | None = None) -> str:
        """sha256 over the canonical form of the given (default: all) patches, in order."""
        import hashlib

        chosen = self.patches if ids is None else [self.by_id[i] for i in ids]
        blob = canonical_json([p.model_dump(mode="json") for p in chosen])
        return hashlib.sha256(blob.encode()).hexdigest()


# ----------------------------------------------------------------------------- line lookup

TOML_LINE = re.compile(r"at line (\d+)", re.I)


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]")


def _toml_lines(lines: list[str]) -> tuple[list[bool], list[tuple[int, str, bool]]]:
    """(does line n start outside a multi-line string, [(line, table name, array?)] of the headers)."""
    outside: list[bool] = []
    headers: list[tuple[int, str, bool]] = []
    quote: str | None = None
    for n, ln in enumerate(lines):
        outside.append(quote is None)
        if quote is None:
            m = _HEADER.match(ln)
            if m:
                headers.append((n, m.group(2).replace(" ", ""), m.group(1) == "[["))
        pos = 0
        while True:
            if quote is None:
                hits = [(i, q) for q in ("'''", '"""') if (i := ln.find(q, pos)) != -1]
                if not hits:
                    break
                i, quote = min(hits)
            else:
                i = ln.find(quote, pos)
                if i == -1:
                    break
                quote = None
            pos = i + 3
    return outside, headers


def key_line(text: str, loc: tuple) -> int | None:
    """Best-effort line of a pydantic error location inside the TOML text.

    ``loc`` looks like ``('files', 0, 'edits', 2, 'anchor')``: the n-th
    ``[[files.edits]]`` *within* its ``[[files]]`` entry is found, then the key
    among that table's own lines (before its next header; lines inside
    multi-line strings never count). A key that is not there (a missing key)
    points at its table's header line (line 1 for the top-level table).
    """
    lines = text.splitlines()
    outside, headers = _toml_lines(lines)
    lo, hi, header = 0, len(lines), None  # the current table: its lines [lo, hi) and header line
    table = ""
    parts = list(loc)
    i = 0
    while i < len(parts):
        part = parts[i]
        if i + 1 < len(parts) and isinstance(parts[i + 1], int):
            table = f"{table}.{part}" if table else str(part)
            hits = [n for n, name, arr in headers if arr and name == table and lo <= n < hi]
            if parts[i + 1] >= len(hits):
                return header + 1 if header is not None else None
            header = lo = hits[parts[i + 1]]
            hi = next((n for n, name, _ in headers if n > lo and not name.startswith(table + ".")), len(lines))
            i += 2
            continue
        key = re.compile(r"^\s*[\"']?" + re.escape(str(part)) + r"[\"']?\s*=")
        own_end = next((n for n, _, _ in headers if lo < n < hi or (header is None and n < hi)), hi)
        for n in range(lo if header is None else lo + 1, own_end):
            if outside[n] and key.match(lines[n]):
                return n + 1
        name = f"{table}.{part}" if table else str(part)  # written as a table: [name] or [[name]]
        own = [n for n, hname, _ in headers if hname == name and (lo <= n < hi)]
        if own:
            return own[0] + 1
        return header + 1 if header is not None else 1
    return header + 1 if header is not None else None


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model of the table at a pydantic location (``('files', 0)`` -> FileEdits), or None."""
    model: type[BaseModel] = Patch
    for part in loc:
        if isinstance(part, int):
            continue
        field_ = model.model_fields.get(str(part))
        if field_ is None:
            return None
        ann = field_.annotation
        inner = typing.get_args(ann)[0] if typing.get_origin(ann) is list and typing.get_args(ann) else ann
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return None
        model = inner
    return model


def _fields_at(loc: tuple) -> list[str]:
    model = _model_at(loc)
    if model is None:
        return []
    return sorted({n for n, f in model.model_fields.items()} | {f.alias for f in model.model_fields.values() if f.alias})


def _is_table_list(loc: tuple, name: str) -> bool:
    """Is ``name`` in the table at ``loc`` an array of tables (``[[files]]``)?"""
    model = _model_at(loc)
    field_ = model.model_fields.get(name) if model is not None else None
    if field_ is None:
        return False
    args = typing.get_args(field_.annotation)
    return typing.get_origin(field_.annotation) is list and bool(args) and isinstance(args[0], type) and \
        issubclass(args[0], BaseModel)


def _header_of(loc: tuple, name: str) -> str:
    return "[[" + ".".join([str(p) for p in loc if not isinstance(p, int)] + [name]) + "]]"


def loc_str(loc: tuple) -> str:
    """A pydantic error location as a dotted path with indices: ``files[0].edits[1].anchor``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


# Bounds checked before a patch file is parsed (issue 23): the largest shipped patch
# file is a few KiB, and nothing a patch needs nests or dots keys this deep.
MAX_PATCH_BYTES = 1 << 20
MAX_NESTING = 32
MAX_KEY_PARTS = 64
#: Text edits and ``create`` stay inside these top-level packages of the tree.
PACKAGE_ROOTS = ("vllm",)


_SHAPE_TOKEN = re.compile(r"""'''|\"\"\"|["'#\n\[\]{}.]""")


def _close_quote(text: str, quote: str, start: int) -> int:
    """Index just past the string that opens at ``start`` (``quote`` is its delimiter), or -1."""
    k = start + len(quote)
    while True:
        j = text.find(quote, k)
        if j < 0:
            return -1
        if len(quote) == 1 and "\n" in text[k:j]:
            return -1  # unterminated one-line string: tomllib says where
        if quote[0] == '"':
            bs = 0
            while text[j - 1 - bs] == "\\":
                bs += 1
            if bs % 2:
                k = j + 1
                continue
        j += len(quote)
        if len(quote) == 3:  # a closing run may be longer (quotes at the string's end)
            while j < len(text) and text[j] == quote[0]:
                j += 1
        return j


def _check_shape(text: str, source: str) -> None:
    """Refuse nesting and dotted keys beyond the bounds before ``tomllib`` sees them.

    A linear scan that skips strings and comments: it counts open ``[``/``{``
    and the dots on one line, so a hostile file costs microseconds, never a
    recursion error or a quadratic parse.
    """
    depth = dots = 0
    line = 1
    pos = 0
    search = _SHAPE_TOKEN.search
    while True:
        m = search(text, pos)
        if m is None:
            return
        t, i = m.group(), m.start()
        pos = i + 1
        if t == "\n":
            line += 1
            dots = 0
        elif t == "#":
            j = text.find("\n", i)
            if j < 0:
                return
            pos = j
        elif t[0] in "'\"":
            j = _close_quote(text, t, i)
            if j < 0:
                return  # unterminated: tomllib reports it with its line
            line += text.count("\n", i, j)
            pos = j
        elif t in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise SndrError(Problem("too_deep", f"arrays or tables nested more than {MAX_NESTING} deep",
                                        file=source, line=line, hint="a patch file never needs this; check the file"))
        elif t in "]}":
            depth = max(0, depth - 1)
        else:  # "."
            dots += 1
            if dots >= MAX_KEY_PARTS:
                raise SndrError(Problem("too_deep", f"a key or line with more than {MAX_KEY_PARTS} dotted parts",
                                        file=source, line=line, hint="a patch file never needs this; check the file"))


def _confine(patch: Patch, text: str, source: str) -> None:
    """Text edits and ``create`` stay inside the package: ``vllm/...`` only (see :data:`PACKAGE_ROOTS`).

    For an installed vLLM the tree root is site-packages: a ``*.pth`` or
    another package there runs at every interpreter start, and ``.sndr/`` is
    sndr's own state. All are refused here, at load time, with the line.
    """
    roots = "/, ".join(PACKAGE_ROOTS) + "/"
    problems = []
    for i, f in enumerate(patch.files):
        parts = f.path.split("/")
        why = None
        if parts[0] == STATE_DIR:
            why = "is in sndr's own state directory"
        elif parts[0] not in PACKAGE_ROOTS or len(parts) < 2:
            why = f"is outside the {roots} package"
        elif f.path.endswith(".pth"):
            why = "is a .pth file, which Python runs at interpreter start"
        if why:
            problems.append(Problem("path_outside_package", f"path {f.path!r} {why}; patches change files inside "
                                    f"{roots} only", file=source, line=key_line(text, ("files", i, "path")),
                                    key=f"files[{i}].path"))
    if problems:
        raise SndrError(problems)


def parse_patch(text: str, source: str) -> Patch:
    """Parse and validate one patch file's text. ``source`` names it in errors."""
    if len(text) > MAX_PATCH_BYTES:
        raise SndrError(Problem("too_large", f"patch file is {len(text)} characters, over the {MAX_PATCH_BYTES} limit",
                                file=source))
    _check_shape(text, source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = TOML_LINE.search(str(exc))
        raise SndrError(Problem("toml_syntax", f"malformed TOML: {exc}", file=source,
                                line=int(m.group(1)) if m else None,
                                hint="patch files are TOML; use literal strings ('''...''') for code")) from None
    except RecursionError:
        raise SndrError(Problem("too_deep", "nested too deeply to parse", file=source)) from None
    except ValueError as exc:  # an integer over Python's 4300-digit limit
        raise SndrError(Problem("too_large", f"a value is too large: {exc}", file=source,
                                hint="integers in patch files are small; check the file")) from None
    try:
        patch = Patch.model_validate(data)
    except RecursionError:
        raise SndrError(Problem("too_deep", "nested too deeply to validate", file=source)) from None
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err.get("loc", ()))
            loc += tuple(getattr((err.get("ctx") or {}).get("error"), "loc", ()))  # model.LocatedError's key
            msg = err.get("msg", "invalid")
            if err.get("type") == "extra_forbidden":
                msg = f"unknown key {loc[-1]!r}"
                near = difflib.get_close_matches(str(loc[-1]), _fields_at(loc[:-1]), n=1)
                if near:
                    msg += f" (did you mean {near[0]!r}?" + (
                        f" {_header_of(loc[:-1], near[0])} is an array of tables)" if _is_table_list(loc[:-1], near[0])
                        else ")")
            elif err.get("type") == "list_type" and _is_table_list(loc[:-1], str(loc[-1])) and \
                    isinstance(err.get("input"), dict):
                msg = (f"{loc[-1]} is an array of tables: write {_header_of(loc[:-1], str(loc[-1]))} "
                       f"(double brackets), one per entry")
            elif msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            problems.append(Problem("bad_patch", msg, file=source, line=key_line(text, loc),
                                    key=loc_str(loc) or None))
        raise SndrError(problems) from None
    _confine(patch, text, source)
    return patch


def load_patch_file(path: Path) -> Patch:
    from . import fsio

    try:
        raw = fsio.read_regular(path, MAX_PATCH_BYTES, "patch file")
    except fsio.FileProblem as exc:
        code = "too_large" if exc.code == "file_too_large" else exc.code
        raise SndrError(Problem(code, exc.message, file=str(path))) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SndrError(Problem("not_utf8", "patch file is not UTF-8", file=str(path), line=line)) from None
    return parse_patch(text, str(path))


def patch_files(directory: Path) -> list[Path]:
    """Patch files of a directory: every ``*.toml`` whose name does not start with ``_``.

    A directory that cannot be listed (permissions, I/O) is an error naming it (``unreadable``,
    exit 2), never an empty set: an empty set applied reverts every file the ledger holds.
    """
    try:
        with os.scandir(directory) as it:
            names = [e.name for e in it]
    except OSError as exc:
        raise SndrError(Problem("unreadable", f"cannot list the patch directory: {exc.strerror}",
                                file=str(directory), key="--patches",
                                hint="make it readable (r and x) by this user, or point --patches / "
                                     "$SNDR_PATCHES at another directory"), EXIT_BAD_INPUT) from None
    return sorted(directory / n for n in names if n.endswith(".toml") and not n.startswith("_"))


def subdir_problems(directory: Path) -> list[Problem]:
    """Patch files in a subdirectory are not read (only the directory's own ``*.toml`` are patches), but
    never left out silently: each subdirectory that holds some is said (``patch_subdir``, a note), except
    ``_``- and ``.``-named ones, which are not patches, like ``_`` files."""
    out: list[Problem] = []
    try:
        with os.scandir(directory) as it:
            subdirs = sorted(e.path for e in it if e.is_dir(follow_symlinks=False) and e.name[:1] not in "_.")
    except OSError:
        return out  # patch_files names an unreadable directory
    for sub in subdirs:
        try:
            found = sorted(str(p.relative_to(sub)) for p in Path(sub).rglob("*.toml")
                           if not any(part[:1] in "_." for part in p.relative_to(sub).parts))
        except OSError:
            continue
        if found:
            more = f" and {len(found) - 3} more" if len(found) > 3 else ""
            out.append(Problem("patch_subdir", f"{len(found)} patch file(s) in this subdirectory are not read "
                               f"({', '.join(found[:3])}{more}): sndr reads the patch directory's own *.toml only",
                               file=sub, hint=f"move them up into {directory}, or name the folder with a leading "
                               "'_' to keep them out on purpose"))
    return out


def name_problem(patch: Patch, path: Path) -> Problem | None:
    """A patch file is ``<ID>-<slug>.toml`` (or ``<ID>.toml``; docs/format.md): a name that disagrees with
    its ``id`` (a copied file whose id was not changed, or the reverse) is said (``name_mismatch``, at
    the id's line). A warning, not an error: a set may order its files by name (``S001-x.toml``)."""
    stem = path.name[: -len(".toml")] if path.name.endswith(".toml") else path.name
    if stem == patch.id or stem.startswith(patch.id + "-"):
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    return Problem("name_mismatch", f"the file name {path.name} does not start with its id {patch.id} "
                   f"(a patch file is <ID>-<slug>.toml)", file=str(path), line=key_line(text, ("id",)) if text else None,
                   key="id", patch=patch.id,
                   hint=f"rename the file to {patch.id}-{stem.split('-', 1)[-1]}.toml, or fix its id")


def load_patch_set(directory: Path | str | None = None, *, packs: bool = True, environ=None) -> PatchSet:
    """Load and cross-check every patch of a directory (default: :func:`sndr.env.patches_dir`,
    i.e. ``$SNDR_PATCHES`` or the shipped set).

    With ``packs``, patches from installed plugin packs (entry point group
    ``sndr.patches``) are added; see :mod:`sndr.packs`.
    """
    from_env = directory is None and env.patches_dir(environ) != env.shipped_patches_dir()  # set by $SNDR_PATCHES
    directory = Path(directory) if directory is not None else env.patches_dir(environ)
    if not directory.is_dir():
        if directory.exists():
            raise SndrError(Problem("patches_not_a_dir", "the patch directory is a file, not a directory",
                                    file=str(directory), key="--patches",
                                    hint=f"pass the directory that holds it: --patches {directory.parent}"
                                    if directory.suffix == ".toml" else "pass the directory that holds the "
                                    "patch files (*.toml)"), EXIT_BAD_INPUT)
        raise SndrError(Problem("patches_dir_missing", "patch directory does not exist", file=str(directory),
                                hint=f"it comes from ${env.PATCHES}: point it at your patch directory, pass --patches "
                                "DIR, or unset it for the shipped set" if from_env else None))
    patches: list[Patch] = []
    sources: dict[str, str] = {}
    problems: list[Problem] = []
    warnings: list[Problem] = []
    files = patch_files(directory)
    warnings += subdir_problems(directory)
    for path in files:
        try:
            patch = load_patch_file(path)
        except SndrError as exc:
            problems.extend(exc.problems)
            continue
        misnamed = name_problem(patch, path)
        if misnamed is not None:
            warnings.append(misnamed)
        if patch.id in sources:
            problems.append(Problem("duplicate_id", f"patch id {patch.id} is also defined in {sources[patch.id]}",
                                    file=str(path), key="id",  # the file just loaded: its id's line
                                    line=key_line(path.read_text(encoding="utf-8", errors="replace"), ("id",))))
            continue
        outside = _code_outside(patch, str(path))
        if outside:
            problems.extend(outside)
            continue
        sources[patch.id] = str(path)
        patches.append(patch)
    if packs:
        for patch, source in _pack_patches():
            if patch.id in sources:
                problems.append(Problem("duplicate_id", f"plugin pack patch {patch.id} shadows {sources[patch.id]}",
                                        file=source, key="id",
                                        hint="pack patch ids must be namespaced (e.g. ACME_0001)"))
                continue
            sources[patch.id] = source
            patches.append(patch)
    problems.extend(_cross_check(patches, sources))
    if problems:
        raise SndrError(problems, EXIT_BAD_INPUT)
    return PatchSet(patches=patches, directory=directory, sources=sources, warnings=warnings)


def _pack_patches() -> list[tuple[Patch, str]]:
    """``(Patch, source)`` for every patch of every installed pack (:func:`sndr.packs.discover`): ids namespaced
    by the pack's prefix, runtime code inside the pack or sndr."""
    from .packs import discover, module_allowed

    problems: list[Problem] = []
    out: list[tuple[Patch, str]] = []
    for pack in discover():
        for d in pack.dirs:
            for path in patch_files(Path(d)):
                try:
                    patch = load_patch_file(path)
                except SndrError as exc:
                    problems.extend(exc.problems)
                    continue
                if not patch.id.upper().startswith(pack.prefix):
                    problems.append(Problem("pack_id_namespace",
                                            f"pack {pack.name}: patch id {patch.id} is not namespaced",
                                            file=str(path), key="id",
                                            hint=f"ids of pack {pack.name!r} must start with {pack.prefix!r}, "
                                                 f"e.g. {pack.prefix}0001"))
                    continue
                bad = [r for r in patch.runtime if not module_allowed(r.replacement.split(":", 1)[0], pack.module)]
                if patch.module and not module_allowed(patch.module, pack.module):
                    problems.append(Problem("pack_module_outside", f"pack {pack.name}: module {patch.module} is outside "
                                            f"the pack ({pack.module}) and sndr", file=str(path), key="module"))
                    continue
                if bad:
                    problems.append(Problem("pack_module_outside",
                                            f"pack {pack.name}: runtime replacement {bad[0].replacement} is outside "
                                            f"the pack ({pack.module}) and sndr", file=str(path), key="runtime.replacement"))
                    continue
                out.append((patch, str(path)))
    if problems:
        raise SndrError(problems)
    return out


def _code_outside(patch: Patch, source: str) -> list[Problem]:
    """Runtime code from outside ``sndr`` (and the pack that ships ``source``): refused at load time with the
    line, as the startup hook refuses it (:func:`sndr.packs.module_allowed`), so apply and --verify never say
    ok for a patch no vLLM process would run."""
    from .packs import module_allowed

    named: list[tuple[tuple[str | int, ...], str]] = [
        (("runtime", i, "replacement"), r.replacement.split(":", 1)[0]) for i, r in enumerate(patch.runtime)]
    if patch.module:
        named.append((("module",), patch.module))
    bad = [(loc, mod) for loc, mod in named if not module_allowed(mod)]
    if not bad:
        return []
    from .packs import pack_of_source

    pack = pack_of_source(source)
    allowed = ["sndr"] + ([pack.module] if pack is not None else [])
    bad = [(loc, mod) for loc, mod in bad if not module_allowed(mod, *allowed[1:])]
    if not bad:
        return []
    try:
        text = Path(source).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return [Problem("module_outside", f"module {mod} is outside {' and '.join(allowed)}: no vLLM process would run "
                    f"its code (the startup hook refuses it)", file=source, line=key_line(text, loc) if text else None,
                    key=loc_str(loc), patch=patch.id, hint="runtime code lives in sndr or in the plugin pack that "
                    "ships the patch") for loc, mod in bad]


def _source_line(source: str | None, key: str, value: str | None = None) -> int | None:
    """Line of ``key = [...]`` (the one naming ``value`` when given) in a patch file; only read on errors."""
    if not source or not source.endswith(".toml"):
        return None
    try:
        lines = Path(source).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    start = re.compile(r"^\s*" + re.escape(key) + r"\s*=")
    for n, line in enumerate(lines):
        if start.match(line):
            if value is None:
                return n + 1
            for m in range(n, min(n + 50, len(lines))):  # a multi-line array
                if f'"{value}"' in lines[m] or f"'{value}'" in lines[m]:
                    return m + 1
                if "]" in lines[m]:
                    break
            return n + 1
    return None


def _cross_check(patches: list[Patch], sources: dict[str, str]) -> list[Problem]:
    ids = {p.id for p in patches}
    problems = []
    for p in patches:
        for key in ("requires", "after", "conflicts"):
            for other in getattr(p, key):
                if other not in ids:
                    src = sources.get(p.id)
                    problems.append(Problem("unknown_id", f"{key} names unknown patch {other}",
                                            file=src, line=_source_line(src, key, other), key=key, patch=p.id))
    # Ordering cycles: requires and after both order, so a cycle through either is an error.
    graph = {p.id: [(r, "requires") for r in p.requires if r in ids] + [(a, "after") for a in p.after if a in ids]
             for p in patches}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt, key in graph[node]:
            if state.get(nxt) == 1:
                cyc = stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt]
                src = sources.get(node)
                problems.append(Problem("requires_cycle", ("requires cycle: " if key == "requires" else "ordering cycle (after): ") + " -> ".join(cyc),
                                        file=src, line=_source_line(src, key, nxt), key=key, patch=node))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for pid in sorted(graph):
        if pid not in state:
            visit(pid, [pid])
    return problems
