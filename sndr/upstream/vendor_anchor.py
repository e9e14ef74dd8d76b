"""Vendoring, step two: the edit a placed hunk becomes: its merged marker, its widened anchor, its name.

* :func:`choose_marker` - the shortest characteristic added line (or pair)
  absent from the pin's whole file, ranked so a marker cannot turn up on a
  later pin by coincidence;
* :func:`widen` - the smallest anchor around the hunk that the planner finds
  exactly there (and, strict, that reads ``applied`` once applied);
* :func:`edit_name` and :func:`slug` - the edit's name from its scope, the
  patch file's name from its title.
"""

from __future__ import annotations

import builtins
import keyword
import re

from pydantic import ValidationError

from ..classify import classify_edit
from ..model import ID_PATTERN, Edit, Verdict
from .vendor_place import Placed

# ----------------------------------------------------------------------------- merged markers

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_OPENERS = ("(", "[", "{", ",", "\\")


def _marker_rank(marker: str, pair: bool, pin_words: set[str]) -> int | None:
    """0 best (an even number: a single line; odd: a pair); None: not usable.

    A marker is looked up anywhere in the whole file of a later pin, so it
    must not turn up there by coincidence: a line that brings in a name the
    pin's file does not know is best, then other code lines, then pairs of
    lines, and only then comments and short or bare lines (a lone
    ``logger.info(``), which upstream may well write for other reasons.
    """
    body = marker.strip()
    if not body or not re.search(r"[A-Za-z0-9]", body):
        return None  # blank or pure punctuation
    rows = [r.strip() for r in body.split("\n")]
    code_rows = [r for r in rows if r and not r.startswith("#") and not _prose(r)]
    words = WORD.findall(" ".join(code_rows))
    novel = bool(code_rows) and any(w not in pin_words and _identifier_like(w) for w in words)
    bare = body.endswith(_OPENERS) and len(words) <= 2
    strong = bool(code_rows) and not bare and len(body) >= 8 and bool(words)
    rank = 0 if novel else 2 if strong else 4
    if pair and len(code_rows) < len([r for r in rows if r]):
        rank = max(rank, 2)  # half comment or prose: that half gets reworded
    if pair and any(not re.search(r"[A-Za-z0-9]", r) for r in rows):
        rank = 4  # half punctuation: the pair says little more than its other line
    return rank + (1 if pair else 0)


_KEYWORD_LINE = re.compile(r"^(import|from|return|raise|yield|assert|del|global|nonlocal|pass|break|continue|"
                           r"await|async|def|class|if|elif|else|for|while|with|try|except|finally|lambda)\b")


_BUILTIN_NAMES = frozenset(dir(builtins)) | frozenset(keyword.kwlist)


def _identifier_like(word: str) -> bool:
    """A name someone coined (``defer_async_loads``, ``RequestError``), not an English word or a builtin."""
    if word in _BUILTIN_NAMES:
        return False
    core = word.strip("_")
    return "_" in core or re.search(r"[a-z][A-Z]", core) is not None or len(core) >= 10


def _prose(row: str) -> bool:
    """A line of a docstring or other running text rather than code."""
    if any(c in row for c in "=()[]{}:") or _KEYWORD_LINE.match(row):
        return False
    return not any(_identifier_like(w) for w in WORD.findall(row))


