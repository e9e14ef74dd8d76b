"""Judging one upstream change on the current tree (simulated in memory).

Every upstream change is read as an edit: the hunk's pre-image is the anchor
and its post-image the replacement.

- ``satisfied``: the post-image is already present;
- ``applicable``: the pre-image is present (and, for a block that only adds
  lines, its context is distinctive and it defines nothing the file already
  defines);
- ``review``: a human must look: the added block's context is too generic to
  place it, or a definition it adds already exists in the file in another
  form: decided on the whole commit and by the enclosing class
  (:func:`commit_twins`), so a base method and its override, an in-file move
  or a same-named method of another class are not twins;
- ``conflict``: neither image is present (a port by hand).

Images are tried with full context, then with one and zero context lines per
end; a reduced image must be unique and carry at least ``FUZZ_MIN_CHARS`` of
non-blank text to count as evidence.

A hunk that needed fuzz, review or a port by hand names the local patch whose
lines sit next to it (:func:`local_marks`, :func:`local_patches_near`).
"""

from __future__ import annotations

import ast
import functools
import keyword
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Literal

from pydantic import BaseModel, Field

from ..errors import SndrError
from ..plan import Reader
from .diff import Hunk
from .gitio import GitFileChange

__all__ = ["FUZZ_MIN_CHARS", "MIN_DISTINCT_CONTEXT", "FileResult", "HunkResult", "LocalMarks", "Reader", "SimTree",
           "aggregate", "classify_change", "classify_hunk", "commit_reason", "def_table", "local_marks",
           "local_patches_near", "tree_reader"]

FUZZ_MIN_CHARS = 12  # a reduced-context image must carry at least this much non-blank text
#: Lines of distinctive context a block that only adds lines needs before it is judged applicable.
MIN_DISTINCT_CONTEXT = 2
Judgement = Literal["satisfied", "applicable", "review", "conflict"]
_RANK: dict[Judgement, int] = {"satisfied": 0, "applicable": 1, "review": 2, "conflict": 3}




class SimTree:
    """An in-memory overlay on the current tree: ported changes live here, never on disk."""

    def __init__(self, read: Reader, overlay: dict[str, str | None] | None = None):
        self._read = read
        self.overlay: dict[str, str | None] = dict(overlay or {})

    def read(self, path: str) -> str | None:
        if path in self.overlay:
            return self.overlay[path]
        return self._read(path)

    def write(self, path: str, text: str | None) -> None:
        self.overlay[path] = text

    def fork(self) -> SimTree:
        return SimTree(self._read, self.overlay)


def _line_starts_find(text: str, block: str) -> list[int]:
    """Offsets where ``block`` occurs in ``text`` starting at a line start."""
    hits, i = [], text.find(block)
    whole = block.endswith("\n")
    while i >= 0:
        # a block without a final newline is the end of its file: it must end the text too
        if (i == 0 or text[i - 1] == "\n") and (whole or i + len(block) == len(text)):
            hits.append(i)
        i = text.find(block, i + 1)
    return hits


def _offset_of_line(text: str, line: int) -> int:
    pos = 0
    for _ in range(max(0, line - 1)):
        nl = text.find("\n", pos)
        if nl < 0:
            return len(text)
        pos = nl + 1
    return pos


def _substantial(block: str) -> bool:
    return len(re.sub(r"\s", "", block)) >= FUZZ_MIN_CHARS


_GENERIC = frozenset(keyword.kwlist) | {"self", "cls", "None", "True", "False", "super", "args", "kwargs",
                                         "int", "str", "bool", "float", "dict", "list", "tuple", "object"}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_DEF = re.compile(r"^(?P<indent>[ \t]*)(?:async[ \t]+def|def|class)[ \t]+(?P<name>[A-Za-z_][A-Za-z0-9_]*)")


def distinctive(line: str) -> bool:
    """A context line that can place a block: it names something other than keywords and ``self``."""
    s = line.strip()
    return len(s) >= 6 and any(w not in _GENERIC for w in _WORD.findall(s))


