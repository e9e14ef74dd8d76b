"""Exact search and enclosing qualified names. Pure functions of text."""

from __future__ import annotations

import ast
import bisect
import hashlib
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


class Scopes:
    """Line -> innermost enclosing ``Class.method`` name of one source text."""

    def __init__(self, text: str):
        self.spans: list[tuple[int, int, str]] = []
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            return
        self._walk(tree, "")
        self.spans.sort()
        self._starts = [s for s, _, _ in self.spans]

    def _walk(self, node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}.{child.name}" if prefix else child.name
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                self.spans.append((first, child.end_lineno or child.lineno, qual))
                inner = qual + ".<locals>" if not isinstance(child, ast.ClassDef) else qual
                self._walk(child, inner)
            else:
                self._walk(child, prefix)

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


@lru_cache(maxsize=64)
def _scopes_cached(digest: str, text: str) -> Scopes:
    return Scopes(text)


def scopes(text: str) -> Scopes:
    return _scopes_cached(hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest(), text)


def qualname_at(text: str, offset: int) -> str:
    return scopes(text).qualname(line_of(text, offset))
