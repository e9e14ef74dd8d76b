"""Vendoring, step one: read the diff and place its hunks on the pin (pure line arithmetic).

The diff is read by :func:`sndr.upstream.diff.parse_diff_files` (the parser
``sync`` uses too) into :class:`DiffHunk` s; :func:`place` locates every hunk of
a file in order, the way the planner applies edits (hunk *k* in the text hunks
1..k-1 left), with ``fuzz`` lines of the diff's context allowed to go, and
builds the post-image. :mod:`.vendor_anchor` turns each :class:`Placed` hunk
into an edit; :mod:`.vendor` runs the whole.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import Problem, SndrError
from .diff import DiffFile, Hunk, parse_diff_files

# ----------------------------------------------------------------------------- text helpers


def split_lines(text: str) -> list[str]:
    """Lines of ``text`` with their endings, split on ``\\n`` only.

    ``str.splitlines`` also splits on form feeds, ``\\x1c``, ``\\u2028`` and
    friends, which Python source may contain inside a line; a byte-exact tool
    must not.
    """
    if not text:
        return []
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def unified_diff(old: str | None, new: str | None, path: str, *, context: int = 3) -> str:
    """A ``git diff``-shaped unified diff of one file, correct for texts without a final newline.

    ``difflib.unified_diff`` alone writes a last line without its newline and
    glues the next diff line onto it; here such a line is followed by the
    ``\\ No newline at end of file`` marker, as diff and git write it.
    ``old=None`` makes a creation diff, ``new=None`` a deletion.
    """
    a = split_lines(old or "")
    b = split_lines(new or "")
    fromfile = "/dev/null" if old is None else f"a/{path}"
    tofile = "/dev/null" if new is None else f"b/{path}"
    out = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        out.append("new file mode 100644\n")
    elif new is None:
        out.append("deleted file mode 100644\n")
    for line in difflib.unified_diff(a, b, fromfile, tofile, n=context):
        if line.startswith(("---", "+++")) and not line.endswith("\n"):
            line += "\n"
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out) if len(out) > 1 + (old is None or new is None) else ""


# ----------------------------------------------------------------------------- the diff


@dataclass
class DiffHunk:
    """A hunk as vendoring reads it: pre- and post-image lines (built from :class:`sndr.upstream.diff.Hunk`)."""

    header: str
    src_start: int
    src_len: int
    pre: list[str]
    post: list[str]
    added: list[bool]  # per post line: a '+' line of the diff

    @classmethod
    def of(cls, h: Hunk) -> DiffHunk:
        return cls(h.header, h.old_start, h.old_count, h.pre_lines, h.post_lines, h.added_flags)


_SUBJECT = re.compile(r"^Subject:[ \t]*(?P<s>.*(?:\n[ \t]+.*)*)", re.M)
_PR = re.compile(r"\(#(\d+)\)\s*$")


def parse_diff(text: str) -> tuple[list[DiffFile[DiffHunk]], dict]:
    """The files of a unified diff, and what its mail header says (``subject``, ``body``, ``pr``).

    The diff itself is read by :func:`sndr.upstream.diff.parse_diff_files`, the
    parser ``sync`` uses too.
    """
    files = [DiffFile(f.source, f.target, f.status, [DiffHunk.of(h) for h in f.hunks])
             for f in parse_diff_files(text)]
    meta: dict = {}
    head = text.split("\ndiff --git ", 1)[0]
    m = _SUBJECT.search(head)
    if m:
        subject = re.sub(r"\s*\n[ \t]+", " ", m.group("s")).strip()
        subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
        meta["subject"] = subject
        pr = _PR.search(subject)
        if pr:
            meta["pr"] = pr.group(1)
        body = head[m.end():].split("\n---\n", 1)[0].strip("\n")
        if body:
            meta["body"] = body
    if not files:
        raise SndrError(Problem("bad_diff", "the diff names no files", key="--diff",
                                hint="pass the output of git format-patch, git diff or diff -u"))
    return files, meta


def _components(raw: str, strip: int | None) -> list[str]:
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if strip is not None:
        return parts[strip:]
    return parts


def resolve_path(df: DiffFile[DiffHunk], exists: Callable[[str], bool], strip: int | None) -> str:
    """The tree-relative path a diff names: git's a/ b/ prefixes off, then the suffix from a ``vllm/`` component."""
    raw = df.raw_path
    # git's prefixes: a/ and b/, or /dev/null on the side of a creation or a deletion (any status: a new
    # binary file is "binary", and kept its b/ and was called outside vllm/)
    src_git = df.source.startswith("a/") or df.source == "/dev/null"
    dst_git = df.target.startswith("b/") or df.target == "/dev/null"
    if strip is None and src_git and dst_git and raw.startswith(("a/", "b/")):
        raw = raw[2:]
    parts = _components(raw, strip)
    path = "/".join(parts)
    if strip is not None or exists(path):
        return path
    starts = [i for i, p in enumerate(parts) if p == "vllm"]
    for i in starts:
        cand = "/".join(parts[i:])
        if exists(cand):
            return cand
    if starts and df.status == "added":
        return "/".join(parts[starts[0]:])
    return path