def _defined(lines: Iterable[str]) -> dict[str, str]:
    """``name -> indent`` of the functions, methods and classes the lines define."""
    out: dict[str, str] = {}
    for text in lines:
        m = _DEF.match(text)
        if m:
            out.setdefault(m.group("name"), m.group("indent"))
    return out


def already_defined(text: str, hunk: Hunk) -> tuple[str, int] | None:
    """A definition the hunk adds that ``text`` already has at the same indentation: (name, 1-based line).

    The fallback of :func:`classify_hunk` when the commit's own images are not known; the planner passes
    the twins of the whole commit instead (:func:`commit_twins`).
    """
    added = _defined(t for tag, t in hunk.lines if tag == "+")
    if not added:
        return None
    kept = _defined(t for tag, t in hunk.lines if tag != "+")
    for name, indent in added.items():
        if name in kept:
            continue
        m = re.search(rf"^{re.escape(indent)}(?:async[ \t]+def|def|class)[ \t]+{re.escape(name)}\b", text, re.M)
        if m:
            return name, text.count("\n", 0, m.start()) + 1
    return None


def _def_table_by_indent(text: str) -> list[tuple[int, str, str]]:
    """:func:`def_table` for text that does not parse: the enclosing definitions by indentation."""
    out: list[tuple[int, str, str]] = []
    stack: list[tuple[int, str]] = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith(("#", ")", "]", "}")):
            continue
        width = len(line.expandtabs()) - len(line.expandtabs().lstrip())
        while stack and stack[-1][0] >= width:
            stack.pop()
        m = _DEF.match(line)
        if m:
            out.append((n, ".".join(name for _, name in stack), m.group("name")))
            stack.append((width, m.group("name")))
    return out


@functools.lru_cache(maxsize=64)  # a commit's post-image is the next one's pre-image; the tree text repeats
def def_table(text: str | None) -> list[tuple[int, str, str]]:
    """Every ``def``/``class`` of a Python text: ``(1-based line, enclosing qualname ('' at top level), name)``.

    The enclosing class decides what "the same definition" is: ``forward`` of one
    class is not ``forward`` of another. Read with :mod:`ast`; by indentation when
    the text does not parse.
    """
    if not text:
        return []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return _def_table_by_indent(text)
    out: list[tuple[int, str, str]] = []

    def walk(body: list, owner: str) -> None:
        # statements only: a definition sits in a body (of a module, class, def, if, try, with, for, match)
        for st in body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.append((st.lineno, owner, st.name))
                walk(st.body, f"{owner}.{st.name}" if owner else st.name)
                continue
            for field in ("body", "orelse", "finalbody"):
                sub = getattr(st, field, None)
                if isinstance(sub, list):
                    walk(sub, owner)
            for part in getattr(st, "handlers", None) or getattr(st, "cases", None) or ():
                walk(part.body, owner)

    walk(tree.body, "")
    return sorted(out)


#: upstream post-image line of a ``def``/``class`` a commit adds -> (qualified name, line of the tree's own one)
Twins = dict[int, tuple[str, int]]


def commit_twins(cur: str, up_pre: str | None, up_post: str | None, hunks: list[Hunk]) -> Twins:
    """Definitions the whole commit adds that the tree already carries in another form.

    Decided on the post-image of the whole commit and by the enclosing class:
    a definition counts as added when upstream's post-image has more of
    ``(enclosing class, name)`` than its pre-image (so a method moved within
    its file, whose old copy a later hunk removes, adds nothing), and as
    present in another form when the tree has more of that pair than
    upstream's pre-image had (a local one). A base method and its override
    in a subclass, or ``__init__`` of another class, are different pairs.
    """
    names = {m.group("name") for h in hunks for tag, t in h.lines if tag == "+" and (m := _DEF.match(t))}
    if not names:
        return {}

    def count(text: str | None, name: str) -> int:
        return len(re.findall(rf"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+{re.escape(name)}\b", text or "", re.M))

    # no name the commit adds is defined more often in the tree than upstream had it: nothing local to twin
    if all(count(cur, n) <= count(up_pre, n) for n in names):
        return {}
    post = def_table(up_post)
    pre = Counter((o, n) for _, o, n in def_table(up_pre))
    here = def_table(cur)
    have = Counter((o, n) for _, o, n in here)
    added = Counter((o, n) for _, o, n in post) - pre
    out: Twins = {}
    for line, o, n in post:
        key = (o, n)
        if added[key] > 0 and have[key] > pre[key]:
            local = next(ln for ln, o2, n2 in here if (o2, n2) == key)
            out[line] = (f"{o}.{n}" if o else n, local)
    return out


