"""Exact search and enclosing qualified names. Pure functions of text."""

from __future__ import annotations

import ast
import bisect
import hashlib
import json
import os
import sys
from functools import lru_cache
from pathlib import Path


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


def _disk_cache() -> Path | None:
    try:
        from .env import cache_dir

        d = cache_dir() / "scopes" / f"py{sys.version_info[0]}{sys.version_info[1]}"
        d.mkdir(parents=True, exist_ok=True)
        return d
    except OSError:
        return None


@lru_cache(maxsize=256)
def _scopes_cached(digest: str, text: str) -> Scopes:
    # Content-addressed on disk too: a fleet applies the same pristine files
    # over and over, and parsing a 200 KB module costs tens of milliseconds.
    # A damaged entry is ignored and rebuilt; it can only affect report labels.
    cache = _disk_cache()
    entry = cache / f"{digest}.json" if cache else None
    if entry is not None:
        try:
            return Scopes(text, [tuple(x) for x in json.loads(entry.read_text())])
        except (OSError, ValueError, TypeError):
            pass
    sc = Scopes(text)
    if entry is not None:
        try:
            tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(sc.spans))
            os.replace(tmp, entry)
        except OSError:
            pass
    return sc


def scopes(text: str) -> Scopes:
    return _scopes_cached(hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), text)


def qualname_at(text: str, offset: int) -> str:
    return scopes(text).qualname(line_of(text, offset))
