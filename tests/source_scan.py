"""Parsed source files for the tests that read sndr's code (architecture, one home, codes, one default).

Each of those scans parses the whole package; parsed once here per process, a file's tree is shared
(the scans only read it: never modify a tree you get from :func:`parse`). The key holds the file's
mtime and size, so a file rewritten during the session is parsed again.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """The syntax tree of ``path`` (UTF-8), parsed once per process while the file is unchanged."""
    st = Path(path).stat()
    return _parse(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


@functools.cache
def _parse(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