def _twin_of(text: str, hunk: Hunk, twins: Twins | None) -> tuple[str, int] | None:
    if twins is None:
        return already_defined(text, hunk)
    line = hunk.new_start
    for tag, t in hunk.lines:
        if tag == "-":
            continue
        if tag == "+" and line in twins and _DEF.match(t):
            return twins[line]
        line += 1
    return None


# ----------------------------------------------------------------------------- the local patches of the tree

#: path -> [(patch id, the distinctive lines the patch writes into that file)]
LocalMarks = dict[str, list[tuple[str, frozenset[str]]]]


def local_marks(patches: Iterable) -> LocalMarks:
    """What each text patch writes into each file: the distinctive lines of its replacements (or created file)
    that its anchors do not have. They name the local patch next to a hunk (:func:`local_patches_near`)."""
    out: LocalMarks = {}
    for p in patches:
        if getattr(p, "lifecycle", "active") == "retired":
            continue
        for f in getattr(p, "files", []) or []:
            lines: set[str] = set()
            for e in getattr(f, "edits", []) or []:
                anchor = {ln.strip() for ln in e.anchor.splitlines()}
                lines |= {s for ln in e.replacement.splitlines() if (s := ln.strip()) not in anchor and distinctive(s)}
            if getattr(f, "create", None):
                lines |= {s for ln in f.create.splitlines() if distinctive(s := ln.strip())}
            if lines:
                out.setdefault(f.path, []).append((p.id, frozenset(lines)))
    return out


def local_patches_at(text: str, line: int, marks: list[tuple[str, frozenset[str]]], span: int = 3) -> list[str]:
    """The local patches that wrote the tree's lines ``line`` .. ``line + span`` (a definition and its start)."""
    lines = {s.strip() for s in text.splitlines()[max(0, line - 1):line + span]}
    return [pid for pid, mine in marks if lines & mine]


def local_patches_near(text: str | None, hunk: Hunk, marks: list[tuple[str, frozenset[str]]], window: int = 3,
                       ) -> list[str]:
    """The local patches whose lines sit within ``window`` lines of where ``hunk`` lands in ``text``.

    Where it lands: the tree lines equal to a distinctive line of the hunk's
    pre-image that occurs once in the tree (no guessing between copies).
    """
    if not text or not marks:
        return []
    lines = [ln.strip() for ln in text.splitlines()]
    where: dict[str, list[int]] = {}
    for i, s in enumerate(lines):
        where.setdefault(s, []).append(i)
    at = {where[s][0] for t in hunk.pre_lines if distinctive(s := t.strip()) and len(where.get(s, [])) == 1}
    if not at:
        return []
    near = {lines[j] for i in at for j in range(max(0, i - window), min(len(lines), i + window + 1))}
    return [pid for pid, mine in marks if near & mine]


class HunkResult(BaseModel):
    header: str
    disposition: Judgement
    fuzz: int | None = Field(default=None, description="context lines kept per end when full context did not match")
    reason: str = ""
    local_patches: list[str] = Field(default_factory=list, description="local patches whose lines sit next to "
                                     "where the hunk lands in the tree (or make the definition a review names)")
    tree_line: int | None = Field(default=None, description="the tree's line a review names (its own definition)")


