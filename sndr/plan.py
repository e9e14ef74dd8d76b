"""The plan: a pure, sequential simulation of every enabled patch on in-memory texts.

``build_plan`` reads nothing but what ``read`` returns and writes nothing. It
gates each patch (:func:`enabled_set`, the one home of gating and of the
enabled set and its digest: lifecycle, ``SNDR_ENABLE_*``, ``vllm`` range,
``when`` predicates, ``requires``), orders
the set (``requires`` and ``after`` first), classifies every edit with
:func:`sndr.classify.classify_edit` on the text as earlier patches left it,
checks that no edit rewrites bytes an *unordered* patch changed (the changed
bytes of an edit are a diff of its anchor and replacement, not its whole
replacement span), names the patch that consumed an anchor (``conflict``),
leaves out whole the failing patches that ``on_failure = "skip"`` or
``--keep-going`` allow (re-planning the rest), and compiles every changed
``.py`` file. Apply, dry-run, verify, manifest, preflight and the startup hook
share it. The format it implements is docs/format.md.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from . import env as envmod
from .binding import check_binding
from .classify import Finding, classify_create, classify_edit, diff_spans, markers_present, resolve_group
from .errors import Problem, SndrError
from .load import PatchSet
from .locate import line_of, scopes
from .model import EditResult, LeftOut, Location, Patch, PatchResult, PatchStatus, RuntimeEdit, Verdict

Reader = Callable[[str], "str | None"]

FAILING = (Verdict.DRIFTED, Verdict.AMBIGUOUS, Verdict.FILE_MISSING, Verdict.CONFLICT)


def blocks(e: EditResult) -> bool:
    """Does this edit's verdict fail its patch? A required edit or a group member that fails, and any
    edit sndr refused (``conflict``, ``ambiguous``): an optional edit may be absent only because its
    anchor is."""
    return e.verdict in FAILING and (e.required or e.group is not None
                                     or e.verdict in (Verdict.CONFLICT, Verdict.AMBIGUOUS))

# Failures that are defects of the patch (or of the target's bytes), not drift:
# they map to exit code 2 (bad input) rather than 1 (findings). An overlap or a
# conflict between two patches that are each valid alone is a finding (exit 1).
BAD_INPUT_REASONS = {"anchor_ambiguous", "group_ambiguous", "line_endings"}
_HINTS = {
    "anchor_ambiguous": "widen the anchor with surrounding lines until it occurs exactly once",
    "group_ambiguous": "make the one_of variants mutually exclusive",
    "overlap_conflict": "order the two patches (after = [...] or requires = [...]), or re-anchor one of them",
    "line_endings": "the target uses CRLF; write the anchor with CRLF or normalise the target",
    "edit_drifted": "re-anchor the edit (python -m sndr preflight suggests where the code went)",
    "edit_file_missing": "the target file is gone; see the preflight's suggestions",
    # looked up by the edit's own reason code first: a create has no anchor to re-anchor
    "create_exists": "the file the patch creates is already in the tree, with other content: if upstream ships "
                     "it now, edit it instead of creating it (or give the patch a merged marker); if it is a "
                     "leftover, remove it",
    "deletion_unverifiable": "a pure deletion cannot be read back from the file: apply it with sndr (verify then "
                             "reads the stored pristine copies), keep a changed line of context in the "
                             "replacement, or give the edit a merged marker",
}


# ----------------------------------------------------------------------------- gating


@dataclass(frozen=True)
class Gate:
    enabled: bool
    code: str = ""
    reason: str = ""


def parse_version(version: str) -> Version | None:
    try:
        return Version(version)
    except InvalidVersion:
        return None


def gate(patch: Patch, version: str, environ=None, profile=None) -> Gate:
    """Is ``patch`` enabled on a tree of this vLLM ``version`` (and deployment ``profile``)?

    Enforced, never advisory. ``profile`` is a :class:`sndr.profile.Profile`
    or a zero-argument callable returning one (evaluated only for a patch with
    ``when``).
    """
    if patch.lifecycle == "retired":
        return Gate(False, "lifecycle_retired", "lifecycle = retired")
    var = envmod.enable_var(patch.id)
    override = envmod.enable_override(patch.id, environ)
    if override is False:
        return Gate(False, "disabled_by_env", f"disabled by {var}=0")
    if override is None and not patch.default:
        return Gate(False, "disabled_by_default", f"default = false (enable with {var}=1)")
    if override is None and patch.kind == "plugin" and not envmod.plugins_enabled(environ):
        return Gate(False, "disabled_by_env", f"disabled by {envmod.PLUGINS}=0 (enable this plugin alone with {var}=1)")
    if patch.vllm:
        v = parse_version(version)
        if v is None:
            return Gate(False, "version_unknown", f"vllm {patch.vllm!r} required but the tree's version {version!r} is unknown")
        if not SpecifierSet(patch.vllm).contains(v, prereleases=True):
            return Gate(False, "version_mismatch", f"vllm {version} does not satisfy {patch.vllm!r}")
    if patch.when:
        from .profile import Profile, evaluate

        prof = profile() if callable(profile) else profile
        ok, code, reason = evaluate(patch.when, prof if prof is not None else Profile(), patch.id)
        return Gate(ok, code, reason)
    return Gate(True)


def order_patches(patches: list[Patch]) -> list[Patch]:
    """Topological order by ``requires`` and ``after``; ties keep the patch set's order."""
    index = {p.id: i for i, p in enumerate(patches)}
    by_id = {p.id: p for p in patches}
    done: set[str] = set()
    out: list[Patch] = []
    visiting: set[str] = set()

    def visit(p: Patch) -> None:
        if p.id in done or p.id in visiting:
            return
        visiting.add(p.id)
        for r in sorted((r for r in (*p.requires, *p.after) if r in by_id), key=index.__getitem__):
            visit(by_id[r])
        visiting.discard(p.id)
        done.add(p.id)
        out.append(p)

    for p in patches:
        visit(p)
    return out