def choose_marker(pl: Placed, pin_text: str, post_text: str, pin_words: set[str] | None = None) -> str | None:
    """The shortest characteristic added line (or pair) absent from the pin's file, present after the change."""
    if pin_words is None:
        pin_words = set(WORD.findall(pin_text))
    before = pl.before[pl.start - 1] if pl.start > 0 else None
    after = pl.before[pl.end] if pl.end < len(pl.before) else None
    seq = ([(before, False)] if before is not None else []) + list(zip(pl.core_post, pl.core_added)) + \
          ([(after, False)] if after is not None else [])
    cands: list[tuple[int, int, str]] = []
    for line, is_added in seq:
        if is_added:
            m = line.strip()
            r = _marker_rank(m, False, pin_words)
            if r is not None:
                cands.append((r, len(m), m))
    for (x, xa), (y, ya) in zip(seq, seq[1:]):
        if (xa or ya) and x.strip() and y.strip() and x.endswith("\n"):
            m = x.lstrip() + y.rstrip()
            r = _marker_rank(m, True, pin_words)
            if r is not None:
                cands.append((r, len(m), m))
    # Tier first (a new name, code, anything), then a marker this hunk alone
    # brings (one that recurs in the file after the change would also call
    # the edit merged when upstream made only one of those changes), then
    # single before pair, then the shortest.
    best = None
    for r, n, m in cands:
        if m in pin_text:
            continue
        count = post_text.count(m)
        if not count:
            continue
        key = (r // 2, count > 1, r % 2, n, m)
        if best is None or key < best:
            best = key
    return best[-1] if best else None


# ----------------------------------------------------------------------------- widening


def _splits(max_before: int, max_after: int, limit: int):
    """(before, after) context sizes, fewest lines first, balanced first, context before first."""
    for total in range(0, 2 * limit + 1):
        opts = [(b, total - b) for b in range(0, total + 1)
                if b <= min(max_before, limit) and total - b <= min(max_after, limit)]
        opts.sort(key=lambda ba: (abs(ba[0] - ba[1]), ba[1]))
        yield from opts


def widen(pl: Placed, name: str, markers: list[str], pin_text: str, post_text: str, limit: int,
           strict: bool) -> tuple[Edit, int, int] | tuple[None, int, int]:
    """The smallest anchor around the hunk that the planner finds exactly there.

    Strict: the replacement must also read ``applied`` on the post-image
    (ignoring merged markers), so the edit recognises itself once applied.
    Returns (None, occurrences, context) when nothing within ``limit`` works.
    """
    lines = pl.before
    text = "".join(lines)
    offs = [0]
    for ln in lines:
        offs.append(offs[-1] + len(ln))
    post_core = "".join(pl.core_post)
    worst = 0
    # A deletion at a file boundary (or with no line on one side) can never read applied from the
    # text (classify's rule); the smallest unique anchor is kept for it, and the byte-exact
    # post-image check of the round trip is what proves it.
    unverifiable: tuple[Edit, int, int] | None = None
    for b, a in _splits(pl.start, len(lines) - pl.end, limit):
        s, e = pl.start - b, pl.end + a
        anchor = text[offs[s]:offs[e]]
        if not anchor.strip():
            continue
        repl = text[offs[s]:offs[pl.start]] + post_core + text[offs[pl.end]:offs[e]]
        if not repl or repl == anchor:
            continue
        at = offs[s]
        first = text.find(anchor)
        second = text.find(anchor, first + 1)
        if second != -1 and repl not in text:
            worst = max(worst, 2)
            continue  # a second occurrence that no replacement occurrence can cover
        try:
            edit = Edit(name=name, anchor=anchor, replacement=repl, merged_markers=markers)
        except ValidationError:
            continue
        fd = classify_edit(edit, text, pin_text)
        if fd.verdict != Verdict.APPLIES or fd.offset != at:
            if fd.verdict == Verdict.AMBIGUOUS:
                worst = max(worst, len(fd.offsets))
            continue
        bare = edit.model_copy(update={"merged_markers": []})
        post_fd = classify_edit(bare, post_text, post_text)
        if post_fd.verdict != Verdict.APPLIED and (strict or not markers):
            if post_fd.code == "deletion_unverifiable" and unverifiable is None:
                unverifiable = (edit, b, a)
            continue
        return edit, b, a
    if unverifiable is not None:
        return unverifiable
    return None, worst, limit


# ----------------------------------------------------------------------------- naming

_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]+")


def edit_name(qualname: str, used: set[str]) -> str:
    parts = [p.strip("_") for p in qualname.split(".") if p.strip("_")][-2:]
    base = _NAME_BAD.sub("_", "-".join(parts)) if parts else "module"
    if not re.match(ID_PATTERN, base):
        base = "e" + base
    name, n = base, 2
    while name in used:
        name = f"{base}-{n}"
        n += 1
    used.add(name)
    return name


def slug(title: str) -> str:
    """File-name part from a title: no ``[Tag]`` prefixes or ``(#123)`` PR numbers, cut at a word."""
    t = re.sub(r"\(#\d+\)|^\s*(\[[^\]]*\]\s*)+", " ", title)
    s = re.sub(r"[^a-z0-9]+", "-", t.lower()).strip("-")
    if len(s) > 48:
        s = s[:49].rsplit("-", 1)[0] if "-" in s[:49] else s[:48]
    return s.strip("-") or "patch"
