"""The sync queue: work an upstream range on a local vLLM git checkout, and advance the pin.

``python -m sndr sync plan --repo PATH --from PIN --to TARGET`` lists the
commits of the range that touch the mirrored surface (the files the patch set
touches, plus configured globs) and re-derives what each one is for the
current tree. Every upstream change is read as an edit: the commit's
pre-image is the anchor and its post-image the replacement.

- ``satisfied``: the post-image is already present;
- ``applicable``: the pre-image is present;
- ``conflict``: neither (it needs a port by hand);
- ``outside``: the commit touches no mirrored file.

Commits are simulated in upstream order on an in-memory copy of the tree, so a
commit that builds on an earlier applicable one is judged after it. Two passes
keep that honest:

1. **Upstream only.** Line ownership through the range gives the dependency
   graph (a commit depends on the earlier commits whose lines its hunks,
   context included, overlap, and on the commit that created or renamed its
   file). Revert pairs inside the range cancel; lines added and then removed
   again inside the range are net-zero.
2. **Against the tree.** Each commit is classified on the simulated tree. The
   halves of a cancelled pair and net-zero commits are judged but never
   applied, so the simulation never carries a change the port will not make.

The queue is the applicable and conflicting commits, in waves: a commit sits
one wave after the latest commit it depends on, so a series on the same hunks
keeps upstream order. ``pin advance`` records a new pin only when the
preflight, manifest and queue gates pass.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, Problem, SndrError, bad_input

Disposition = Literal["satisfied", "applicable", "conflict", "outside"]
#: What the queue does with a commit.
#: port: applicable, in a wave; port-by-hand: conflict, in a wave; skip: satisfied or outside;
#: cancelled: one half of a revert pair inside the range; net-zero: its change is undone inside the range;
#: refused: one half of a revert pair whose other half the tree already carries.
QueueStatus = Literal["port", "port-by-hand", "skip", "cancelled", "net-zero", "refused"]
QUEUED = ("port", "port-by-hand")

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
PIN_FILE_NAME = "_pin.toml"  # '_' keeps load.patch_files() from reading it as a patch
SYNC_CONFIG_NAME = "_sync.toml"
FUZZ_MIN_CHARS = 12  # a reduced-context image must carry at least this much non-blank text


# ----------------------------------------------------------------------------- git


class Git:
    """The few git plumbing calls the planner needs, on one repository."""

    def __init__(self, repo: Path | str):
        self.repo = Path(repo)
        if not self.repo.is_dir():
            raise bad_input("repo_not_found", "repository does not exist", file=str(repo))
        if self.run("rev-parse", "--git-dir", check=False).returncode != 0:
            raise bad_input("not_a_repo", "not a git repository", file=str(repo),
                            hint="point --repo at a vLLM git checkout")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run(["git", "-C", str(self.repo), "-c", "core.quotepath=off", *args],
                                  capture_output=True)
        except FileNotFoundError:
            raise bad_input("git_not_found", "git is not installed") from None
        if check and proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            raise bad_input("git_failed", f"git {' '.join(args[:3])} failed: {err[-1] if err else proc.returncode}",
                            file=str(self.repo))
        return proc

    def text(self, *args: str) -> str:
        return self.run(*args).stdout.decode("utf-8", errors="surrogateescape")

    def resolve(self, ref: str, what: str) -> str:
        proc = self.run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        if proc.returncode != 0:
            raise bad_input("unknown_rev", f"{what} {ref!r} is not a commit in {self.repo}", key=what)
        return proc.stdout.decode().strip()

    def is_ancestor(self, a: str, b: str) -> bool:
        return self.run("merge-base", "--is-ancestor", a, b, check=False).returncode == 0

    def commits(self, base: str, tip: str) -> list["CommitInfo"]:
        out = self.text("log", "--reverse", "--topo-order", "--format=%H%x1f%P%x1f%s%x1f%b%x1e", f"{base}..{tip}")
        commits = []
        for rec in out.split("\x1e"):
            rec = rec.lstrip("\n")
            if not rec:
                continue
            sha, parents, subject, body = (rec.split("\x1f") + ["", "", ""])[:4]
            commits.append(CommitInfo(sha=sha, parents=parents.split(), subject=subject, body=body))
        return commits

    def changes(self, parent: str, sha: str) -> list["FileChange"]:
        raw = self.run("diff-tree", "-r", "-M", "--no-commit-id", "--name-status", "-z", parent, sha).stdout
        parts = raw.decode("utf-8", errors="surrogateescape").split("\0")
        out, i = [], 0
        while i < len(parts) and parts[i]:
            status = parts[i]
            kind = status[0]
            if kind in "RC":
                out.append(FileChange(kind=kind, path=parts[i + 2], old_path=parts[i + 1]))
                i += 3
            else:
                out.append(FileChange(kind=kind if kind in "AMDT" else "M", path=parts[i + 1]))
                i += 2
        return out

    def diff(self, parent: str, sha: str, paths: list[str]) -> str:
        return self.text("diff", "-M", "-U3", "--no-color", "--no-ext-diff", "--no-textconv", parent, sha, "--", *paths)

    def blob(self, rev: str, path: str) -> bytes | None:
        proc = self.run("cat-file", "blob", f"{rev}:{path}", check=False)
        return proc.stdout if proc.returncode == 0 else None


# ----------------------------------------------------------------------------- diffs


@dataclass
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list[tuple[str, str]] = field(default_factory=list)  # (' '|'-'|'+', text with its newline)

    def image(self, side: Literal["pre", "post"], context: int | None = None) -> str:
        """The hunk's text before (pre) or after (post), with at most ``context`` lines of context per end."""
        keep = (" ", "-") if side == "pre" else (" ", "+")
        lines = self.lines
        if context is not None:
            changed = [i for i, (t, _) in enumerate(lines) if t != " "]
            if changed:
                lo, hi = max(0, changed[0] - context), min(len(lines), changed[-1] + 1 + context)
                lines = lines[lo:hi]
        return "".join(text for tag, text in lines if tag in keep)

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_count} +{self.new_start},{self.new_count} @@"


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_hunks(diff_text: str) -> tuple[list[Hunk], bool]:
    """Hunks of a one-file unified diff, and whether git called the file binary."""
    hunks: list[Hunk] = []
    binary = False
    cur: Hunk | None = None
    lines = diff_text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        m = _HUNK_RE.match(line)
        if m:
            cur = Hunk(int(m.group(1)), int(m.group(2) or 1), int(m.group(3)), int(m.group(4) or 1))
            hunks.append(cur)
            continue
        if cur is None:
            if line.startswith("Binary files ") or line.startswith("GIT binary patch"):
                binary = True
            continue
        if line.startswith("\\"):
            if cur.lines:  # "\ No newline at end of file"
                tag, text = cur.lines[-1]
                cur.lines[-1] = (tag, text[:-1] if text.endswith("\n") else text)
            continue
        if line[:1] in (" ", "-", "+"):
            cur.lines.append((line[0], line[1:] + "\n"))
        elif line == "":
            cur.lines.append((" ", "\n"))  # some tools drop the space of an empty context line
        else:
            cur = None  # the next file header
    return hunks, binary