# ----------------------------------------------------------------------------- changed bytes
# What an edit changes is :func:`sndr.classify.diff_spans` (classify's "applied" rule reads it too).


def _snap_lines(text: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` widened to whole lines of ``text``. A zero-length point at a line boundary stays a
    point (whole lines were deleted there); one inside a line becomes that line (the line was changed)."""
    s = text.rfind("\n", 0, start) + 1
    if start == end and s == start:
        return start, end
    e = end
    if e > 0 and text[e - 1] != "\n":
        nl = text.find("\n", e)
        e = len(text) if nl < 0 else nl + 1
    return s, e


def _line_span(base: str, p0: int, p1: int) -> tuple[int, int]:
    """First and last pristine line of ``[p0, p1)`` (a span inside inserted text maps to one line)."""
    first = line_of(base, p0)
    return first, max(first, line_of(base, max(p1 - 1, 0)))


def _touches(r0: int, r1: int, a0: int, a1: int) -> bool:
    """Does a changed span [r0, r1) (zero-length: a deletion point) lie in an anchor span [a0, a1)?"""
    if r0 == r1:
        return a0 < r0 < a1
    return r0 < a1 and a0 < r1


# ----------------------------------------------------------------------------- simulation state


@dataclass
class Change:
    """Bytes one edit changed, in current coordinates, and where its anchor sat in the pristine file."""

    start: int
    end: int
    patch: str
    edit: str
    lines: tuple[int, int]


@dataclass
class FileState:
    path: str
    pristine: str | None
    text: str | None
    # (offset, old_len, new_len) of each replacement, in application order, for
    # mapping current offsets back to the pristine file.
    history: list[tuple[int, int, int]] = field(default_factory=list)
    # The equal blocks (diff_spans) of each replacement, parallel to ``history``.
    equal: list[tuple] = field(default_factory=list)
    # Replacement spans in current coordinates: [start, end, patch id].
    regions: list[list] = field(default_factory=list)
    patches: list[str] = field(default_factory=list)
    # The changed bytes of every applied edit (diff of anchor vs replacement).
    changes: list[Change] = field(default_factory=list)

    def copy(self) -> FileState:
        return FileState(self.path, self.pristine, self.text, list(self.history), list(self.equal),
                         [list(r) for r in self.regions], list(self.patches),
                         [Change(c.start, c.end, c.patch, c.edit, c.lines) for c in self.changes])

    def to_pristine(self, offset: int) -> int:
        for pos, old, new in reversed(self.history):
            if offset >= pos + new:
                offset -= new - old
            elif offset >= pos:
                offset = pos
        return offset

    def from_pristine(self, offset: int, end: bool = False) -> int:
        """A pristine offset in current coordinates.

        Inside a replaced span, an offset in bytes the replacement re-emitted
        unchanged follows them; any other lands on the span's start (or its end,
        for ``end``).
        """
        for (pos, old, new), equal in zip(self.history, self.equal):
            if offset >= pos + old:
                offset += new - old
            elif offset > pos:
                rel = offset - pos
                for a0, r0, n in equal:
                    if (a0 < rel <= a0 + n) if end else (a0 <= rel < a0 + n):
                        offset = pos + r0 + (rel - a0)
                        break
                else:
                    offset = pos + new if end else pos
        return offset

    def replace(self, offset: int, old_len: int, new: str, patch_id: str, edit: str = "",
                anchor: str | None = None) -> None:
        assert self.text is not None
        old_end = offset + old_len
        self.text = self.text[:offset] + new + self.text[old_end:]
        delta = len(new) - old_len
        kept = []
        for s, e, pid in self.regions:
            if e <= offset:
                kept.append([s, e, pid])
            elif s >= old_end:
                kept.append([s + delta, e + delta, pid])
        kept.append([offset, offset + len(new), patch_id])
        self.regions = sorted(kept)
        changed, equal = diff_spans(anchor, new) if anchor is not None else (((0, len(new)),), ())
        moved: list[Change] = []
        for c in self.changes:
            if c.end < offset or (c.end == offset and c.start < c.end) or (c.start == c.end == offset):
                moved.append(c)
            elif c.start > old_end or (c.start == old_end and c.start < c.end) or (c.start == c.end == old_end):
                moved.append(Change(c.start + delta, c.end + delta, c.patch, c.edit, c.lines))
            else:
                # Lines are judged whole, so a change may straddle the rewritten span: its parts outside
                # stay; inside, what the new replacement re-emits unchanged keeps its author.
                if c.start < offset:
                    moved.append(Change(c.start, offset, c.patch, c.edit, c.lines))
                if c.end > old_end:
                    moved.append(Change(old_end + delta, c.end + delta, c.patch, c.edit, c.lines))
                for a0, r0, n in equal:
                    lo, hi = max(c.start - offset, a0), min(c.end - offset, a0 + n)
                    if lo < hi or (c.start == c.end and a0 < c.start - offset < a0 + n):
                        moved.append(Change(offset + r0 + (lo - a0), offset + r0 + (hi - a0), c.patch, c.edit, c.lines))
        lines = _line_span(self.pristine or "", self.to_pristine(offset), self.to_pristine(old_end))
        for r0, r1 in changed:
            moved.append(Change(*_snap_lines(self.text, offset + r0, offset + r1), patch_id, edit, lines))
        self.changes = sorted(moved, key=lambda c: (c.start, c.end))
        self.history.append((offset, old_len, len(new)))
        self.equal.append(equal)
        if patch_id not in self.patches:
            self.patches.append(patch_id)

    def changed_in(self, a0: int, a1: int) -> list[Change]:
        return [c for c in self.changes if _touches(c.start, c.end, a0, a1)]


@dataclass
class FileChange:
    path: str
    pristine: str | None  # None: the plan creates the file
    new: str
    patches: list[str]


@dataclass
class Plan:
    version: str
    patches: list[PatchResult]
    changes: dict[str, FileChange]
    problems: list[Problem]
    enabled: list[str]
    digest: str
    left_out: list[LeftOut] = field(default_factory=list)
    #: Files the plan read and changes not (path -> the text it read): the verdicts there (merged, optional
    #: absent, a binding) rest on them, so the ledger records them too (:func:`sndr.state.read_only_entry`).
    read: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def applied(self) -> list[str]:
        """The enabled ids minus those left out: what the tree holds after an apply."""
        out = {lo.id for lo in self.left_out}
        return [i for i in self.enabled if i not in out]

    @property
    def not_selected(self) -> list[PatchResult]:
        return [p for p in self.patches if p.reason_code == "not_selected"]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.patches:
            if p.reason_code == "not_selected":
                continue  # --only: summarised in one line, not counted edit by edit
            for e in p.edits:
                out[e.verdict.value] = out.get(e.verdict.value, 0) + 1
            if p.status == "gated" and not p.edits:
                out["gated"] = out.get("gated", 0) + 1
        return dict(sorted(out.items()))


# ----------------------------------------------------------------------------- the planner


def _requires_closure(patch: Patch, by_id: dict[str, Patch]) -> set[str]:
    seen: set[str] = set()
    stack = list(patch.requires)
    while stack:
        r = stack.pop()
        if r in seen or r not in by_id:
            continue
        seen.add(r)
        stack.extend(by_id[r].requires)
    return seen


def _order_closure(patch: Patch, by_id: dict[str, Patch]) -> set[str]:
    """Every patch ordered before ``patch`` by ``requires`` or ``after`` (transitively)."""
    seen: set[str] = set()
    stack = [*patch.requires, *patch.after]
    while stack:
        r = stack.pop()
        if r in seen or r not in by_id:
            continue
        seen.add(r)
        stack.extend((*by_id[r].requires, *by_id[r].after))
    return seen


@dataclass(frozen=True)
class EnabledSet:
    """Which patches a run enables, and the digest of exactly those: what apply writes into the ledger,
    verify compares, the startup hook attests and ``sndr list`` prints. Built only by :func:`enabled_set`."""

    ordered: tuple[Patch, ...]  # the whole set in apply order (``requires`` and ``after`` first)
    gates: Mapping[str, Gate] = field(compare=False)  # every patch's gate, by id (read-only)
    ids: tuple[str, ...]  # the enabled ids, in apply order
    digest: str  # ``PatchSet.digest(ids)``

    def reasons(self) -> dict[str, str]:
        """id -> "code: reason" of every gated patch (the startup hook attests them; ``sndr status`` shows them)."""
        return {pid: f"{g.code}: {g.reason}" for pid, g in self.gates.items() if not g.enabled}


def enabled_set(patch_set: PatchSet, version: str, environ=None, *,
                only: list[str] | None = None, profile=None) -> EnabledSet:
    """The apply order, every patch's gate, the enabled ids and their digest, reading no target file.

    The one home of the enabled set: apply, verify, the planner, the startup hook's resolution and
    ``sndr list`` all take it from here, so the digest a process attests is the one apply writes.
    ``--only`` pulls in what the selected patches require; a patch whose
    ``requires`` is not enabled is gated ``requires_gated``. ``when`` tables are
    evaluated against ``profile`` (a :class:`sndr.profile.Profile`, passed
    explicitly); without one, against :func:`sndr.profile.active_profile` (the
    startup hook's process profile, else ``$SNDR_PROFILE``, else no profile:
    every key unknown), loaded only when a patch has a ``when``.
    """
    environ = os.environ if environ is None else environ
    by_id = patch_set.by_id
    ordered = order_patches(patch_set.patches)
    selected: set[str] | None = None
    if only:
        only = select_ids(patch_set, only)
        selected = set(only)
        for i in only:
            selected |= _requires_closure(by_id[i], by_id)
    memo: list = []

    def get_profile():
        if not memo:
            if profile is not None:
                memo.append(profile)
            else:
                from .profile import active_profile

                memo.append(active_profile(environ))
        return memo[0]

    gates: dict[str, Gate] = {}
    for p in ordered:
        if selected is not None and p.id not in selected:
            gates[p.id] = Gate(False, "not_selected", "not selected by --only")
            continue
        g = gate(p, version, environ, get_profile)
        if g.enabled:
            missing = [r for r in p.requires if not gates.get(r, Gate(False)).enabled]
            if missing:
                g = Gate(False, "requires_gated", f"requires {', '.join(missing)}, which is not enabled")
        gates[p.id] = g
    ids = [p.id for p in ordered if gates[p.id].enabled]
    return EnabledSet(ordered=tuple(ordered), gates=MappingProxyType(gates), ids=tuple(ids),
                      digest=patch_set.digest(ids))


def select_ids(patch_set: PatchSet, names: list[str]) -> list[str]:
    """``--only`` names -> patch ids, matched as ``SNDR_ENABLE_<ID>`` matches them: exactly, else
    case-insensitively with every character other than ``A-Z 0-9 _`` read as ``_``
    (:func:`sndr.env.enable_var`), so ``--only pn0001`` selects what ``SNDR_ENABLE_pn0001=1`` enables.
    A name that matches no id (or two) is ``unknown_id``, with the nearest id when there is one."""
    import difflib

    by_key: dict[str, list[str]] = {}
    for pid in patch_set.by_id:
        by_key.setdefault(envmod.enable_var(pid), []).append(pid)
    out, unknown = [], []
    for name in names:
        found = [name] if name in patch_set.by_id else by_key.get(envmod.enable_var(name), [])
        if len(found) == 1:
            out.append(found[0])
        else:
            near = difflib.get_close_matches(name.upper(), [i.upper() for i in patch_set.by_id], n=1)
            hint = next((i for i in patch_set.by_id if near and i.upper() == near[0]), None)
            unknown.append(name + (f" (did you mean {hint}?)" if hint else ""))
    if unknown:
        raise SndrError(Problem("unknown_id", f"--only names unknown patch(es): {', '.join(unknown)}", key="--only"))
    return out


def unknown_enable_vars(patch_set: PatchSet, environ=None) -> list[str]:
    """One line per ``SNDR_ENABLE_*`` variable of ``environ`` that names no patch of the set (it is
    ignored), with the nearest variable that would name one."""
    import difflib

    environ = os.environ if environ is None else environ
    known = {envmod.enable_var(pid) for pid in patch_set.by_id}
    out = []
    for var in sorted(k for k in environ if k.startswith(envmod.ENABLE_PREFIX)):
        if envmod.enable_var(var[len(envmod.ENABLE_PREFIX):]) in known:
            continue
        near = difflib.get_close_matches(var.upper(), sorted(known), n=1)
        out.append(f"{var} names no patch of the set; it is ignored"
                   + (f" (did you mean {near[0]}?)" if near else ""))
    return out


def build_plan(patch_set: PatchSet, read: Reader, version: str, *, environ=None,
               only: list[str] | None = None, check_compile: bool = True, keep_going: bool = False,
               profile=None) -> Plan:
    """Simulate the patch set on the texts ``read`` returns (the pristine tree).

    A failing patch whose ``on_failure`` is ``"skip"`` (every failing patch,
    with ``keep_going``) is left out whole, with the patches that require it,
    and the rest is planned again without them, until nothing fails or a
    failure is not allowed to be skipped.
    """
    environ = os.environ if environ is None else environ
    by_id = patch_set.by_id
    es = enabled_set(patch_set, version, environ, only=only, profile=profile)
    ordered, gates = list(es.ordered), es.gates
    texts: dict[str, object] = {}

    def cached(rel: str) -> str | None:
        if rel not in texts:
            try:
                texts[rel] = read(rel)
            except SndrError as exc:
                texts[rel] = exc
        value = texts[rel]
        if isinstance(value, SndrError):
            raise value
        return value  # type: ignore[return-value]

    left: dict[str, LeftOut] = _settle_conflicts(ordered, gates, by_id, keep_going)
    attempts: dict[str, PatchResult] = {}
    blocked = _leave_out_dependents(patch_set, ordered, gates, left, keep_going)
    if blocked:
        plan = _plan_once(patch_set, cached, version, es, left, attempts, check_compile)
        plan.problems.extend(blocked)
        return plan
    while True:
        plan = _plan_once(patch_set, cached, version, es, left, attempts, check_compile)
        failed = [r for r in plan.patches if r.status == "failed"]
        blamed = {pr.patch for pr in plan.problems if pr.code == "compile_error" and pr.patch in by_id}
        failed += [r for r in plan.patches if r.id in blamed and r.status != "failed"]
        if not failed:
            return plan
        newly: dict[str, LeftOut] = {}
        for r in failed:
            p = by_id[r.id]
            if not (keep_going or p.on_failure == "skip"):
                return plan  # a failure the set may not skip: refused as a whole
            code = next((_problem_code(e) for e in r.edits if e.verdict in FAILING), "compile_error")
            reason = r.reason or next((pr.message for pr in plan.problems if pr.patch == r.id), "failed")
            newly[r.id] = LeftOut(id=r.id, reason=reason, code=code, on_failure=p.on_failure,
                                  by="on_failure" if p.on_failure == "skip" else "keep_going")
            attempts[r.id] = r
        left.update(newly)
        blocked = _leave_out_dependents(patch_set, ordered, gates, left, keep_going)
        if blocked:
            plan = _plan_once(patch_set, cached, version, es, left, attempts, check_compile)
            plan.problems.extend(blocked)
            return plan


def _leave_out_dependents(patch_set: PatchSet, ordered: list[Patch], gates: Mapping[str, Gate],
                          left: dict[str, LeftOut], keep_going: bool) -> list[Problem]:
    """Leave out (in ``left``) every enabled patch that requires a left-out one; the problems of those whose
    ``on_failure`` is "fail" (without ``keep_going``): they refuse the set."""
    by_id = patch_set.by_id
    blocked: list[Problem] = []
    for p in ordered:
        if p.id in left or not gates[p.id].enabled:
            continue
        gone = sorted(_requires_closure(p, by_id) & set(left))
        if gone:
            left[p.id] = LeftOut(id=p.id, reason=f"requires {', '.join(gone)}, which was left out",
                                 code="requires_left_out", by="requires", on_failure=p.on_failure)
            if p.on_failure == "fail" and not keep_going:
                blocked.append(Problem("requires_left_out",
                                       f"requires {', '.join(gone)}, which was left out "
                                       f"({'; '.join(left[g].reason for g in gone)}), and its on_failure is "
                                       "\"fail\"", file=patch_set.source_of(p.id), patch=p.id,
                                       hint=f'set on_failure = "skip" in {p.id}, or run with --keep-going'))
    return blocked


def _settle_conflicts(ordered: list[Patch], gates: Mapping[str, Gate], by_id: dict[str, Patch],
                      keep_going: bool) -> dict[str, LeftOut]:
    """Declared ``conflicts`` between two enabled patches that the failure policy lets sndr settle.

    Of each pair, the patch applied later is left out when ``keep_going`` or its own ``on_failure =
    "skip"`` allows; else the earlier one when its own ``skip`` allows. A pair nothing settles stays a
    ``conflicts_enabled`` finding (:func:`_plan_once`). Pairs are taken in apply order, and a pair one of
    whose patches is already left out is settled.
    """
    pos = {p.id: i for i, p in enumerate(ordered)}
    on = {p.id for p in ordered if gates[p.id].enabled}
    pairs = {tuple(sorted((p.id, c), key=pos.__getitem__)) for p in ordered for c in p.conflicts
             if p.id in on and c in on}
    out: dict[str, LeftOut] = {}
    for first, later in sorted(pairs, key=lambda t: (pos[t[1]], pos[t[0]])):
        if first in out or later in out:
            continue
        declared = " and ".join(f"{a}.conflicts names {b}" for a, b in ((first, later), (later, first))
                                if b in by_id[a].conflicts)
        for victim, other, when in ((later, first, "which applies first"), (first, later, "which applies later")):
            v = by_id[victim]
            if v.on_failure == "skip" or (keep_going and victim == later):
                out[victim] = LeftOut(id=victim, code="conflicts_enabled", on_failure=v.on_failure,
                                      by="on_failure" if v.on_failure == "skip" else "keep_going",
                                      reason=f"conflicts with {other} ({declared}), {when} and is enabled too")
                break
    return out


def _problem_code(e: EditResult) -> str:
    if e.verdict == Verdict.CONFLICT:
        return e.reason_code or "conflict"
    return e.reason_code if e.reason_code in BAD_INPUT_REASONS else f"edit_{e.verdict.value}"


def _plan_once(patch_set: PatchSet, read: Reader, version: str, es: EnabledSet, left: dict[str, LeftOut],
               attempts: dict[str, PatchResult], check_compile: bool) -> Plan:
    by_id = patch_set.by_id
    problems: list[Problem] = []
    ordered, gates = es.ordered, es.gates
    enabled = list(es.ids)
    en = set(enabled)
    reported: set[frozenset] = set()
    for p in ordered:
        for c in p.conflicts:
            pair = frozenset((p.id, c))
            if p.id in en and c in en and pair not in reported and p.id not in left and c not in left:
                reported.add(pair)
                problems.append(Problem("conflicts_enabled", f"{p.id} conflicts with {c} and both are enabled",
                                        file=patch_set.source_of(p.id), key="conflicts", patch=p.id,
                                        hint=f"disable one of them, e.g. {envmod.enable_var(c)}=0"))

    files: dict[str, FileState] = {}
    unreadable: set[str] = set()  # already reported by the reader: not also "does not exist"

    def state(path: str) -> FileState:
        if path not in files:
            try:
                text = read(path)
            except SndrError as exc:
                problems.extend(exc.problems)
                unreadable.add(path)
                text = None
            files[path] = FileState(path, text, text)
        return files[path]

    def binding_file(r: RuntimeEdit) -> str:
        """Where a runtime target is defined in this tree (its imports followed), else its module's name. Read
        aside (not a file the plan's verdicts rest on: the patch is off)."""
        def text(rel: str) -> str | None:
            try:
                return files[rel].pristine if rel in files else read(rel)
            except SndrError:
                return None

        _, _, b = check_binding(r, text)
        return b.file if b else r.target.split(":")[0]

    results: list[PatchResult] = []
    for p in ordered:
        g = gates[p.id]
        if not g.enabled:
            edits = [] if g.code == "not_selected" else [
                EditResult(patch=p.id, file=f.path, name=e.name, verdict=Verdict.GATED, required=e.required,
                           group=e.group, reason=g.reason) for f, e in p.edits()]
            if g.code != "not_selected":  # its runtime edits too: a bump that gates a plugin patch names them
                edits += [EditResult(patch=p.id, file=binding_file(r), name=r.name,
                                     verdict=Verdict.GATED, required=r.required, reason=g.reason, binding=True)
                          for r in p.runtime]
            results.append(PatchResult(id=p.id, title=p.title, kind=p.kind, status="gated", reason=g.reason,
                                       reason_code=g.code, on_failure=p.on_failure, edits=edits))
            continue
        if p.id in left:
            lo = left[p.id]
            prior = attempts.get(p.id)
            results.append(PatchResult(id=p.id, title=p.title, kind=p.kind, status="left_out", reason=lo.reason,
                                       reason_code=lo.code, on_failure=p.on_failure,
                                       edits=list(prior.edits) if prior is not None else []))
            continue
        result, new_states = _simulate_patch(p, state, _order_closure(p, by_id), by_id)
        result.on_failure = p.on_failure
        if g.code and not result.reason_code:  # enabled with a note (when_forced): said, never silent
            result.reason_code, result.reason = g.code, "; ".join(x for x in (result.reason, g.reason) if x)
        for e in result.edits:
            if e.verdict == Verdict.FILE_MISSING and e.file in unreadable:
                # The reader refused the target (too large, not regular, symlink): that error says
                # why, once; the edit must not also claim the file does not exist.
                e.reason = "target refused by the reader (see the error for this file); not judged"
        if result.status == "failed":
            for e in result.edits:
                if blocks(e) and not (e.verdict == Verdict.FILE_MISSING and e.file in unreadable):
                    code = _problem_code(e)
                    problems.append(Problem(code, f"edit {e.name!r}: {e.reason or e.verdict.value}",
                                            file=e.file, line=e.line, patch=p.id,
                                            hint=e.hint or _HINTS.get(e.reason_code or "") or _HINTS.get(code)))
        else:
            files.update(new_states)
        for r in p.runtime:
            verdict, reason, b = check_binding(r, lambda rel: state(rel).text if state(rel).pristine is not None else None)
            v = Verdict(verdict)
            result.edits.append(EditResult(patch=p.id, file=b.file if b else r.target.split(":")[0], name=r.name,
                                           verdict=v, required=r.required, reason=reason or f"runtime target {r.target}",
                                           line=b.line if b else None, qualname=b.qualname if b else None,
                                           binding=True))
            if v in FAILING and r.required:
                result.status = "failed"
                problems.append(Problem(f"runtime_{v.value}", f"runtime edit {r.name!r}: {reason}", patch=p.id,
                                        file=patch_set.source_of(p.id)))
        if p.runtime and result.status == "applied" and any(e.verdict == Verdict.APPLIES for e in result.edits):
            # A binding that holds is installed by each vLLM process at startup: nothing on disk says it is
            # in place, so the plan says it applies; a tree whose ledger records the patch reads it applied.
            result.status = "applies"
        results.append(result)

    changes: dict[str, FileChange] = {}
    for path, st in files.items():
        if st.text is not None and st.text != st.pristine:
            changes[path] = FileChange(path, st.pristine, st.text, list(st.patches))
    if check_compile:
        problems.extend(_compile_check(changes, files))
    left_out = [left[p.id] for p in ordered if p.id in left and gates[p.id].enabled]
    only_read = {path: st.pristine for path, st in sorted(files.items())
                 if st.pristine is not None and path not in changes and path not in unreadable}
    return Plan(version=version, patches=results, changes=changes, problems=problems, enabled=enabled, digest=es.digest,
                left_out=left_out, read=only_read)


def _simulate_patch(p: Patch, state: Callable[[str], FileState], ordered_ids: set[str],
                    by_id: dict[str, Patch]) -> tuple[PatchResult, dict[str, FileState]]:
    """Classify and apply one patch on copies of the file states it touches."""
    local = {f.path: state(f.path).copy() for f in p.files}
    edits_out: list[EditResult] = []
    failed = False
    patch_marker = None
    for f in p.files:
        patch_marker = patch_marker or markers_present(p.merged_markers, local[f.path].pristine)
    for f in p.files:
        st = local[f.path]
        if f.create is not None:
            fd = classify_create(f.create, st.text, st.pristine is None)
            if patch_marker:
                fd = Finding(Verdict.MERGED, reason=f"patch merged marker present: {patch_marker.strip()[:80]!r}", code="merged_marker")
            if fd.verdict == Verdict.APPLIES:
                st.text = f.create
                st.regions = [[0, len(f.create), p.id]]
                st.changes = [Change(0, len(f.create), p.id, "create", (1, 1))]
                st.patches.append(p.id)
            edits_out.append(EditResult(patch=p.id, file=f.path, name="create", verdict=fd.verdict, reason=fd.reason,
                                        reason_code=fd.code, line=1 if fd.verdict != Verdict.DRIFTED else None,
                                        qualname=""))
            failed |= fd.verdict in FAILING
            continue
        decided: dict[str, Finding] = {}

        def unordered(a: int, b: int, st: FileState = st) -> list:
            """The changes in [a, b) of the working text made by another patch not ordered with this one."""
            return [c for c in st.changed_in(a, b) if c.patch != p.id and c.patch not in ordered_ids]

        for e in f.edits:
            if patch_marker:
                fd = Finding(Verdict.MERGED, reason=f"patch merged marker present: {patch_marker.strip()[:80]!r}", code="merged_marker")
            elif e.group is not None:
                if e.name not in decided:
                    members = [(ff, m) for ff, m in p.edits() if m.group == e.group]
                    raw = {m.name: classify_edit(m, local[ff.path].text if ff.path in local else None,
                                                 local[ff.path].pristine if ff.path in local else None, f.merged_markers)
                           for ff, m in members}
                    decided.update(resolve_group(p.groups[e.group], e.group, raw))
                fd = decided[e.name]
                if fd.verdict == Verdict.APPLIES:
                    fd = classify_edit(e, st.text, st.pristine, f.merged_markers)  # offsets may have moved
            else:
                fd = classify_edit(e, st.text, st.pristine, f.merged_markers)
            er = _edit_result(p, f.path, e, fd, st)
            if fd.verdict == Verdict.CONFLICT or (fd.code == "conflict" and fd.verdict == Verdict.OPTIONAL_ABSENT):
                _explain_conflict(er, p, e, st, ordered_ids, by_id)
                if er.verdict == Verdict.OPTIONAL_ABSENT and set(er.conflict_with) - ordered_ids - {p.id}:
                    # An unordered patch consumed this optional anchor: sndr refuses the edit, which is a
                    # finding, never an absence (the other order would have applied it).
                    er.verdict = Verdict.CONFLICT
                    er.reason += "; the edit is optional, but an edit refused is never skipped"
            if fd.verdict == Verdict.AMBIGUOUS and st.pristine is not None and st.pristine.count(e.anchor) == 1:
                # Unique on pristine, repeated now: an unordered patch's text made it ambiguous. That is the
                # stack's overlap (exit 1, naming the patch), not the author's bad anchor (exit 2).
                la = len(e.anchor)
                foreign = [c for off in fd.offsets for c in unordered(off, off + la)]
                if foreign:
                    c = foreign[0]
                    own = [off for off in fd.offsets if not [x for x in st.changed_in(off, off + la) if x.patch != p.id]]
                    fd, er = _overlap(p, f.path, e, st, foreign, (own or fd.offsets)[0], list(fd.offsets),
                                      f"the anchor occurs once in the pristine file, but {c.patch}.{c.edit} (pristine "
                                      f"lines {c.lines[0]}-{c.lines[1]}) wrote another copy of it, and the two patches "
                                      f"are not ordered",
                                      f"order the two patches (after = [\"{c.patch}\"] in {p.id}, then widen this "
                                      f"anchor so it occurs once on {c.patch}'s text; or after = [\"{p.id}\"] in "
                                      f"{c.patch})")
            if fd.verdict == Verdict.APPLIED and fd.offset is not None:
                # "Replacement present" is upstream's text only if no other patch of this plan wrote those bytes:
                # two unordered patches making the same change both read done (one wrote it) were never flagged.
                r0 = fd.offset
                foreign = unordered(r0, r0 + len(e.replacement))
                if foreign:
                    c = foreign[0]
                    fd, er = _overlap(p, f.path, e, st, foreign, r0, [r0],
                                      f"the replacement text is present only because {c.patch}.{c.edit} (pristine "
                                      f"lines {c.lines[0]}-{c.lines[1]}) wrote it, and the two patches are not "
                                      f"ordered: two patches make the same change",
                                      f"keep the change in one of them (drop this edit, or {c.patch}'s), or declare "
                                      f"after = [\"{c.patch}\"] in {p.id} if it is meant to build on it")
            if fd.verdict == Verdict.APPLIES:
                at = fd.offset
                assert at is not None, "an APPLIES finding always says where the anchor sits"
                a0, a1 = at, at + len(e.anchor)
                hits = [c for c in st.changed_in(a0, a1) if c.patch != p.id]
                foreign = [c for c in hits if c.patch not in ordered_ids]
                if foreign:
                    c = foreign[0]
                    base = st.pristine or ""
                    l0, l1 = _line_span(base, st.to_pristine(a0), st.to_pristine(a1))
                    fd, er = _overlap(p, f.path, e, st, foreign, at, [at],
                                      f"the anchor (pristine lines {l0}-{l1}) overlaps bytes that {c.patch}.{c.edit} "
                                      f"(pristine lines {c.lines[0]}-{c.lines[1]}) changed, and the two patches are "
                                      f"not ordered",
                                      f"if {p.id} is written on the text {c.patch} produces, declare after = "
                                      f"[\"{c.patch}\"] in {p.id}; otherwise re-anchor one of them")
                else:
                    # Chained: the anchor holds bytes an ordered patch changed (re-emitted context is pristine).
                    er.chained_from = sorted({c.patch for c in hits})
                    st.replace(at, len(e.anchor), e.replacement, p.id, e.name, e.anchor)
            if blocks(er):
                failed = True
            edits_out.append(er)
    verdicts = {e.verdict for e in edits_out}
    status: PatchStatus
    if failed:
        status = "failed"
    elif verdicts <= {Verdict.MERGED, Verdict.OPTIONAL_ABSENT} and Verdict.MERGED in verdicts:
        status = "merged"
    elif Verdict.APPLIES in verdicts:
        status = "applies"
    elif Verdict.AMBIGUOUS in verdicts:
        status = "partial"
    elif edits_out and verdicts <= {Verdict.OPTIONAL_ABSENT, Verdict.FILE_MISSING}:
        status = "nothing_to_do"
    else:
        status = "applied"
    reason = ""
    if status == "failed":
        bad = [e for e in edits_out if e.verdict in FAILING]
        reason = "; ".join(f"{e.name}: {e.verdict.value}" for e in bad)
    elif status == "merged":
        reason = "upstream carries this change (merged markers present)"
    elif status == "nothing_to_do":
        reason = "every edit is optional and absent here (or its file is missing): the patch changes nothing"
    return PatchResult(id=p.id, title=p.title, kind=p.kind, status=status, reason=reason,
                       reason_code="nothing_to_do" if status == "nothing_to_do" else "", edits=edits_out), local


def _overlap(p: Patch, path: str, e, st: FileState, foreign: list, offset: int, offsets: list[int], reason: str,
             hint: str) -> tuple[Finding, EditResult]:
    """The ``overlap_conflict`` of edit ``e``: its finding and result, naming the unordered patches (``foreign``:
    their changes) whose bytes it rests on, with ``reason`` and ``hint``."""
    fd = Finding(Verdict.CONFLICT, offset=offset, offsets=offsets, reason=reason, code="overlap_conflict")
    er = _edit_result(p, path, e, fd, st)
    er.conflict_with = sorted({c.patch for c in foreign})
    er.hint = hint
    return fd, er


def _explain_conflict(er: EditResult, p: Patch, e, st: FileState, ordered_ids: set[str],
                      by_id: dict[str, Patch]) -> None:
    """Name the edit that consumed ``e``'s anchor, both line spans, and whether the other order would work."""
    base = st.pristine or ""
    pa0 = base.find(e.anchor)
    if pa0 < 0:
        return
    pa1 = pa0 + len(e.anchor)
    mine = (line_of(base, pa0), line_of(base, pa1 - 1))
    er.offset, er.line = pa0, mine[0]
    er.qualname = scopes(base).qualname(mine[0])
    hits = st.changed_in(st.from_pristine(pa0), st.from_pristine(pa1, end=True))
    if not hits:
        er.reason = f"anchor (pristine lines {mine[0]}-{mine[1]}) occurs once in the pristine file but not after the earlier patches"
        return
    c = hits[0]
    others = sorted({h.patch for h in hits})
    er.conflict_with = others
    who = f"an earlier edit of this patch ({c.edit})" if c.patch == p.id else f"{c.patch}.{c.edit}"
    er.reason = (f"anchor (pristine lines {mine[0]}-{mine[1]}) was changed by {who} (pristine lines "
                 f"{c.lines[0]}-{c.lines[1]}), which applies earlier: an ordering conflict, not drift")
    if c.patch == p.id:
        er.hint = "two edits of this patch overlap: merge them into one edit"
        return
    other = by_id.get(c.patch)
    oe = next((x for _, x in other.edits() if x.name == c.edit), None) if other is not None else None
    reverse_works = False
    if oe is not None:
        swapped = base[:pa0] + e.replacement + base[pa1:]
        reverse_works = classify_edit(oe, swapped).verdict in (Verdict.APPLIES, Verdict.APPLIED)
    if c.patch in ordered_ids:
        er.hint = (f"{p.id} is ordered after {c.patch}: re-anchor {p.id}.{e.name} on the text {c.patch} produces"
                   + (f", or drop the ordering and add after = [\"{p.id}\"] to {c.patch}" if reverse_works else ""))
    elif reverse_works:
        er.hint = (f"add after = [\"{p.id}\"] to {c.patch}: the anchor is still found when {p.id} applies first "
                   f"(or re-anchor {p.id}.{e.name} on the text {c.patch} produces and add after = [\"{c.patch}\"] "
                   f"to {p.id})")
    else:
        er.hint = (f"{p.id} and {c.patch} change the same bytes in either order: merge them, or re-anchor "
                   f"{p.id}.{e.name} on {c.patch}'s output and add after = [\"{c.patch}\"] to {p.id}")


def _edit_result(p: Patch, path: str, e, fd: Finding, st: FileState) -> EditResult:
    er = EditResult(patch=p.id, file=path, name=e.name, verdict=fd.verdict, required=e.required, group=e.group,
                    reason=fd.reason, reason_code=fd.code)
    base = st.pristine
    if base is None or fd.verdict in (Verdict.FILE_MISSING, Verdict.DRIFTED, Verdict.OPTIONAL_ABSENT):
        return er
    if fd.verdict == Verdict.MERGED:
        off = fd.offset if fd.offset is not None and fd.offset >= 0 else None
    elif fd.verdict == Verdict.CONFLICT and fd.code == "conflict":
        off = None  # _explain_conflict places it in the pristine file
    elif fd.offset is not None:
        off = st.to_pristine(fd.offset)
    else:
        off = None
    sc = scopes(base)
    if off is not None:
        er.offset = off
        er.line = line_of(base, off)
        er.qualname = sc.qualname(er.line)
    if fd.verdict == Verdict.AMBIGUOUS:
        for o in fd.offsets:
            po = st.to_pristine(o)
            ln = line_of(base, po)
            er.locations.append(Location(file=path, line=ln, offset=po, qualname=sc.qualname(ln)))
        if er.locations:
            er.line = er.locations[0].line
    return er


def _compile_check(changes: dict[str, FileChange], files: dict[str, FileState]) -> list[Problem]:
    problems = []
    memo = _COMPILE_MEMO
    for path, ch in sorted(changes.items()):
        if not path.endswith(".py"):
            continue
        key = _compiled_ok_key(ch.new)
        if memo is not None and _compiled_ok(memo, key):
            continue
        try:
            compile(ch.new, path, "exec", dont_inherit=True)
            _remember_compiled(memo, key)
        except SyntaxError as exc:
            if ch.pristine is not None:
                try:
                    compile(ch.pristine, path, "exec", dont_inherit=True)
                except SyntaxError:
                    continue  # the pristine file itself does not compile under this Python
            blame = _blame(files[path], exc.lineno)
            problems.append(Problem("compile_error", f"patched file does not compile: {exc.msg}", file=path,
                                    line=exc.lineno, patch=blame or ", ".join(ch.patches),
                                    hint="fix the replacement text of the patch named here"))
        except ValueError as exc:
            problems.append(Problem("compile_error", f"patched file does not compile: {exc}", file=path,
                                    patch=", ".join(ch.patches)))
        except (MemoryError, RecursionError) as exc:  # e.g. 200,000 unary minus signs: the parser gives up
            problems.append(Problem("compile_error", f"patched file does not compile: it is nested too deeply for "
                                    f"the Python parser ({type(exc).__name__})", file=path,
                                    patch=", ".join(ch.patches)))
    return problems


#: The compile-ok memo, injected by the shell (:func:`sndr.caches.enable`); None: compile every
#: changed file (the core never finds a cache directory by itself, and writes nothing).
_COMPILE_MEMO = None


def use_compile_memo(memo):
    """Set the compile-ok memo (a :class:`sndr.fsio.PrivateDir`, or None); returns the previous one."""
    global _COMPILE_MEMO
    prev, _COMPILE_MEMO = _COMPILE_MEMO, memo
    return prev


def _compiled_ok_key(text: str) -> str:
    """Name of the entry that records "this exact text compiled under this Python".

    Content-addressed (sha256 of the text) and sealed with the cache's secret
    (:meth:`sndr.fsio.PrivateDir.seal`): a planted or copied marker never
    vouches for anything; only successes are recorded.
    """
    return "ok-" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def _compiled_ok(memo, key: str) -> bool:
    from .fsio import FileProblem

    try:
        return memo.get_sealed("compiled-ok", key, 64) == b""
    except (OSError, FileProblem):  # an unusable memo only costs a compile
        return False


def _remember_compiled(memo, key: str) -> None:
    from .fsio import FileProblem

    if memo is None:
        return
    try:
        memo.put_sealed("compiled-ok", key, b"")
    except (OSError, FileProblem):
        pass


def _blame(st: FileState, lineno: int | None) -> str | None:
    if lineno is None or st.text is None:
        return None
    lines = st.text.split("\n")
    off = sum(len(ln) + 1 for ln in lines[: max(lineno - 1, 0)])
    for s, e, pid in st.regions:
        if s <= off <= e:
            return pid
    # Nearest preceding replacement: an unbalanced bracket surfaces later than its cause.
    before = [r for r in st.regions if r[0] <= off]
    return before[-1][2] if before else None
