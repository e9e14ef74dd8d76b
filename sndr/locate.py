"""Exact search and enclosing qualified names. Pure functions of text.

The one effect, a disk cache of parsed scopes, is off unless the shell injects one
(:func:`use_disk_cache`, done by :func:`sndr.caches.enable`)."""

from __future__ import annotations

import ast
import bisect
import hashlib
import json
import os
from functools import lru_cache


def find_all(text: str, needle: str) -> list[int]:
    """Every offset where ``needle`` starts in ``text``, overlapping ones included."""
    out = []
    start = text.find(needle)
    while start != -1:
        out.append(start)
        start = text.find(needle, start + 1)
    return out


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


_STMT_LISTS = ("body", "orelse", "finalbody", "handlers", "cases")


def _walk_statements(body: list, prefix: str, out: list) -> None:
    """Collect def/class spans, descending through statement lists only.

    Expressions can't contain a def or class, so skipping them makes this an
    order of magnitude cheaper than visiting every node of a large vLLM module.
    """
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qual = f"{prefix}.{node.name}" if prefix else node.name
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append((first, node.end_lineno or node.lineno, qual))
            inner = qual if isinstance(node, ast.ClassDef) else qual + ".<locals>"
            _walk_statements(node.body, inner, out)
        else:
            for name in _STMT_LISTS:
                sub = getattr(node, name, None)
                if sub:
                    _walk_statements(sub, prefix, out)


class Scopes:
    """Line -> innermost enclosing ``Class.method`` name of one source text."""

    def __init__(self, text: str, spans: list[tuple[int, int, str]] | None = None):
        if spans is None:
            spans = []
            try:
                tree = ast.parse(text)
            except (SyntaxError, ValueError):
                tree = None
            if tree is not None:
                _walk_statements(tree.body, "", spans)
        self.spans = sorted(spans)
        self._starts = [s for s, _, _ in self.spans]

    def qualname(self, line: int) -> str:
        if not self.spans:
            return ""
        best = ""
        best_size = None
        idx = bisect.bisect_right(self._starts, line)
        for s, e, q in self.spans[:idx]:
            if s <= line <= e and (best_size is None or e - s <= best_size):
                best, best_size = q, e - s
        return best.replace(".<locals>", "")

    def span_of(self, qualname: str) -> tuple[int, int] | None:
        for s, e, q in self.spans:
            if q.replace(".<locals>", "") == qualname:
                return s, e
        return None


#: The on-disk scope cache, injected by the shell (:func:`sndr.caches.enable`); None: parse in
#: memory only. The core never finds a cache directory by itself and writes nothing.
_DISK = None


def use_disk_cache(cache):
    """Set the scope cache (a :class:`sndr.fsio.PrivateDir`, or None); returns the previous one."""
    global _DISK
    prev, _DISK = _DISK, cache
    _scopes_cached.cache_clear()
    return prev


def _disk_cache():
    """The injected cache, or None."""
    return _DISK


@lru_cache(maxsize=256)
def _scopes_cached(digest: str, text: str) -> Scopes:
    # Content-addressed on disk too: a fleet applies the same pristine files
    # over and over, and parsing a 200 KB module costs tens of milliseconds.
    # Entries are sealed with the cache's secret; a damaged or planted one is
    # ignored and rebuilt (it could only affect report labels anyway).
    from .fsio import FileProblem

    name = f"scopes-{digest}.json"
    try:
        cache = _disk_cache()
        if isinstance(cache, (str, os.PathLike)):  # a plain directory (benchmarks): same checks
            from .fsio import PrivateDir

            cache = PrivateDir.open(cache)
    except (OSError, FileProblem):
        cache = None
    if cache is not None:
        try:
            raw = cache.get_sealed("scopes", name)
            if raw is not None:
                return Scopes(text, [tuple(x) for x in json.loads(raw)])
        except (OSError, FileProblem, ValueError, TypeError):
            pass
    sc = Scopes(text)
    if cache is not None:
        try:
            cache.put_sealed("scopes", name, json.dumps(sc.spans).encode())
        except (OSError, FileProblem):
            pass
    return sc


def scopes(text: str) -> Scopes:
    return _scopes_cached(hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), text)
