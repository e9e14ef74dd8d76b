"""The one verdict function. Apply, dry-run, verify, manifest and preflight all call it.

``classify_edit`` looks at one edit on one text and says what it is:
``applies`` (anchor exactly once), ``applied`` (replacement present and every
anchor occurrence lies inside a replacement occurrence, which is how an
insertion is recognised after it was applied), ``merged`` (a merged marker is
in the pristine text), ``ambiguous``, ``conflict`` (the anchor occurs once in
the pristine text but no longer in the text earlier patches of the set left:
an ordering problem, not drift), ``drifted``, ``optional_absent`` or
``file_missing``. Group resolution (``one_of``/``any_of``) sits on top. The
planner adds who consumed a conflicting anchor (:func:`sndr.plan._explain_conflict`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    if reps and not uncovered:
        return Finding(Verdict.APPLIED, offset=reps[0], reason="replacement present", code="applied")
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
    reason, code = _absence_reason(anchor, text)
    if edit.required:
        return Finding(Verdict.DRIFTED, reason=reason, code=code)
    return Finding(Verdict.OPTIONAL_ABSENT, reason=reason, code=code)


def _absence_reason(anchor: str, text: str) -> tuple[str, str]:
    """Explain a missing anchor precisely where a near-exact cause is visible."""
    if "\r\n" in text and "\r\n" not in anchor and anchor.replace("\n", "\r\n") in text:
        return ("anchor matches only with CRLF line endings: the target uses CRLF, the anchor LF; "
                "sndr matches bytes exactly and will not convert", "line_endings")
    stripped = "\n".join(line.rstrip() for line in anchor.split("\n"))
    if stripped != anchor and stripped in "\n".join(line.rstrip() for line in text.split("\n")):
        return "anchor matches only when trailing whitespace is ignored", "whitespace"
    first = next((ln.strip() for ln in anchor.splitlines() if ln.strip()), "")
    if first and first in text:
        return f"anchor not found (its first line {first[:60]!r} still is)", "anchor_changed"
    return "anchor not found", "anchor_missing"


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