def classify_hunk(text: str, hunk: Hunk, twins: Twins | None = None) -> tuple[HunkResult, str | None]:
    """Judge one hunk on one text; return the result and the text with the hunk applied when applicable.

    ``twins``: the definitions the whole commit adds that the tree has in another
    form (:func:`commit_twins`); without it, a name the hunk adds at the same
    indentation as one of ``text`` counts.
    """
    pure_add = hunk.pure_addition
    generic: str | None = None  # why a pure addition's pre-image match did not count
    for context in (None, 1, 0):
        pre, post = hunk.image("pre", context), hunk.image("post", context)
        if context is not None:
            if pre == hunk.image("pre") and post == hunk.image("post"):
                continue  # trimming changed nothing; this level was already tried
            if not (_substantial(pre) if pre else True) or not (_substantial(post) if post else True):
                continue
        fuzz = None if context is None else context
        pre_hits = _line_starts_find(text, pre) if pre else []
        post_hits = _line_starts_find(text, post) if post else []
        if context is not None:
            # a reduced image must be unique to count as evidence
            pre_hits = pre_hits if len(pre_hits) == 1 else []
            post_hits = post_hits if len(post_hits) == 1 else []
        if not pre and not post:
            continue
        if not pre:  # the file was empty before the hunk
            if text == "":
                return HunkResult(header=hunk.header, disposition="applicable", fuzz=fuzz,
                                  reason="file is empty, as upstream's was"), post
            if post_hits:
                return HunkResult(header=hunk.header, disposition="satisfied", fuzz=fuzz), None
            continue
        # Earlier hunks of the same commit are already applied to ``text``, so
        # the hunk's new-side line number is where it is expected.
        want = _offset_of_line(text, hunk.new_start)
        if pre_hits and post_hits:
            if post in pre:  # a deletion: the post-image is a piece of the pre-image
                post_hits = []
            elif pre in post:  # an addition
                pre_hits = []
            elif min(abs(p - want) for p in post_hits) <= min(abs(p - want) for p in pre_hits):
                # repeated code: the same change also appears elsewhere; the nearer image decides
                pre_hits = []
            else:
                post_hits = []
        if post_hits:
            return HunkResult(header=hunk.header, disposition="satisfied", fuzz=fuzz,
                              reason="" if fuzz is None else f"post-image found with {fuzz} context line(s)"), None
        if pre_hits and pure_add:
            n = sum(distinctive(ln) for ln in pre.splitlines())
            if n < MIN_DISTINCT_CONTEXT or len(pre_hits) != 1:
                generic = generic or (f"{n} distinctive context line(s)" if n < MIN_DISTINCT_CONTEXT
                                      else f"its context occurs {len(pre_hits)} times")
                continue
        if pre_hits:
            twin = _twin_of(text, hunk, twins)
            if twin is not None:
                return HunkResult(header=hunk.header, disposition="review", fuzz=fuzz, tree_line=twin[1],
                                  reason=f"review: already present in another form: {twin[0]} is defined at "
                                  f"line {twin[1]}"), None
            pos = min(pre_hits, key=lambda p: abs(p - want))
            return (HunkResult(header=hunk.header, disposition="applicable", fuzz=fuzz,
                               reason="" if fuzz is None else f"pre-image found with {fuzz} context line(s)"),
                    text[:pos] + post + text[pos + len(pre):])
    if generic is not None:
        twin = _twin_of(text, hunk, twins)
        if twin is not None:
            return HunkResult(header=hunk.header, disposition="review", tree_line=twin[1],
                              reason=f"review: already present in another form: {twin[0]} is defined at "
                              f"line {twin[1]}"), None
        return HunkResult(header=hunk.header, disposition="review",
                          reason=f"review: the added block's context is too generic to place it ({generic})"), None
    return HunkResult(header=hunk.header, disposition="conflict",
                      reason="neither the pre-image nor the post-image is present"), None


class FileResult(BaseModel):
    path: str
    old_path: str | None = None
    change: Literal["A", "M", "D", "R", "C", "T"]
    disposition: Judgement
    reason: str = ""
    hunks: list[HunkResult] = Field(default_factory=list)


