"""Which files hold a given stripped line: the relocation search's seed index, per tree, kept on disk.

A relocation suggestion starts from the candidate files that hold one of the
anchor's distinctive lines verbatim (and, to find a pin file's heirs, the
files that took its departed lines). Answering that by intersecting the line
set of every changed file costs seconds per preflight on a 3,000-file tree.
This index answers it with dictionary lookups:

* :class:`MemoryIndex` - built from texts in memory, for the files a relocator
  may search (unit tests, trees that are not worth a disk entry);
* :class:`TreeIndex` - every ``.py`` of one tree, content-addressed by the
  tree digest in ``<cache root>/preflight/lines-v1-<digest>.sqlite``, built
  once (into a temporary file, then renamed) and opened read-only by every
  later run: a second preflight, a run with another candidate, and every
  ``--via`` hop that touches the same release reuse it.

A damaged or unreadable entry is rebuilt; a cache that cannot be written only
costs the build. Nothing here decides anything: a wrong index can only make a
suggestion worse, and every suggestion is re-scored from the tree's text.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path

from .. import env, fsio

__all__ = ["Lazy", "MemoryIndex", "TreeIndex", "tree_index", "for_snapshot", "MIN_LINE"]

#: Shorter stripped lines are never looked up (``Relocator`` ignores them).
MIN_LINE = 4
_VERSION = "v1"
_BATCH = 500  # host parameters per query (SQLite allows 999 on old builds)


def _lines_of(text: str) -> set[str]:
    return {s for s in map(str.strip, text.split("\n")) if len(s) >= MIN_LINE}


class MemoryIndex:
    """stripped line -> files holding it, over ``files`` read through ``text_of``; built on first use."""

    def __init__(self, files: Iterable[str], text_of: Callable[[str], str | None]):
        self._files = list(files)
        self._text_of = text_of
        self._map: dict[str, list[str]] | None = None

    def _build(self) -> dict[str, list[str]]:
        if self._map is None:
            out: dict[str, list[str]] = {}
            for rel in self._files:
                text = self._text_of(rel)
                if text is None:
                    continue
                for s in _lines_of(text):
                    got = out.get(s)
                    if got is None:
                        out[s] = [rel]
                    else:
                        got.append(rel)
            self._map = out
        return self._map

    def lookup(self, lines: Iterable[str]) -> dict[str, list[str]]:
        m = self._build()
        return {s: list(m.get(s, ())) for s in lines}


class TreeIndex:
    """The on-disk index of one tree (every file), opened read-only."""

    def __init__(self, path: Path):
        self.path = path
        self.damaged = False
        self._db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, check_same_thread=False)
        self._names = [rel for (rel,) in self._db.execute("SELECT rel FROM files ORDER BY id")]

    def lookup(self, lines: Iterable[str]) -> dict[str, list[str]]:
        want = [s for s in dict.fromkeys(lines) if len(s) >= MIN_LINE]
        out: dict[str, list[str]] = {s: [] for s in want}
        names = self._names
        for i in range(0, len(want), _BATCH):
            chunk = want[i:i + _BATCH]
            q = f"SELECT line, ids FROM lines WHERE line IN ({','.join('?' * len(chunk))})"
            try:
                rows = self._db.execute(q, chunk).fetchall()
            except sqlite3.Error as exc:
                return self._damaged(out, str(exc))
            for line, ids in rows:
                got = []
                for x in str(ids).split():
                    if not x.isdigit() or int(x) >= len(names):
                        return self._damaged(out, f"row {line!r} names file id {x!r} of {len(names)}")
                    got.append(names[int(x)])
                out[line] = got
        return out

    def _damaged(self, out: dict[str, list[str]], why: str) -> dict[str, list[str]]:
        """A damaged index answers nothing (a suggestion can only get worse, never wrong): said once,
        and the entry removed so that the next run rebuilds it."""
        import sys

        if not self.damaged:
            self.damaged = True
            print(f"sndr: {self.path}: the line index is damaged ({why}); it is ignored and rebuilt on the "
                  f"next run", file=sys.stderr)
            try:
                self.path.unlink()
            except OSError:
                pass
        return {s: [] for s in out}

    def close(self) -> None:
        self._db.close()


def _build(path: Path, files: list[str], text_of: Callable[[str], str | None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # sqlite writes the file itself, so fsio.atomic_write (which writes bytes) cannot; the temp
    # beside ``path`` still comes from fsio (random name, O_EXCL | O_NOFOLLOW, marked as sndr's).
    fd, tmp = fsio.create_temp(path, 0o600)
    os.close(fd)
    try:
        db = sqlite3.connect(tmp)
        db.execute("PRAGMA journal_mode=OFF")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("CREATE TABLE files (id INTEGER PRIMARY KEY, rel TEXT NOT NULL)")
        db.execute("CREATE TABLE lines (line TEXT PRIMARY KEY, ids TEXT NOT NULL) WITHOUT ROWID")
        ids: dict[str, list[str]] = {}
        names: list[str] = []
        for rel in files:
            text = text_of(rel)
            if text is None:
                continue
            k = str(len(names))
            names.append(rel)
            for s in _lines_of(text):
                got = ids.get(s)
                if got is None:
                    ids[s] = [k]
                else:
                    got.append(k)
        db.executemany("INSERT INTO files VALUES (?, ?)", enumerate(names))
        db.executemany("INSERT INTO lines VALUES (?, ?)", ((s, " ".join(v)) for s, v in ids.items()))
        db.commit()
        db.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_OPEN: dict[str, TreeIndex] = {}


def tree_index(digest: str, files: Callable[[], list[str]], text_of: Callable[[str], str | None],
               root: Path | None = None) -> TreeIndex | None:
    """The on-disk index of the tree with ``digest`` (built on first use); None when no cache can hold it."""
    if digest in _OPEN:
        return _OPEN[digest]
    if root is not None:
        base = root / env.CACHE_PREFLIGHT
    else:
        from .. import caches

        checked = caches.dir_path(env.CACHE_PREFLIGHT, "preflight cache", without="the line index is kept in memory")
        if checked is None:
            return None
        base = checked
    path = base / f"lines-{_VERSION}-{digest[:40]}.sqlite"
    for _attempt in (0, 1):
        if not path.is_file():
            try:
                _build(path, files(), text_of)
            except (OSError, sqlite3.Error):
                return None
        try:
            idx = TreeIndex(path)
            idx.lookup(["import os"])  # a damaged file fails here
            if idx.damaged:  # said and removed by the lookup: build it again
                idx.close()
                continue
        except sqlite3.Error:
            try:
                path.unlink()
            except OSError:
                return None
            continue
        _OPEN[digest] = idx
        return idx
    return None


def for_snapshot(snap) -> TreeIndex | None:
    """The on-disk index of a preflight :class:`~sndr.preflight.snapshot.Snapshot` (pristine texts)."""
    return tree_index(snap.digest, snap.files, snap.text_or_none)


class Lazy:
    """An index made on its first lookup (a preflight with nothing drifted never opens one)."""

    def __init__(self, make: Callable[[], TreeIndex | MemoryIndex]):
        self._make = make
        self._idx: TreeIndex | MemoryIndex | None = None

    def lookup(self, lines: Iterable[str]) -> dict[str, list[str]]:
        if self._idx is None:
            self._idx = self._make()
        return self._idx.lookup(lines)
