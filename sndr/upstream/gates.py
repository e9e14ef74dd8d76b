"""What a ``pin advance`` gate answers, and the checks more than one gate shares.

:class:`PinGate` is one gate's verdict; :func:`norm_version` reads a target
(``vllm==0.33.0``, ``v0.33.0``, ``0.33.0``) as one version;
:func:`benchmark_ref_problem` says why a file is no benchmark reference. The
gates of :mod:`sndr.upstream.pin` and :mod:`sndr.upstream.perfgate` build on
them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def norm_version(v: str) -> str:
    """A target as a version: ``vllm==X`` and ``vX`` read as ``X``."""
    v = v.strip()
    v = v[len("vllm=="):] if v.startswith("vllm==") else v
    return v[1:] if v[:1] == "v" and v[1:2].isdigit() else v


_TARGET_SHA = re.compile(r"^[0-9a-f]{7,40}$")


def target_problem(v: str) -> str | None:
    """Why ``v`` names no target (a PEP 440 version, read as :func:`norm_version` does, or a 7-40 digit
    commit sha); None when it does."""
    from packaging.version import InvalidVersion, Version

    if _TARGET_SHA.match(v.strip()):
        return None
    try:
        Version(norm_version(v))
    except InvalidVersion:
        return "neither a vLLM version (0.33.0, v0.33.0, vllm==0.33.0) nor a commit sha (7 to 40 hex digits)"
    return None


def same_target(a: str, b: str) -> bool:
    """Do two targets name the same one: versions compared as versions (``0.33`` is ``0.33.0``), shas by
    prefix, anything else as text."""
    from packaging.version import InvalidVersion, Version

    a, b = a.strip(), b.strip()
    if _TARGET_SHA.match(a) and _TARGET_SHA.match(b):
        return a.startswith(b) or b.startswith(a)
    try:
        return Version(norm_version(a)) == Version(norm_version(b))
    except InvalidVersion:
        return norm_version(a) == norm_version(b)


@dataclass
class PinGate:
    name: str
    ok: bool
    reason: str


def _has_number(obj: Any) -> bool:
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, (int, float)) and not isinstance(cur, bool):
            return True
        if isinstance(cur, dict):
            stack.extend(cur.values())
        elif isinstance(cur, list):
            stack.extend(cur)
    return False


def benchmark_ref_problem(path: Path) -> str | None:
    """Why ``path`` is no benchmark reference (None when it is one).

    A reference records at least one measurement: it is non-empty (not only
    whitespace); a ``.json`` one parses as JSON and holds at least one number
    (``{}`` or ``[]`` measures nothing); any other text one (``.md``, ``.csv``,
    ``.txt``...) holds at least one digit. A file that is not UTF-8 text (a
    binary trace) only has to be non-empty.
    """
    from ..fsio import FileProblem, decode_strict, read_regular

    data = read_regular(path, what="benchmark reference")
    if not data.strip():
        return f"benchmark reference {path} is empty: re-measure on the target and write the results into it"
    try:
        text = decode_strict(data, path, "benchmark reference").removeprefix("\ufeff")
    except FileProblem:  # not UTF-8: a binary trace passes on being non-empty; JSON must be text
        return f"benchmark reference {path} is not UTF-8 JSON" if path.suffix.lower() == ".json" else None
    if path.suffix.lower() == ".json":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"benchmark reference {path} is not valid JSON ({exc.msg} at line {exc.lineno})"
        except (ValueError, RecursionError) as exc:  # a 5,000-digit integer, nesting too deep
            return f"benchmark reference {path} is not usable JSON ({str(exc).split(';')[0]})"
        if not _has_number(obj):
            return f"benchmark reference {path} holds no measurement (a JSON reference needs at least one number)"
        return None
    if not re.search(r"[0-9]", text):
        return f"benchmark reference {path} holds no measurement (no number in it)"
    return None
