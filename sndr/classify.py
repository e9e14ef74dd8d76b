"""The one verdict function. Apply, dry-run, verify, manifest and preflight all call it.

``classify_edit`` looks at one edit on one text and says what it is:
``applies`` (anchor exactly once), ``applied`` (see below), ``merged`` (a merged marker is
in the pristine text), ``ambiguous``, ``conflict`` (the anchor occurs once in
the pristine text but no longer in the text earlier patches of the set left:
an ordering problem, not drift), ``drifted``, ``optional_absent`` or
``file_missing``. Group resolution (``one_of``/``any_of``) sits on top. The
planner adds who consumed a conflicting anchor (:func:`sndr.plan._explain_conflict`).

``applied`` is said only where the text shows it:

* the anchor still occurs (an insertion: the anchor is part of its replacement):
  every anchor occurrence lies inside a replacement occurrence;
* the anchor is absent: the replacement occurs *at the anchor's alignment* (an
  anchor that starts / ends a line only matches replacement occurrences that do
  too; the alignment is read from the pristine file, else an anchor ending with a
  newline is whole lines), and the replacement *adds* text (:func:`diff_spans`
  has a non-empty changed span). A pure deletion leaves only bytes that were there
  before, so it is never recognised as applied from the text: ``drifted``
  (``deletion_unverifiable``; a merged marker recognises an upstream merge).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from difflib import SequenceMatcher
from functools import lru_cache
from os.path import commonprefix

from .locate import find_all
from .model import Edit, GroupMode, Verdict


@dataclass
class Finding:
    verdict: Verdict
    offset: int | None = None  # where the anchor (applies) or replacement (applied) sits
    offsets: list[int] = field(default_factory=list)  # every anchor occurrence (ambiguous)
    reason: str = ""
    code: str = ""


def markers_present(markers, pristine: str | None) -> str | None:
    """The first marker found in the pristine text, or None."""
    if pristine is None:
        return None
    for m in markers:
        if m in pristine:
            return m
    return None


def classify_edit(edit: Edit, text: str | None, pristine: str | None = None, extra_markers=()) -> Finding:
    """Classify ``edit`` on ``text`` (the file as the simulation has it now).

    ``pristine`` is the file before any patch of this set touched it; merged
    markers are looked up there, so a marker our own replacement introduced
    never reads as an upstream merge. It defaults to ``text``.
    """
    if text is None:
        return Finding(Verdict.FILE_MISSING, reason="target file does not exist", code="file_missing")
    pristine = text if pristine is None else pristine
    marker = markers_present(list(edit.merged_markers) + list(extra_markers), pristine)
    if marker is not None:
        return Finding(Verdict.MERGED, offset=pristine.find(marker),
                       reason=f"merged marker present: {marker.strip()[:80]!r}", code="merged_marker")
    anchor, repl = edit.anchor, edit.replacement
    occ = find_all(text, anchor)
    reps = find_all(text, repl)
    lr, la = len(repl), len(anchor)

    def covered(a: int) -> bool:
        return any(r <= a and a + la <= r + lr for r in reps)

    uncovered = [a for a in occ if not covered(a)]
    if occ and reps and not uncovered:  # an insertion: the anchor survives inside its replacement
        return Finding(Verdict.APPLIED, offset=reps[0], reason="replacement present", code="applied")
    deletion_note = ""
    if not occ and reps:  # the anchor is gone and its replacement text occurs somewhere
        aligned = _aligned(text, reps, lr, *_anchor_alignment(anchor, pristine))
        if aligned and _adds_text(anchor, repl):
            return Finding(Verdict.APPLIED, offset=aligned[0], reason="replacement present", code="applied")
        if aligned:
            deletion_note = (f"anchor not found; the edit only deletes text, and whether a deletion was applied "
                             f"cannot be told from the file alone (its remaining text occurs {len(aligned)} time(s)); "
                             "hint: a merged marker recognises an upstream merge")
    if len(uncovered) == 1:
        return Finding(Verdict.APPLIES, offset=uncovered[0], offsets=uncovered)
    if len(uncovered) > 1:
        return Finding(Verdict.AMBIGUOUS, offsets=uncovered,
                       reason=f"anchor occurs {len(uncovered)} times; it must occur exactly once",
                       code="anchor_ambiguous")
    if text is not pristine and text != pristine and len(find_all(pristine, anchor)) == 1:
        why = "anchor occurs once in the pristine file but an earlier edit of this set changed it"
        if edit.required:
            return Finding(Verdict.CONFLICT, reason=why, code="conflict")
        return Finding(Verdict.OPTIONAL_ABSENT, reason=why + " (optional edit: skipped)", code="conflict")
    if deletion_note:
        if edit.required:
            return Finding(Verdict.DRIFTED, reason=deletion_note, code="deletion_unverifiable")
        return Finding(Verdict.OPTIONAL_ABSENT, reason=deletion_note + " (optional edit: skipped)",
                       code="deletion_unverifiable")
    reason, code = _absence_reason(anchor, text)
    if edit.required:
        return Finding(Verdict.DRIFTED, reason=reason, code=code)
    return Finding(Verdict.OPTIONAL_ABSENT, reason=reason, code=code)


def _starts_line(text: str, at: int) -> bool:
    return at == 0 or text[at - 1] == "\n"


def _ends_line(text: str, end: int) -> bool:
    return (end > 0 and text[end - 1] == "\n") or end == len(text) or text[end] == "\n"


def _anchor_alignment(anchor: str, pristine: str) -> tuple[bool, bool]:
    """(starts a line, ends a line) for ``anchor``: read from its occurrences in the pristine file
    when it is there (every occurrence must be so), else from its shape: an anchor that ends with a
    newline is taken to be whole lines (it starts a line too), which is how anchors are written."""
    occ = find_all(pristine, anchor)
    if occ:
        return (all(_starts_line(pristine, a) for a in occ),
                all(_ends_line(pristine, a + len(anchor)) for a in occ))
    whole = anchor.endswith("\n")
    return whole, whole


def _aligned(text: str, reps: list[int], lr: int, starts: bool, ends: bool) -> list[int]:
    """Replacement occurrences at the anchor's alignment: an anchor that starts (ends) a line only
    matches replacement occurrences that do too (``x\\n`` is not the tail of ``curr_mm_idx\\n``)."""
    return [r for r in reps if (not starts or _starts_line(text, r)) and (not ends or _ends_line(text, r + lr))]


@lru_cache(maxsize=4096)
def diff_spans(anchor: str, replacement: str) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int, int], ...]]:
    """What an edit changes: (changed spans in replacement coordinates, equal blocks (a0, r0, n)).

    Line by line first: lines the replacement re-emits unchanged are equal, and
    whole lines it inserts are one changed span of whole lines (never a span
    that starts on the indentation the inserted lines share with the anchor's
    first line). Each replaced block of lines is then trimmed of its own common
    prefix and suffix. A zero-length changed span is a deletion point. Context
    the replacement re-emits unchanged is never counted as changed. The planner
    widens the spans to whole lines of the file (:func:`_snap_lines`): overlaps
    are judged by lines.
    """
    a, b = anchor, replacement
    al, bl = a.splitlines(True), b.splitlines(True)
    ao, bo = [0], [0]
    for ln in al:
        ao.append(ao[-1] + len(ln))
    for ln in bl:
        bo.append(bo[-1] + len(ln))
    equal: list[tuple[int, int, int]] = []
    changed: list[tuple[int, int]] = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, al, bl, autojunk=False).get_opcodes():
        a0, a1, b0, b1 = ao[i1], ao[i2], bo[j1], bo[j2]
        if tag == "equal":
            equal.append((a0, b0, a1 - a0))
            continue
        q = len(commonprefix([a[a0:a1], b[b0:b1]]))
        r = 0
        lim = min(a1 - a0, b1 - b0) - q
        while r < lim and a[a1 - 1 - r] == b[b1 - 1 - r]:
            r += 1
        if q:
            equal.append((a0, b0, q))
        changed.append((b0 + q, b1 - r))
        if r:
            equal.append((a1 - r, b1 - r, r))
    return tuple(changed), tuple(equal)


def _adds_text(anchor: str, replacement: str) -> bool:
    """Does the replacement show the edit: bytes the anchor did not hold, or a join?

    A changed span that is not empty is new text. A deletion point is a *join* when
    the replacement keeps at least one whole line before it and some text after it:
    those two pieces were not adjacent before, so finding them together shows the
    deletion. A deletion at the replacement's edge (``anchor = X + R``) leaves only
    text that was there before, so finding it proves nothing.
    """
    changed, _ = diff_spans(anchor, replacement)
    for r0, r1 in changed:
        if r1 > r0:
            return True
        if "\n" in replacement[:r0] and replacement[r0:].strip():
            return True
    return False


def _absence_reason(anchor: str, text: str) -> tuple[str, str]:
    """Explain a missing anchor precisely where a near-exact cause is visible."""
    if "\r\n" in text and "\r\n" not in anchor and anchor.replace("\n", "\r\n") in text:
        return ("anchor matches only with CRLF line endings: the target uses CRLF, the anchor LF; "
                "sndr matches bytes exactly and will not convert", "line_endings")
    stripped = "\n".join(line.rstrip() for line in anchor.split("\n"))
    if stripped != anchor and stripped in "\n".join(line.rstrip() for line in text.split("\n")):
        return "anchor matches only when trailing whitespace is ignored", "whitespace"
    indent = _indent_cause(anchor, text)
    if indent:
        return indent, "whitespace"
    first = next((ln.strip() for ln in anchor.splitlines() if ln.strip()), "")
    if first and first in text:
        return f"anchor not found (its first line {first[:60]!r} still is)", "anchor_changed"
    return "anchor not found", "anchor_missing"


def _lead(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _say_indent(ws: str) -> str:
    """``"\t\t"`` -> ``2 tabs``, ``"    "`` -> ``4 spaces``, ``""`` -> ``no indentation``; the cause, named."""
    if not ws:
        return "no indentation"
    tabs, spaces = ws.count("\t"), ws.count(" ")
    parts = ([f"{tabs} tab{'s' if tabs > 1 else ''}"] if tabs else []) + \
        ([f"{spaces} space{'s' if spaces > 1 else ''}"] if spaces else [])
    return " and ".join(parts) + f" ({ws!r})"


def _indent_cause(anchor: str, text: str) -> str:
    """The anchor matches only when each line's leading whitespace is ignored (tabs against spaces,
    another depth): say so, naming the first line's indentation in both, never stripped away."""
    def bare(t: str) -> str:
        return "\n".join(ln.lstrip(" \t") for ln in t.split("\n"))

    if bare(anchor) == anchor or bare(anchor) not in bare(text):
        return ""
    first = next((ln for ln in anchor.split("\n") if ln.strip()), "")
    found = next((ln for ln in text.split("\n") if ln.strip() and ln.lstrip(" \t") == first.lstrip(" \t")), None)
    if found is None or _lead(found) == _lead(first):
        return "anchor matches only when the lines' indentation is ignored"
    return (f"anchor matches only when indentation is ignored: its first line {first.strip()[:60]!r} is indented "
            f"with {_say_indent(_lead(first))} in the anchor, {_say_indent(_lead(found))} in the target; "
            f"sndr matches bytes exactly")