def _hunks_on(text: str, hunks: list[Hunk], twins: Twins | None = None,
              marks: list[tuple[str, frozenset[str]]] | None = None) -> tuple[list[HunkResult], str, Judgement]:
    results, cur = [], text
    for h in hunks:
        res, new = classify_hunk(cur, h, twins)
        if marks and (res.fuzz is not None or res.disposition in ("review", "conflict")):
            # a twin's line is the tree's own (before this commit); the fallback's is in the current text
            res.local_patches = (local_patches_at(text if twins is not None else cur, res.tree_line, marks)
                                 if res.tree_line else local_patches_near(cur, h, marks))
            if res.local_patches:
                res.reason = (res.reason + "; " if res.reason else "") + "next to local patch " + ", ".join(
                    res.local_patches)
        results.append(res)
        if new is not None:
            cur = new
    disp = aggregate([r.disposition for r in results]) if results else "satisfied"
    return results, cur, disp


def aggregate(disps: list[Judgement]) -> Judgement:
    """The worst of several judgements: conflict > review > applicable > satisfied."""
    return max(disps, key=_RANK.__getitem__) if disps else "satisfied"


def _hunk_summary(results: list[HunkResult]) -> str:
    n = len(results)
    c = {d: sum(r.disposition == d for r in results) for d in ("satisfied", "applicable", "review", "conflict")}
    parts = [f"{v} {k}" for k, v in c.items() if v]
    fuzzy = [r for r in results if r.fuzz is not None and r.disposition == "applicable"]
    if fuzzy:
        near = sorted({p for r in fuzzy for p in r.local_patches})
        parts[parts.index(f"{c['applicable']} applicable")] += (
            f" ({len(fuzzy)} with fuzz" + (f", next to local patch {', '.join(near)}" if near else "") + ")")
    return f"{n} hunk{'s' if n != 1 else ''}: " + ", ".join(parts) if n else "no hunks"