@dataclass
class FileChange:
    kind: str  # A M D R C T
    path: str
    old_path: str | None = None
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False


@dataclass
class CommitInfo:
    sha: str
    parents: list[str]
    subject: str
    body: str = ""
    changes: list[FileChange] = field(default_factory=list)  # mirrored files only
    other_files: int = 0

    @property
    def short(self) -> str:
        return self.sha[:10]


# ----------------------------------------------------------------------------- surface


def patch_surface(patches: Iterable) -> set[str]:
    """Files the patch set touches: text edits' files and runtime targets' modules."""
    out: set[str] = set()
    for p in patches:
        if getattr(p, "lifecycle", "active") == "retired":
            continue
        for f in getattr(p, "files", []) or []:
            out.add(f.path)
        for r in getattr(p, "runtime", []) or []:
            mod = r.target.split(":", 1)[0].replace(".", "/")
            out.update({f"{mod}.py", f"{mod}/__init__.py"})
    return out


@dataclass
class Surface:
    files: set[str] = field(default_factory=set)
    globs: list[str] = field(default_factory=list)

    def matches(self, path: str | None) -> bool:
        if not path:
            return False
        return path in self.files or any(fnmatch.fnmatchcase(path, g) for g in self.globs)

    def follow_rename(self, old: str, new: str) -> None:
        if self.matches(old):
            self.files.add(new)


