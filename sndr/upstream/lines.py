"""Line ownership through an upstream range (upstream coordinates only, no tree).

:class:`LineTracker` follows every line of every mirrored file through the
range: who added it, and which commits' hunks (context included) touched it.
That gives

- the dependency graph: a commit depends on the earlier commits whose lines its
  hunks overlap, and on the commit that created or renamed its file;
- :func:`net_zero`: lines added and removed again inside the range;
- :func:`superseded`: commits whose every added line a later commit of the
  range rewrote or removed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .diff import Hunk
from .gitio import GitFileChange

__all__ = ["LineTracker", "net_zero", "superseded"]

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
        self.replaced_by: dict[int, set[int]] = {}  # origin commit -> commits that rewrote its lines
        self.gone_count: dict[int, int] = {}  # origin commit -> its lines removed or rewritten since

    def _lines(self, path: str, rev: str) -> list[_Line]:
        if path not in self.files:
            self.files[path] = [_Line(frozenset(), None) for _ in range(self._count(rev, path))]
        return self.files[path]

    def _gone(self, i: int, line: _Line) -> None:
        if line.origin is not None and line.origin != i:
            self.replaced_by.setdefault(line.origin, set()).add(i)
            self.gone_count[line.origin] = self.gone_count.get(line.origin, 0) + 1

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
            for _t, ln in block:
                if ln is None:  # an added line
                    out.append(_Line(frozenset({i}), i))
                else:
                    self._gone(i, ln)
                    if not has_add:
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

    def commit(self, i: int, parent: str, changes: list[GitFileChange], new_count: Callable[[str], int]) -> set[int]:
        """Record commit ``i``; return the earlier commits it depends on."""
        deps: set[int] = set()
        self.added.setdefault(i, 0)
        self.pure_add.setdefault(i, True)
        for ch in changes:
            for p in ch.paths:
                if p in self.path_origin:
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
                    self._gone(i, line)
                    self._remove(i, line)
                self.pure_add[i] = False
                self.files.pop(ch.path, None)
                continue
            if ch.kind == "R":
                old_path = ch.renamed_from()
                self.files[ch.path] = self._lines(old_path, parent)
                self.files.pop(old_path, None)
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


def superseded(tracker: LineTracker, candidates: Iterable[int]) -> dict[int, list[int]]:
    """Commits whose every added line later commits of the range rewrote or removed: index -> those commits.

    A commit that adds nothing (a pure deletion) is never superseded: its
    effect is the absence of lines, which no later edit of other lines undoes.
    """
    out: dict[int, list[int]] = {}
    for j in candidates:
        added = tracker.added.get(j, 0)
        if added > 0 and tracker.gone_count.get(j, 0) >= added:
            out[j] = sorted(tracker.replaced_by.get(j, ()))
    return out