def classify_change(sim: SimTree, ch: GitFileChange, blob: Callable[[str, str], bytes | None],
                    sha: str, parent: str, marks: LocalMarks | None = None) -> FileResult:
    """Judge one file change of a commit on ``sim`` and apply it there when it is applicable.

    ``marks``: the local patches' lines per file (:func:`local_marks`), to name the
    local patch next to a hunk that needs fuzz, review or a port by hand.
    """

    def text_of(rev: str, path: str) -> str | None:
        data = blob(rev, path)
        return None if data is None else data.decode("utf-8", errors="surrogateescape")

    def twins_on(cur: str) -> Twins:
        if not any(tag == "+" and _DEF.match(t) for h in ch.hunks for tag, t in h.lines):
            return {}
        return commit_twins(cur, text_of(parent, ch.old_path or ch.path), text_of(sha, ch.path), ch.hunks)

    def mine(path: str) -> list[tuple[str, frozenset[str]]]:
        return (marks or {}).get(path, [])

    if ch.binary:
        new = text_of(sha, ch.path) if ch.kind != "D" else None
        old = text_of(parent, ch.old_path or ch.path) if ch.kind != "A" else None
        cur = sim.read(ch.path if ch.kind != "R" else ch.renamed_from())
        if cur == new:
            return FileResult(path=ch.path, old_path=ch.old_path, change=ch.kind, disposition="satisfied",
                              reason="binary file already matches upstream's")
        if cur == old:
            sim.write(ch.path, new)
            if ch.kind == "R":
                sim.write(ch.renamed_from(), None)
            return FileResult(path=ch.path, old_path=ch.old_path, change=ch.kind, disposition="applicable",
                              reason="binary file matches upstream's pre-image")
        return FileResult(path=ch.path, old_path=ch.old_path, change=ch.kind, disposition="conflict",
                          reason="binary file matches neither side")
    if ch.kind in ("A", "C"):
        post = text_of(sha, ch.path)
        cur = sim.read(ch.path)
        if cur is None:
            sim.write(ch.path, post)
            return FileResult(path=ch.path, old_path=ch.old_path, change=ch.kind, disposition="applicable",
                              reason="new file")
        if cur == post:
            return FileResult(path=ch.path, old_path=ch.old_path, change=ch.kind, disposition="satisfied",
                              reason="file already present with upstream's content")
        return FileResult(path=ch.path, old_path=ch.old_path, change=ch.kind, disposition="conflict",
                          reason="upstream adds this file, but the tree has a different one")
    if ch.kind == "D":
        pre = text_of(parent, ch.path)
        cur = sim.read(ch.path)
        if cur is None:
            return FileResult(path=ch.path, change="D", disposition="satisfied", reason="file already gone")
        if cur == pre:
            sim.write(ch.path, None)
            return FileResult(path=ch.path, change="D", disposition="applicable", reason="file deleted upstream")
        return FileResult(path=ch.path, change="D", disposition="conflict",
                          reason="upstream deletes this file, but the tree's copy differs from upstream's")
    if ch.kind == "R":
        old_path = ch.renamed_from()
        cur_old, cur_new = sim.read(old_path), sim.read(ch.path)
        if cur_old is not None and cur_new is None:
            results, text, disp = _hunks_on(cur_old, ch.hunks, twins_on(cur_old), mine(old_path))
            if disp in ("conflict", "review"):
                return FileResult(path=ch.path, old_path=ch.old_path, change="R", disposition=disp,
                                  reason=f"rename from {ch.old_path}; {_hunk_summary(results)}", hunks=results)
            sim.write(ch.path, text)
            sim.write(old_path, None)
            return FileResult(path=ch.path, old_path=ch.old_path, change="R", disposition="applicable",
                              reason=f"rename from {ch.old_path}" + (f"; {_hunk_summary(results)}" if results else ""),
                              hunks=results)
        if cur_old is None and cur_new is not None:
            results, text, disp = _hunks_on(cur_new, ch.hunks, twins_on(cur_new), mine(ch.path))
            if disp == "applicable":
                sim.write(ch.path, text)
            return FileResult(path=ch.path, old_path=ch.old_path, change="R", disposition=disp,
                              reason=f"already renamed from {ch.old_path}"
                              + (f"; {_hunk_summary(results)}" if results else ""), hunks=results)
        why = "both the old and the new path exist" if cur_old is not None else "neither the old nor the new path exists"
        return FileResult(path=ch.path, old_path=ch.old_path, change="R", disposition="conflict",
                          reason=f"rename from {ch.old_path}: {why} in the tree")
    cur = sim.read(ch.path)
    if cur is None:
        return FileResult(path=ch.path, change=ch.kind, disposition="conflict", reason="file missing in the tree")
    results, text, disp = _hunks_on(cur, ch.hunks, twins_on(cur), mine(ch.path))
    if disp == "applicable":
        sim.write(ch.path, text)
    return FileResult(path=ch.path, change=ch.kind, disposition=disp, reason=_hunk_summary(results), hunks=results)


def commit_reason(results: list[FileResult]) -> str:
    parts = []
    for r in results:
        if r.disposition in ("conflict", "review"):
            bad = [h for h in r.hunks if h.disposition == r.disposition]
            where = "".join(f"; {h.header}: {h.reason}" for h in bad[:3])
            parts.append(f"{r.path}: {r.reason}{where}")
        else:
            fuzzy = [h for h in r.hunks if h.fuzz is not None and h.disposition == "applicable"]
            where = "".join(f"; {h.header}: {h.reason}" for h in fuzzy[:3])
            parts.append(f"{r.path}: {r.reason}{where}")
    return "; ".join(parts)


def tree_reader(tree) -> Reader:
    """A path -> text function over a tree view (anything with ``read_bytes`` or ``read_text``)."""

    def read(path: str) -> str | None:
        try:
            if hasattr(tree, "read_bytes"):
                data = tree.read_bytes(path)
                return None if data is None else data.decode("utf-8", errors="surrogateescape")
            return tree.read_text(path)
        except (SndrError, FileNotFoundError, KeyError, IsADirectoryError, NotADirectoryError):
            return None

    return read