_MATCHED = (Verdict.APPLIES, Verdict.APPLIED, Verdict.MERGED)


def resolve_group(mode: GroupMode, group: str, findings: dict[str, Finding]) -> dict[str, Finding]:
    """Apply group semantics to the members' individual findings.

    ``one_of``: exactly one member may match (anchor variants of one change).
    ``any_of``: at least one must match. Members that do not match become
    ``optional_absent`` when the group is satisfied, ``drifted`` otherwise.
    """
    matched = [n for n, f in findings.items() if f.verdict in _MATCHED]
    out = dict(findings)
    if not matched:
        for n, f in findings.items():
            if f.verdict != Verdict.AMBIGUOUS and f.verdict != Verdict.FILE_MISSING:
                out[n] = Finding(Verdict.DRIFTED, reason=f"no member of {mode.value} group {group!r} matched ({f.reason})",
                                 code="group_unmatched")
        return out
    if mode == GroupMode.ONE_OF and len(matched) > 1:
        still_to_apply = [n for n in matched if findings[n].verdict == Verdict.APPLIES]
        if still_to_apply:
            for n in matched:
                out[n] = Finding(Verdict.AMBIGUOUS, offsets=findings[n].offsets or [findings[n].offset or 0],
                                 reason=f"one_of group {group!r}: members {', '.join(matched)} all match",
                                 code="group_ambiguous")
            return out
    for n in findings:
        if n not in matched:
            out[n] = Finding(Verdict.OPTIONAL_ABSENT, reason=f"{mode.value} group {group!r} satisfied by {', '.join(matched)}",
                             code="group_other_member")
    return out


def classify_create(content: str, text: str | None, pristine_missing: bool) -> Finding:
    """A file the patch creates: absent -> applies; same content -> applied/merged."""
    if text is None:
        return Finding(Verdict.APPLIES, offset=0, reason="file will be created", code="create")
    if text == content:
        if pristine_missing:
            return Finding(Verdict.APPLIED, offset=0, reason="created file present", code="applied")
        return Finding(Verdict.MERGED, offset=0, reason="file already exists upstream with this content", code="merged_file")
    return Finding(Verdict.DRIFTED, reason="file to create already exists with different content", code="create_exists")