# ----------------------------------------------------------------------------- placing hunks


@dataclass
class Placed:
    number: int
    hunk: DiffHunk
    core_post: list[str]
    core_added: list[bool]
    start: int  # first changed line, index into the text hunks 1..k-1 left
    end: int  # one past the last changed line of the pre-image, same text
    lead: int  # diff context lines kept before the changed lines
    trail: int
    offset: int
    fuzz: int
    before: list[str]  # the text (as lines) this hunk is located in


def _split_core(pre: list[str], post: list[str]) -> tuple[int, int]:
    """Lines of common context before and after the changed lines of a hunk."""
    n = min(len(pre), len(post))
    lead = 0
    while lead < n and pre[lead] == post[lead]:
        lead += 1
    trail = 0
    while trail < n - lead and pre[-1 - trail] == post[-1 - trail]:
        trail += 1
    return lead, trail


def _find_block(lines: list[str], block: list[str], expected: int, floor: int) -> int | None:
    """Start of the occurrence of ``block`` in ``lines`` nearest to ``expected``, at or after ``floor``."""
    n, m = len(lines), len(block)
    if m == 0:
        return None
    if floor <= expected <= n - m and lines[expected:expected + m] == block:
        return expected
    first = block[0]
    best = None
    for i in range(floor, n - m + 1):
        if lines[i] == first and lines[i:i + m] == block:
            if best is None or abs(i - expected) < abs(best - expected):
                best = i
            elif i > expected:
                break
    return best


def place(path: str, hunks: list[DiffHunk], pin_lines: list[str], fuzz: int,
           numbers: list[int], rounds: list[int]) -> tuple[list[Placed], list[str], list[Problem]]:
    """Locate every hunk in order and build the post-image. Pure line arithmetic."""
    lines = list(pin_lines)
    placed: list[Placed] = []
    problems: list[Problem] = []
    delta = 0
    floor = 0
    current_round = None
    for number, rnd, h in zip(numbers, rounds, hunks):
        if rnd != current_round:  # a later commit of a series: its line numbers are relative to the text so far
            current_round, delta, floor = rnd, 0, 0
        lead, trail = _split_core(h.pre, h.post)
        core_pre = h.pre[lead:len(h.pre) - trail]
        core_post = h.post[lead:len(h.post) - trail]
        core_added = h.added[lead:len(h.post) - trail]
        base = (h.src_start - 1 if h.src_len else h.src_start) + delta
        found = None
        for f in range(0, fuzz + 1):
            fl, ft = min(f, lead), min(f, trail)
            if f and not fl and not ft:
                break
            block = h.pre[fl:len(h.pre) - ft]
            if not block:
                if f == 0 and floor <= base <= len(lines):  # diff -U0 insertion: the header is all we have
                    found = (base, 0, 0, 0)
                break
            if f and not any(b.strip() for b in block):
                break
            idx = _find_block(lines, block, base + fl, floor)
            if idx is not None:
                found = (idx + lead - fl, idx - (base + fl), f, fl)
                break
        if found is None:
            hint = "the diff is not against this pin, or an earlier hunk changed these lines"
            if any(x.endswith("\r\n") for x in h.pre) and not any(x.endswith("\r\n") for x in lines[:50]):
                hint = "the diff has CRLF line endings and the file LF; convert the diff"
            problems.append(Problem("hunk_not_found", f"hunk {number} ({h.header}) does not apply: its pre-image "
                                    "is not in the pin's file", file=path, line=max(base, 0) + 1, hint=hint))
            continue
        start, offset, used_fuzz, dropped = found
        end = start + len(core_pre)
        placed.append(Placed(number, h, core_post, core_added, start, end, lead - dropped,
                              trail - min(used_fuzz, trail), offset, used_fuzz, list(lines)))
        lines[start:end] = core_post
        delta += offset + len(core_post) - len(core_pre)
        floor = start + len(core_post)
    return placed, lines, problems


def to_pin_line(history: list[tuple[int, int, int]], idx: int) -> int:
    """Map a line index of a partially patched text back to the pin's file (0-based)."""
    for pos, old, new in reversed(history):
        if idx >= pos + new:
            idx -= new - old
        elif idx >= pos:
            idx = pos
    return idx