def load_sync_config(path: Path) -> list[str]:
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise bad_input("not_found", "sync config does not exist", file=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise bad_input("toml_syntax", f"malformed TOML: {exc}", file=str(path)) from None
    unknown = sorted(set(data) - {"surface"})
    if unknown:
        raise bad_input("bad_sync_config", f"unknown key {unknown[0]!r}", file=str(path), key=unknown[0])
    globs = data.get("surface", [])
    if not isinstance(globs, list) or not all(isinstance(g, str) and g for g in globs):
        raise bad_input("bad_sync_config", "'surface' must be a list of glob strings", file=str(path), key="surface")
    return globs


# ----------------------------------------------------------------------------- the tree, simulated

Reader = Callable[[str], "str | None"]


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

    def fork(self) -> "SimTree":
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


class HunkResult(BaseModel):
    header: str
    disposition: Literal["satisfied", "applicable", "conflict"]
    fuzz: int | None = Field(default=None, description="context lines kept per end when full context did not match")
    reason: str = ""


def classify_hunk(text: str, hunk: Hunk) -> tuple[HunkResult, str | None]:
    """Judge one hunk on one text; return the result and the text with the hunk applied when applicable."""
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
        if pre_hits:
            pos = min(pre_hits, key=lambda p: abs(p - want))
            return (HunkResult(header=hunk.header, disposition="applicable", fuzz=fuzz,
                               reason="" if fuzz is None else f"pre-image found with {fuzz} context line(s)"),
                    text[:pos] + post + text[pos + len(pre):])
    return HunkResult(header=hunk.header, disposition="conflict",
                      reason="neither the pre-image nor the post-image is present"), None


class FileResult(BaseModel):
    path: str
    old_path: str | None = None
    change: Literal["A", "M", "D", "R", "C", "T"]
    disposition: Literal["satisfied", "applicable", "conflict"]
    reason: str = ""
    hunks: list[HunkResult] = Field(default_factory=list)


def _hunks_on(text: str, hunks: list[Hunk]) -> tuple[list[HunkResult], str, str]:
    results, cur = [], text
    for h in hunks:
        res, new = classify_hunk(cur, h)
        results.append(res)
        if new is not None:
            cur = new
    disp = _aggregate([r.disposition for r in results]) if results else "satisfied"
    return results, cur, disp


def _aggregate(disps: list[str]) -> str:
    if "conflict" in disps:
        return "conflict"
    if "applicable" in disps:
        return "applicable"
    return "satisfied"


def _hunk_summary(results: list[HunkResult]) -> str:
    n = len(results)
    c = {d: sum(r.disposition == d for r in results) for d in ("satisfied", "applicable", "conflict")}
    parts = [f"{v} {k}" for k, v in c.items() if v]
    return f"{n} hunk{'s' if n != 1 else ''}: " + ", ".join(parts) if n else "no hunks"


def classify_change(sim: SimTree, ch: FileChange, blob: Callable[[str, str], bytes | None],
                    sha: str, parent: str) -> FileResult:
    """Judge one file change of a commit on ``sim`` and apply it there when it is applicable."""

    def text_of(rev: str, path: str) -> str | None:
        data = blob(rev, path)
        return None if data is None else data.decode("utf-8", errors="surrogateescape")

    if ch.binary:
        new = text_of(sha, ch.path) if ch.kind != "D" else None
        old = text_of(parent, ch.old_path or ch.path) if ch.kind != "A" else None
        cur = sim.read(ch.path if ch.kind != "R" else ch.old_path)
        if cur == new:
            return FileResult(path=ch.path, old_path=ch.old_path, change=ch.kind, disposition="satisfied",
                              reason="binary file already matches upstream's")
        if cur == old:
            sim.write(ch.path, new)
            if ch.kind == "R":
                sim.write(ch.old_path, None)
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
        cur_old, cur_new = sim.read(ch.old_path), sim.read(ch.path)
        if cur_old is not None and cur_new is None:
            results, text, disp = _hunks_on(cur_old, ch.hunks)
            if disp == "conflict":
                return FileResult(path=ch.path, old_path=ch.old_path, change="R", disposition="conflict",
                                  reason=f"rename from {ch.old_path}; {_hunk_summary(results)}", hunks=results)
            sim.write(ch.path, text)
            sim.write(ch.old_path, None)
            return FileResult(path=ch.path, old_path=ch.old_path, change="R", disposition="applicable",
                              reason=f"rename from {ch.old_path}" + (f"; {_hunk_summary(results)}" if results else ""),
                              hunks=results)
        if cur_old is None and cur_new is not None:
            results, text, disp = _hunks_on(cur_new, ch.hunks)
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
    results, text, disp = _hunks_on(cur, ch.hunks)
    if disp == "applicable":
        sim.write(ch.path, text)
    return FileResult(path=ch.path, change=ch.kind, disposition=disp, reason=_hunk_summary(results), hunks=results)


# ----------------------------------------------------------------------------- upstream analysis


@dataclass
class _Line:
    owners: frozenset[int]
    origin: int | None  # commit index that added the line inside the range


class LineTracker:
    """Who last touched each line of each mirrored file, through the range (upstream coordinates)."""

    def __init__(self, count_lines: Callable[[str, str], int]):
        self._count = count_lines
        self.files: dict[str, list[_Line]] = {}
        self.path_origin: dict[str, int] = {}
        self.added: dict[int, int] = {}
        self.pure_add: dict[int, bool] = {}
        self.removed_origins: dict[int, list[int | None]] = {}  # commit -> origins of lines it removed outright
        self.removed_by: dict[int, set[int]] = {}  # origin commit -> commits that removed its lines outright
        self.removed_count: dict[int, int] = {}

    def _lines(self, path: str, rev: str) -> list[_Line]:
        if path not in self.files:
            self.files[path] = [_Line(frozenset(), None) for _ in range(self._count(rev, path))]
        return self.files[path]

    def _remove(self, i: int, line: _Line) -> None:
        self.removed_origins.setdefault(i, []).append(line.origin)
        if line.origin is not None:
            self.removed_by.setdefault(line.origin, set()).add(i)
            self.removed_count[line.origin] = self.removed_count.get(line.origin, 0) + 1

    def _walk_hunk(self, i: int, lines: list[_Line], pos: int, hunk: Hunk, out: list[_Line], deps: set[int]) -> int:
        """Append the lines of ``hunk`` (commit ``i``) to ``out``; return the old-line position after it."""
        block: list[tuple[str, _Line | None]] = []
        mark_next = False

        def marked(ln: _Line) -> _Line:
            return _Line(ln.owners | {i}, ln.origin)

        def flush() -> None:
            nonlocal mark_next
            if not block:
                return
            has_add = any(t == "+" for t, _ in block)
            has_del = any(t == "-" for t, _ in block)
            for t, ln in block:
                if t == "+":
                    out.append(_Line(frozenset({i}), i))
                elif not has_add:
                    self._remove(i, ln)  # removed outright, not rewritten
            if has_del:
                self.pure_add[i] = False
                if not has_add:
                    # a removal leaves its mark on both neighbours
                    if out:
                        out[-1] = marked(out[-1])
                    mark_next = True
            block.clear()

        for tag, _text in hunk.lines:
            ln = lines[pos] if tag != "+" and pos < len(lines) else _Line(frozenset(), None)
            if tag == " ":
                flush()
                deps.update(ln.owners)
                if mark_next:
                    ln, mark_next = marked(ln), False
                out.append(ln)
                pos += 1
            elif tag == "-":
                deps.update(ln.owners)
                block.append(("-", ln))
                pos += 1
            else:
                block.append(("+", None))
                self.added[i] += 1
        flush()
        if mark_next and pos < len(lines):
            lines[pos] = marked(lines[pos])
        return pos

    def commit(self, i: int, parent: str, changes: list[FileChange], new_count: Callable[[str], int]) -> set[int]:
        """Record commit ``i``; return the earlier commits it depends on."""
        deps: set[int] = set()
        self.added.setdefault(i, 0)
        self.pure_add.setdefault(i, True)
        for ch in changes:
            for p in (ch.path, ch.old_path):
                if p and p in self.path_origin:
                    deps.add(self.path_origin[p])
            if ch.kind in ("A", "C"):
                n = new_count(ch.path)
                self.files[ch.path] = [_Line(frozenset({i}), i) for _ in range(n)]
                self.path_origin[ch.path] = i
                self.added[i] += n
                continue
            if ch.kind == "D":
                for line in self._lines(ch.path, parent):
                    deps |= line.owners
                    self._remove(i, line)
                self.pure_add[i] = False
                self.files.pop(ch.path, None)
                continue
            if ch.kind == "R":
                self.files[ch.path] = self._lines(ch.old_path, parent)
                self.files.pop(ch.old_path, None)
                self.path_origin[ch.path] = i
            lines = self._lines(ch.path, parent)
            if ch.binary:
                for line in lines:
                    deps |= line.owners
                self.files[ch.path] = [_Line(line.owners | {i}, line.origin) for line in lines]
                self.pure_add[i] = False
                continue
            out: list[_Line] = []
            cursor = 0
            for h in ch.hunks:
                begin = h.old_start - 1 if h.old_count > 0 else h.old_start
                begin = min(max(begin, cursor), len(lines))
                out.extend(lines[cursor:begin])
                cursor = self._walk_hunk(i, lines, begin, h, out, deps)
            out.extend(lines[cursor:])
            self.files[ch.path] = out
        deps.discard(i)
        return deps


def pair_reverts(commits: list[CommitInfo]) -> tuple[dict[int, int], dict[int, str]]:
    """Revert pairs inside the range (index -> partner) and reverts of commits before it (index -> sha)."""
    by_sha = {c.sha: i for i, c in enumerate(commits)}
    partner: dict[int, int] = {}
    outside: dict[int, str] = {}
    for i, c in enumerate(commits):
        target = None
        m = re.search(r"This reverts commit ([0-9a-f]{7,40})", c.body)
        if m:
            pref = m.group(1)
            hits = [j for s, j in by_sha.items() if s.startswith(pref) and j < i]
            if hits:
                target = hits[0]
            else:
                outside[i] = pref
                continue
        else:
            m = re.match(r'^Revert "(.*)"\s*$', c.subject)
            if m:
                hits = [j for j in range(i) if commits[j].subject == m.group(1)]
                target = hits[-1] if hits else None
        if target is None:
            continue
        if target in partner:
            # reverting a revert: the older pair comes apart and the original stands again
            del partner[partner.pop(target)]
        partner[target] = i
        partner[i] = target
    return partner, outside


def net_zero(tracker: LineTracker, candidates: Iterable[int], excluded: set[int]) -> tuple[set[int], dict[int, set[int]]]:
    """Add-then-remove inside the range.

    Returns (commits to skip as net-zero, adder -> the commits that remove its lines).
    An adder only adds lines, and every one of them is removed outright later in
    the range. It is skipped when each of its removers is skipped too: a
    remover is skipped when it adds nothing and removes only lines of skipped
    adders. Adders whose removers do more stay queued, with a flag.
    """
    cands = {
        j for j in candidates
        if j not in excluded and tracker.added.get(j, 0) > 0 and tracker.pure_add.get(j, False)
        and tracker.removed_count.get(j, 0) >= tracker.added[j]
    }
    removers = {j: set(tracker.removed_by.get(j, ())) for j in cands}

    def pure_remover(k: int, adders: set[int]) -> bool:
        origins = tracker.removed_origins.get(k, [])
        return (k not in excluded and tracker.added.get(k, 0) == 0 and bool(origins)
                and all(o in adders for o in origins))

    adders = set(cands)
    while True:
        gone = {k for j in adders for k in removers[j] if pure_remover(k, adders)}
        keep = {j for j in adders if removers[j] <= gone}
        if keep == adders:
            break
        adders = keep
    return adders | gone, removers


# ----------------------------------------------------------------------------- the report


class CommitEntry(BaseModel):
    sha: str
    subject: str
    position: int = Field(description="1-based position in the range, upstream order")
    disposition: Disposition
    status: QueueStatus
    reason: str = ""
    wave: int | None = None
    depends_on: list[str] = Field(default_factory=list, description="earlier queued commits this one builds on")
    pair: str | None = Field(default=None, description="the other half of a revert pair inside the range")
    flags: list[str] = Field(default_factory=list)
    files: list[FileResult] = Field(default_factory=list)
    other_files: int = Field(default=0, description="files the commit touches outside the mirrored surface")


class Wave(BaseModel):
    number: int
    commits: list[str]


class SurfaceInfo(BaseModel):
    files: list[str]
    globs: list[str] = Field(default_factory=list)


class QueueReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str = "sndr"
    command: str = "sync plan"
    repo: str
    from_ref: str
    from_sha: str
    to_ref: str
    to_sha: str
    tree: str
    surface: SurfaceInfo
    counts: dict[str, int] = Field(default_factory=dict)
    waves: list[Wave] = Field(default_factory=list)
    commits: list[CommitEntry] = Field(default_factory=list)
    merges_skipped: list[str] = Field(default_factory=list)
    selected: list[str] | None = None
    findings: list[dict] = Field(default_factory=list)

    def entry(self, sha: str) -> CommitEntry:
        for c in self.commits:
            if c.sha == sha:
                return c
        raise KeyError(sha)

    def queued(self) -> list[CommitEntry]:
        order = [s for w in self.waves for s in w.commits]
        return [self.entry(s) for s in order]


# ----------------------------------------------------------------------------- planning


def _count_lines(data: bytes | None) -> int:
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def _tree_reader(tree) -> Reader:
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


def plan(repo: Path | str, from_ref: str, to_ref: str, surface: Surface, tree=None, *,
         select: list[str] | None = None, tree_label: str | None = None) -> QueueReport:
    """Plan the port queue of ``from_ref..to_ref`` against ``tree`` (default: the repo's working tree)."""
    git = Git(repo)
    base = git.resolve(from_ref, "from")
    tip = git.resolve(to_ref, "to")
    if not git.is_ancestor(base, tip):
        raise bad_input("not_ancestor", f"--from {from_ref} is not an ancestor of --to {to_ref}",
                        hint="the range is the commits reachable from --to but not from --from")
    if tree is None:
        from ..tree import DirTree

        tree = DirTree(git.repo, spec=str(git.repo))
    read = _tree_reader(tree)
    surface = Surface(set(surface.files), list(surface.globs))
    initial_files = sorted(surface.files)

    all_commits = git.commits(base, tip)
    merges = [c.sha for c in all_commits if len(c.parents) > 1]
    commits = [c for c in all_commits if len(c.parents) <= 1]

    # pass 1: upstream only
    tracker = LineTracker(lambda rev, path: _count_lines(git.blob(rev, path)))
    deps: dict[int, set[int]] = {}
    for i, c in enumerate(commits):
        parent = c.parents[0] if c.parents else EMPTY_TREE
        changes = git.changes(parent, c.sha)
        mirrored = []
        for ch in changes:
            if ch.kind == "R" and surface.matches(ch.old_path):
                surface.follow_rename(ch.old_path, ch.path)
            if surface.matches(ch.path) or surface.matches(ch.old_path):
                mirrored.append(ch)
        c.other_files = len(changes) - len(mirrored)
        if not mirrored:
            continue
        for ch in mirrored:
            if ch.kind in ("M", "R", "T"):
                paths = [ch.path] + ([ch.old_path] if ch.old_path else [])
                ch.hunks, ch.binary = parse_hunks(git.diff(parent, c.sha, paths))
            elif ch.kind in ("A", "C", "D"):
                ch.binary = b"\0" in ((git.blob(c.sha if ch.kind != "D" else parent, ch.path)) or b"")[:8000]
        c.changes = mirrored
        deps[i] = tracker.commit(i, parent, mirrored, lambda p, sha=c.sha: _count_lines(git.blob(sha, p)))

    partner, reverts_before = pair_reverts(commits)
    partner = {a: b for a, b in partner.items() if a in deps and b in deps}  # pairs matter on the surface only
    zero, zero_flags = net_zero(tracker, deps.keys(), set(partner))

    # pass 2: against the tree
    sim = SimTree(read)
    entries: list[CommitEntry] = []
    findings: list[Problem] = []
    for i, c in enumerate(commits):
        if i not in deps:
            entries.append(CommitEntry(sha=c.sha, subject=c.subject, position=i + 1, disposition="outside",
                                       status="skip", other_files=c.other_files,
                                       reason=f"touches no mirrored file ({c.other_files} file"
                                       f"{'s' if c.other_files != 1 else ''})"))
            continue
        parent = c.parents[0] if c.parents else EMPTY_TREE
        work = sim.fork()
        results = [classify_change(work, ch, git.blob, c.sha, parent) for ch in c.changes]
        disp = _aggregate([r.disposition for r in results])
        reason = _commit_reason(results)
        entry = CommitEntry(sha=c.sha, subject=c.subject, position=i + 1, disposition=disp,
                            status="skip" if disp == "satisfied" else ("port" if disp == "applicable" else "port-by-hand"),
                            reason=reason, files=results, other_files=c.other_files)
        if i in reverts_before:
            entry.flags.append(f"reverts {reverts_before[i]} (before the range)")
        simulate = disp == "applicable" and i not in partner and i not in zero
        if simulate:
            sim = work
        entries.append(entry)

    # ordering rules
    for a, b in partner.items():
        if a > b:
            continue
        ea, eb = entries[a], entries[b]
        ea.pair, eb.pair = eb.sha, ea.sha
        if ea.disposition == "satisfied" and eb.disposition != "satisfied":
            for e, other in ((ea, eb), (eb, ea)):
                e.status = "refused"
                e.reason = (f"revert pair with {other.sha[:10]}: the tree already carries {ea.sha[:10]}, which "
                            f"{eb.sha[:10]} reverts inside the range; porting one half alone is refused")
            findings.append(Problem("revert_pair_half_ported",
                                    f"{eb.sha[:10]} reverts {ea.sha[:10]} inside the range, but the tree already "
                                    f"carries {ea.sha[:10]}: decide by hand (drop it locally or keep it as a patch)"))
        else:
            for e, other in ((ea, eb), (eb, ea)):
                e.status = "cancelled"
                e.reason = f"revert pair with {other.sha[:10]} inside the range: they cancel out"
    for k in sorted(zero):
        e = entries[k]
        e.status = "net-zero"
        e.flags.append("net-zero")
        if k in zero_flags:
            e.reason = ("add-then-remove: every line it adds is removed again by "
                        + ", ".join(entries[r].sha[:10] for r in sorted(zero_flags[k])))
        else:
            adders = sorted({o for o in tracker.removed_origins.get(k, []) if o is not None})
            e.reason = "add-then-remove: removes only lines added inside the range by " + \
                ", ".join(entries[a].sha[:10] for a in adders)
    for j in sorted(set(zero_flags) - zero):
        entries[j].flags.append("net-zero lines: every line it adds is removed again by "
                                + ", ".join(entries[r].sha[:10] for r in sorted(zero_flags[j])))
    queued = {i for i, e in enumerate(entries) if e.status in QUEUED}
    for i in queued:
        entries[i].depends_on = [entries[j].sha for j in sorted(deps.get(i, ())) if j in queued]
        blockers = [entries[j].sha[:10] for j in sorted(deps.get(i, ())) if j in queued
                    and entries[j].disposition == "conflict"]
        if blockers and entries[i].disposition == "conflict":
            entries[i].reason += f"; builds on {', '.join(blockers)} (conflict): port that first"
    by_sha = {e.sha: i for i, e in enumerate(entries)}

    selected_idx: set[int] | None = None
    if select:
        selected_idx = set()
        for s in select:
            hits = [e.sha for e in entries if e.sha.startswith(s.strip())]
            if len(hits) != 1:
                raise bad_input("bad_select", f"--select {s!r} names {'no' if not hits else 'more than one'} "
                                "commit in the range", key="select")
            selected_idx.add(by_sha[hits[0]])
        refusals = []
        for i in sorted(selected_idx):
            e = entries[i]
            if e.pair and by_sha[e.pair] not in selected_idx:
                refusals.append(Problem("revert_pair_split", f"{e.sha[:10]} and {e.pair[:10]} are a revert pair "
                                        "inside the range; porting one half alone is refused",
                                        hint="select both (they cancel) or neither"))
            missing = [d for d in e.depends_on if by_sha[d] not in selected_idx]
            if missing:
                refusals.append(Problem("series_split", f"{e.sha[:10]} builds on {', '.join(m[:10] for m in missing)}, "
                                        "which is not selected; a series keeps upstream order",
                                        hint="select the earlier commits too"))
        if refusals:
            raise SndrError(refusals)
        queued &= selected_idx

    wave_of: dict[int, int] = {}
    for i in sorted(queued):
        wave_of[i] = 1 + max((wave_of[j] for j in deps.get(i, ()) if j in wave_of), default=0)
        entries[i].wave = wave_of[i]
    waves = [Wave(number=n, commits=[entries[i].sha for i in sorted(wave_of) if wave_of[i] == n])
             for n in range(1, max(wave_of.values(), default=0) + 1)]

    counts: dict[str, int] = {"commits": len(commits), "mirrored": len(deps), "merges_skipped": len(merges)}
    for e in entries:
        counts[e.disposition] = counts.get(e.disposition, 0) + 1
        counts[f"status:{e.status}"] = counts.get(f"status:{e.status}", 0) + 1
    counts["queued"] = len(queued)
    return QueueReport(repo=str(git.repo), from_ref=from_ref, from_sha=base, to_ref=to_ref, to_sha=tip,
                       tree=tree_label or getattr(tree, "spec", None) or str(tree),
                       surface=SurfaceInfo(files=initial_files, globs=list(surface.globs)),
                       counts=counts, waves=waves, commits=entries, merges_skipped=merges,
                       selected=sorted(entries[i].sha for i in selected_idx) if selected_idx is not None else None,
                       findings=[p.to_json() for p in findings])


def _commit_reason(results: list[FileResult]) -> str:
    parts = []
    for r in results:
        if r.disposition == "conflict":
            bad = [h for h in r.hunks if h.disposition == "conflict"]
            where = "".join(f"; {h.header}: {h.reason}" for h in bad[:3])
            parts.append(f"{r.path}: {r.reason}{where}")
        else:
            parts.append(f"{r.path}: {r.reason}")
    return "; ".join(parts)


# ----------------------------------------------------------------------------- markdown


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(rep: QueueReport) -> str:
    c = rep.counts
    out = [f"# Sync queue: {rep.from_ref} ({rep.from_sha[:10]}) .. {rep.to_ref} ({rep.to_sha[:10]})", ""]
    out.append(f"- repository: `{rep.repo}`")
    out.append(f"- tree: `{rep.tree}`")
    out.append(f"- mirrored surface: {len(rep.surface.files)} files"
               + (f" + globs {', '.join('`' + g + '`' for g in rep.surface.globs)}" if rep.surface.globs else ""))
    out.append(f"- {c.get('commits', 0)} commits in range, {c.get('mirrored', 0)} touch the surface: "
               f"{c.get('satisfied', 0)} satisfied, {c.get('applicable', 0)} applicable, "
               f"{c.get('conflict', 0)} conflict, {c.get('outside', 0)} outside")
    out.append(f"- queue: {c.get('queued', 0)} commits in {len(rep.waves)} wave(s); "
               f"{c.get('status:cancelled', 0)} cancelled by revert pairs, {c.get('status:net-zero', 0)} net-zero, "
               f"{c.get('status:refused', 0)} refused")
    if rep.merges_skipped:
        out.append(f"- {len(rep.merges_skipped)} merge commit(s) skipped: the planner reads a linear history")
    out.append("")
    if rep.findings:
        out += ["## Findings", ""] + [f"- **{f['code']}**: {f['message']}" for f in rep.findings] + [""]
    for w in rep.waves:
        out += [f"## Wave {w.number}", "", "| # | commit | subject | disposition | after | reason |", "|---|---|---|---|---|---|"]
        for sha in w.commits:
            e = rep.entry(sha)
            after = ", ".join(d[:10] for d in e.depends_on) or "-"
            flags = f" ({'; '.join(e.flags)})" if e.flags else ""
            out.append(f"| {e.position} | `{e.sha[:10]}` | {_md_escape(e.subject)} | {e.disposition} | {after} | "
                       f"{_md_escape(e.reason + flags)} |")
        out.append("")
    rest = [e for e in rep.commits if e.status not in QUEUED and e.disposition != "outside"]
    if rest:
        out += ["## Not queued", "", "| # | commit | subject | disposition | status | reason |", "|---|---|---|---|---|---|"]
        for e in rest:
            out.append(f"| {e.position} | `{e.sha[:10]}` | {_md_escape(e.subject)} | {e.disposition} | {e.status} | "
                       f"{_md_escape(e.reason)} |")
        out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------------------- pin


class PinRecord(BaseModel):
    """``patches/_pin.toml``: the vLLM build the patch set is validated on."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field(min_length=1)
    sha: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,40}$")
    tree_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    def to_toml(self) -> str:
        lines = ["# The pin: written by `python -m sndr pin advance` when every gate passes."]
        for k, v in self.model_dump(exclude_none=True).items():
            lines.append(f"{k} = {json.dumps(v)}")
        return "\n".join(lines) + "\n"


def default_pin_path() -> Path:
    from ..env import patches_dir

    return patches_dir() / PIN_FILE_NAME


def read_pin(path: Path | str) -> PinRecord | None:
    import tomllib

    path = Path(path)
    if not path.exists():
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        return PinRecord.model_validate(data)
    except tomllib.TOMLDecodeError as exc:
        raise bad_input("toml_syntax", f"malformed TOML: {exc}", file=str(path)) from None
    except ValidationError as exc:
        err = exc.errors()[0]
        raise bad_input("bad_pin", err.get("msg", "invalid"), file=str(path),
                        key=".".join(str(p) for p in err.get("loc", ())) or None) from None


_SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")


def _norm_version(v: str) -> str:
    v = v.strip()
    v = v[len("vllm=="):] if v.startswith("vllm==") else v
    return v[1:] if v[:1] == "v" and v[1:2].isdigit() else v


@dataclass
class Gate:
    name: str
    ok: bool
    reason: str


def _read_json(path: Path, what: str) -> Any:
    from .watchlist import read_text_file

    text = read_text_file(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_input("bad_json", f"malformed JSON: {exc.msg}", file=str(path), line=exc.lineno) from None


def _target_matches(to: str, version: str | None, sha: str | None) -> bool | None:
    """Whether a recorded target names ``to``; None when the record says nothing comparable."""
    if _SHA_RE.match(to) and sha:
        return sha.startswith(to) or to.startswith(sha)
    if version:
        return _norm_version(version) == _norm_version(to) or (sha is not None and sha.startswith(to))
    return None


def _manifest_name(version: str) -> str:
    try:
        from ..manifest import manifest_name
    except ImportError:  # pragma: no cover
        return f"vllm-{version}.json"
    return manifest_name(version)


def gate_preflight(path: Path | None, to: str) -> tuple[Gate, dict]:
    if path is None:
        return Gate("preflight", False, "no preflight report given (--preflight)"), {}
    data = _read_json(path, "preflight report")
    if not isinstance(data, dict) or "genuine_anchor_drift" not in data:
        return Gate("preflight", False, f"{path} is not a preflight report (no genuine_anchor_drift)"), {}
    cand = data.get("candidate")
    cver = cand if isinstance(cand, str) else (cand.get("version") if isinstance(cand, dict) else None)
    csha = cand.get("sha") if isinstance(cand, dict) else None
    match = _target_matches(to, cver, csha)
    if match is False:
        return Gate("preflight", False, f"the preflight's candidate is {cver or csha}, not {to}"), data
    drift = data.get("genuine_anchor_drift") or []
    if drift:
        names = []
        for d in drift:
            names.append(d if isinstance(d, str) else str(d.get("patch") or d.get("id") or d))
        return Gate("preflight", False, f"genuine anchor drift in {len(drift)} edit(s): "
                    f"{', '.join(sorted(set(names))[:8])}"), data
    return Gate("preflight", True, "no genuine anchor drift"), data


def _manifest_pairs(obj: Any) -> set[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            pid = cur.get("patch")
            name = cur.get("name") or cur.get("edit")
            if isinstance(pid, str) and isinstance(name, str):
                pairs.add((pid, name))
            stack.extend(cur.values())
        elif isinstance(cur, list):
            stack.extend(cur)
    return pairs


def gate_manifest(path: Path, to: str, patch_set, tree_digest: str | None = None) -> Gate:
    if not path.exists():
        return Gate("manifest", False, f"no manifest {path}: rebuild it for {to} (python -m sndr manifest)")
    data = _read_json(path, "manifest")
    if not isinstance(data, dict):
        return Gate("manifest", False, f"{path} is not a manifest")
    pin = data.get("pin")
    version = data.get("vllm_version") or data.get("version") or (pin.get("version") if isinstance(pin, dict) else pin)
    if isinstance(version, str) and _target_matches(to, version, None) is False and not _SHA_RE.match(to):
        return Gate("manifest", False, f"{path} was built for {version}, not {to}")
    built_on = data.get("tree_digest")
    if tree_digest and isinstance(built_on, str) and built_on != tree_digest:
        return Gate("manifest", False, f"{path} was built on tree {built_on[:12]}, but the preflight's candidate is "
                    f"{tree_digest[:12]}; rebuild it on the target")
    if patch_set is not None:
        digest = data.get("patch_set_digest")
        if isinstance(digest, str):
            if digest != patch_set.digest():
                return Gate("manifest", False, f"{path} was built from another patch set (digest "
                            f"{digest[:12]}); rebuild it")
            return Gate("manifest", True, f"{path} matches the patch set")
        pairs = _manifest_pairs(data)
        if pairs:
            want = {(p.id, e.name) for p in patch_set.patches if p.lifecycle != "retired" for _, e in p.edits()}
            missing = sorted(want - pairs)
            if missing:
                return Gate("manifest", False, f"{path} lacks {len(missing)} edit(s) of the patch set, e.g. "
                            f"{missing[0][0]}/{missing[0][1]}; rebuild it")
            return Gate("manifest", True, f"{path} covers every edit of the patch set")
    return Gate("manifest", True, f"{path} present")


def gate_queue(path: Path | None, to: str) -> Gate:
    if path is None:
        return Gate("queue", False, "no queue report given (--queue, from `sync plan --json`)")
    data = _read_json(path, "queue report")
    try:
        rep = QueueReport.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise bad_input("bad_queue", f"not a queue report: {err.get('msg')}", file=str(path),
                        key=".".join(str(p) for p in err.get("loc", ())) or None) from None
    if _target_matches(to, rep.to_ref, rep.to_sha) is False:
        return Gate("queue", False, f"the queue is for {rep.to_ref} ({rep.to_sha[:10]}), not {to}")
    left = [c for c in rep.commits if c.disposition == "applicable" and c.status in ("port", "refused")]
    if left:
        shown = ", ".join(f"{c.sha[:10]} {c.subject!r}" for c in left[:5])
        return Gate("queue", False, f"{len(left)} applicable commit(s) left unported: {shown}")
    conflicts = sum(1 for c in rep.commits if c.status == "port-by-hand")
    return Gate("queue", True, "no applicable commit left" + (f" ({conflicts} conflict(s) judged by hand)" if conflicts else ""))


def advance(to: str, *, preflight: Path | None, queue: Path | None, manifest: Path | None = None,
            anchors_dir: Path | None = None, patch_set=None, pin_path: Path | None = None,
            version: str | None = None, tree_digest: str | None = None, dry_run: bool = False
            ) -> tuple[list[Gate], PinRecord | None]:
    """Check every gate; write the pin record when all pass (and not ``dry_run``)."""
    to = to.strip()
    if not to:
        raise bad_input("bad_target", "--to is empty", key="to")
    is_sha = bool(_SHA_RE.match(to))
    if not is_sha:
        from packaging.version import InvalidVersion, Version

        try:
            Version(_norm_version(to))
        except InvalidVersion:
            raise bad_input("bad_target", f"--to {to!r} is neither a PEP 440 version nor a commit sha", key="to") from None
    gates: list[Gate] = []
    g, pre = gate_preflight(preflight, to)
    gates.append(g)
    cand = pre.get("candidate") if isinstance(pre, dict) else None
    cand_digest = cand.get("tree_digest") if isinstance(cand, dict) else None
    cand_digest = cand_digest if isinstance(cand_digest, str) and re.fullmatch(r"[0-9a-f]{64}", cand_digest) else None
    if manifest is None:
        if anchors_dir is None:
            from ..load import shipped_anchors_dir

            anchors_dir = shipped_anchors_dir()
        manifest = Path(anchors_dir) / _manifest_name(_norm_version(to) if not is_sha else to)
    gates.append(gate_manifest(Path(manifest), to, patch_set, cand_digest))
    gates.append(gate_queue(queue, to))
    if not all(g.ok for g in gates):
        return gates, None
    if version is None:
        version = _norm_version(to) if not is_sha else (
            cand if isinstance(cand, str) else (cand or {}).get("version") if isinstance(cand, dict) else None)
    if not version:
        raise bad_input("no_version", f"--to {to} is a commit; give --version for the pin record", key="version")
    if tree_digest is None:
        tree_digest = cand_digest
    if tree_digest is None and Path(manifest).exists():
        d = _read_json(Path(manifest), "manifest").get("tree_digest")
        tree_digest = d if isinstance(d, str) and re.fullmatch(r"[0-9a-f]{64}", d) else None
    record = PinRecord(version=_norm_version(version), sha=to if is_sha else None, tree_digest=tree_digest)
    if not dry_run:
        from .watchlist import write_atomic

        path = Path(pin_path) if pin_path is not None else default_pin_path()
        write_atomic(path, record.to_toml())
    return gates, record


# ----------------------------------------------------------------------------- CLI


def _err(exc: SndrError) -> int:
    print(exc.render(), file=sys.stderr)
    return exc.exit_code


def _load_patch_set(directory: str | None):
    from ..load import load_patch_set

    return load_patch_set(directory)


def cli_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sndr sync", description="plan the port queue of an upstream range")
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("plan", help="list, judge and order the commits of an upstream range")
    pl.add_argument("--repo", required=True, help="a vLLM git checkout holding the range")
    pl.add_argument("--from", dest="from_ref", required=True, metavar="PIN_SHA")
    pl.add_argument("--to", dest="to_ref", required=True, metavar="TARGET_SHA")
    pl.add_argument("--tree", help="tree the commits are judged against (default: the repo's working tree)")
    pl.add_argument("--patches", metavar="DIR", help="patch set whose files are mirrored (default: shipped set)")
    pl.add_argument("--surface", action="append", default=[], metavar="GLOB",
                    help="extra mirrored files (fnmatch; '*' crosses '/'); repeatable")
    pl.add_argument("--config", metavar="FILE", help=f"TOML with surface = [globs] (default: <patches>/{SYNC_CONFIG_NAME} if present)")
    pl.add_argument("--select", metavar="SHA,...", help="queue only these commits (refused if it splits a revert pair or a series)")
    pl.add_argument("--json", metavar="PATH", help="write the JSON report here ('-' for stdout)")
    pl.add_argument("--md", metavar="PATH", help="write the Markdown report here ('-' for stdout)")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) and EXIT_BAD_INPUT
    try:
        ps = _load_patch_set(args.patches)
        globs = list(args.surface)
        config = Path(args.config) if args.config else (Path(ps.directory) / SYNC_CONFIG_NAME if ps.directory else None)
        if config is not None and (args.config or config.exists()):
            globs += load_sync_config(config)
        surface = Surface(patch_surface(ps.patches), globs)
        tree = None
        if args.tree:
            from ..tree import open_tree

            tree = open_tree(args.tree)
        select = [s for s in args.select.split(",") if s.strip()] if args.select else None
        rep = plan(args.repo, args.from_ref, args.to_ref, surface, tree, select=select)
        text_json = rep.model_dump_json(indent=2)
        text_md = render_markdown(rep)
        if args.json and args.json != "-":
            Path(args.json).write_text(text_json + "\n", encoding="utf-8")
        if args.md and args.md != "-":
            Path(args.md).write_text(text_md + "\n", encoding="utf-8")
        if args.json == "-":
            print(text_json)
        elif args.md == "-" or not (args.json or args.md):
            print(text_md)
        else:
            c = rep.counts
            print(f"{c.get('commits', 0)} commits, {c.get('mirrored', 0)} on the surface: {c.get('queued', 0)} queued "
                  f"in {len(rep.waves)} wave(s)")
        return EXIT_FINDINGS if (rep.waves or rep.findings) else EXIT_OK
    except SndrError as exc:
        return _err(exc)
    except Exception as exc:  # noqa: BLE001
        print(f"sndr sync: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


def pin_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sndr pin", description="show or advance the pin")
    sub = p.add_subparsers(dest="cmd", required=True)
    sh = sub.add_parser("show", help="print the recorded pin")
    sh.add_argument("--pin-file", metavar="PATH")
    ad = sub.add_parser("advance", help="record a new pin when the preflight, manifest and queue gates pass")
    ad.add_argument("--to", required=True, metavar="VERSION|SHA")
    ad.add_argument("--preflight", metavar="REPORT.json", help="preflight of the patch set on the target")
    ad.add_argument("--queue", metavar="QUEUE.json", help="`sync plan --json` of the range up to the target")
    ad.add_argument("--manifest", metavar="PATH", help="manifest of the target (default: anchors/<to>.json)")
    ad.add_argument("--patches", metavar="DIR", help="patch set the manifest must match (default: shipped set)")
    ad.add_argument("--pin-file", metavar="PATH", help=f"pin record to write (default: patches/{PIN_FILE_NAME})")
    ad.add_argument("--version", help="vLLM version to record when --to is a commit")
    ad.add_argument("--tree", help="target tree to take the digest from (any tree spec)")
    ad.add_argument("--dry-run", action="store_true", help="check the gates, write nothing")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) and EXIT_BAD_INPUT
    try:
        if args.cmd == "show":
            path = Path(args.pin_file) if args.pin_file else default_pin_path()
            rec = read_pin(path)
            if rec is None:
                print(f"{path}: no pin recorded")
                return EXIT_FINDINGS
            print(f"{path}: " + ", ".join(f"{k}={v}" for k, v in rec.model_dump(exclude_none=True).items()))
            return EXIT_OK
        digest = None
        if args.tree:
            from ..tree import open_tree

            digest = open_tree(args.tree).digest
        ps = _load_patch_set(args.patches)
        gates, record = advance(args.to, preflight=Path(args.preflight) if args.preflight else None,
                                queue=Path(args.queue) if args.queue else None,
                                manifest=Path(args.manifest) if args.manifest else None, patch_set=ps,
                                pin_path=Path(args.pin_file) if args.pin_file else None, version=args.version,
                                tree_digest=digest, dry_run=args.dry_run)
        for g in gates:
            print(f"gate {g.name}: {'pass' if g.ok else 'FAIL'}: {g.reason}")
        if record is None:
            failed = [g.name for g in gates if not g.ok]
            print(f"refused: pin not advanced to {args.to}; failed gate(s): {', '.join(failed)}", file=sys.stderr)
            return EXIT_FINDINGS
        where = "(dry run, nothing written)" if args.dry_run else str(args.pin_file or default_pin_path())
        print(f"pin advanced to {record.version}{' @ ' + record.sha if record.sha else ''} {where}")
        return EXIT_OK
    except SndrError as exc:
        return _err(exc)
    except Exception as exc:  # noqa: BLE001
        print(f"sndr pin: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL
