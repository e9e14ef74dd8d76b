"""The plan: a pure, sequential simulation of every enabled patch on in-memory texts.

``build_plan`` reads nothing but what ``read`` returns and writes nothing. It
gates each patch, orders the set (``requires`` first), classifies every edit
with :func:`sndr.classify.classify_edit` on the text as earlier patches left
it, detects overlapping edits between unrelated patches, and compiles every
changed ``.py`` file. Apply, dry-run, verify, manifest and preflight share it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Callable

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from . import env as envmod
from .binding import check_binding
from .classify import Finding, classify_create, classify_edit, markers_present, resolve_group
from .errors import Problem, SndrError
from .load import PatchSet
from .locate import line_of, scopes
from .model import EditResult, Location, Patch, PatchResult, Verdict

Reader = Callable[[str], "str | None"]

FAILING = (Verdict.DRIFTED, Verdict.AMBIGUOUS, Verdict.FILE_MISSING)

# Failures that are defects of the patch (or of the target's bytes), not drift:
# they map to exit code 2 (bad input) rather than 1 (findings).
BAD_INPUT_REASONS = {"anchor_ambiguous", "group_ambiguous", "overlap_conflict", "line_endings"}
_HINTS = {
    "anchor_ambiguous": "widen the anchor with surrounding lines until it occurs exactly once",
    "group_ambiguous": "make the one_of variants mutually exclusive",
    "overlap_conflict": "declare requires between the two patches, or re-anchor one of them",
    "line_endings": "the target uses CRLF; write the anchor with CRLF or normalise the target",
    "edit_drifted": "re-anchor the edit (python -m sndr preflight suggests where the code went)",
    "edit_file_missing": "the target file is gone; see the preflight's suggestions",
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


def gate(patch: Patch, version: str, environ=None) -> Gate:
    """Is ``patch`` enabled on a tree of this vLLM ``version``? Enforced, never advisory."""
    if patch.lifecycle == "retired":
        return Gate(False, "lifecycle_retired", "lifecycle = retired")
    override = envmod.enable_override(patch.id, environ)
    if override is False:
        return Gate(False, "disabled_by_env", f"disabled by SNDR_ENABLE_{patch.id.upper()}=0")
    if override is None and not patch.default:
        return Gate(False, "disabled_by_default", f"default = false (enable with SNDR_ENABLE_{patch.id.upper()}=1)")
    if patch.vllm:
        v = parse_version(version)
        if v is None:
            return Gate(False, "version_unknown", f"vllm {patch.vllm!r} required but the tree's version {version!r} is unknown")
        if not SpecifierSet(patch.vllm).contains(v, prereleases=True):
            return Gate(False, "version_mismatch", f"vllm {version} does not satisfy {patch.vllm!r}")
    return Gate(True)


def order_patches(patches: list[Patch]) -> list[Patch]:
    """Topological order by ``requires``; ties keep the patch set's order."""
    index = {p.id: i for i, p in enumerate(patches)}
    by_id = {p.id: p for p in patches}
    done: set[str] = set()
    out: list[Patch] = []
    visiting: set[str] = set()

    def visit(p: Patch) -> None:
        if p.id in done or p.id in visiting:
            return
        visiting.add(p.id)
        for r in sorted((r for r in p.requires if r in by_id), key=index.__getitem__):
            visit(by_id[r])
        visiting.discard(p.id)
        done.add(p.id)
        out.append(p)

    for p in patches:
        visit(p)
    return out


# ----------------------------------------------------------------------------- simulation state


@dataclass
class FileState:
    path: str
    pristine: str | None
    text: str | None
    # (offset, old_len, new_len) of each replacement, in application order, for
    # mapping current offsets back to the pristine file.
    history: list[tuple[int, int, int]] = field(default_factory=list)
    # Replacement spans in current coordinates: [start, end, patch id].
    regions: list[list] = field(default_factory=list)
    patches: list[str] = field(default_factory=list)

    def copy(self) -> "FileState":
        return FileState(self.path, self.pristine, self.text, list(self.history),
                         [list(r) for r in self.regions], list(self.patches))

    def to_pristine(self, offset: int) -> int:
        for pos, old, new in reversed(self.history):
            if offset >= pos + new:
                offset -= new - old
            elif offset >= pos:
                offset = pos
        return offset

    def replace(self, offset: int, old_len: int, new: str, patch_id: str) -> None:
        assert self.text is not None
        self.text = self.text[:offset] + new + self.text[offset + old_len:]
        delta = len(new) - old_len
        kept = []
        for s, e, pid in self.regions:
            if e <= offset:
                kept.append([s, e, pid])
            elif s >= offset + old_len:
                kept.append([s + delta, e + delta, pid])
        kept.append([offset, offset + len(new), patch_id])
        self.regions = sorted(kept)
        self.history.append((offset, old_len, len(new)))
        if patch_id not in self.patches:
            self.patches.append(patch_id)


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

    @property
    def ok(self) -> bool:
        return not self.problems

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.patches:
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


def resolve_gates(patch_set: PatchSet, version: str, environ=None,
                  only: list[str] | None = None) -> tuple[list[Patch], dict[str, Gate]]:
    """The apply order and every patch's gate, reading no target file.

    ``--only`` pulls in what the selected patches require; a patch whose
    ``requires`` is not enabled is gated ``requires_gated``.
    """
    environ = os.environ if environ is None else environ
    by_id = patch_set.by_id
    ordered = order_patches(patch_set.patches)
    selected: set[str] | None = None
    if only:
        unknown = [i for i in only if i not in by_id]
        if unknown:
            raise SndrError(Problem("unknown_id", f"--only names unknown patch(es): {', '.join(unknown)}", key="--only"))
        selected = set(only)
        for i in only:
            selected |= _requires_closure(by_id[i], by_id)
    gates: dict[str, Gate] = {}
    for p in ordered:
        if selected is not None and p.id not in selected:
            gates[p.id] = Gate(False, "not_selected", "not selected by --only")
            continue
        g = gate(p, version, environ)
        if g.enabled:
            missing = [r for r in p.requires if not gates.get(r, Gate(False)).enabled]
            if missing:
                g = Gate(False, "requires_gated", f"requires {', '.join(missing)}, which is not enabled")
        gates[p.id] = g
    return ordered, gates


def build_plan(patch_set: PatchSet, read: Reader, version: str, *, environ=None,
               only: list[str] | None = None, check_compile: bool = True) -> Plan:
    """Simulate the patch set on the texts ``read`` returns (the pristine tree)."""
    environ = os.environ if environ is None else environ
    by_id = patch_set.by_id
    ordered, gates = resolve_gates(patch_set, version, environ, only)
    problems: list[Problem] = []
    enabled = [p.id for p in ordered if gates[p.id].enabled]
    en = set(enabled)
    reported: set[frozenset] = set()
    for p in ordered:
        for c in p.conflicts:
            pair = frozenset((p.id, c))
            if p.id in en and c in en and pair not in reported:
                reported.add(pair)
                problems.append(Problem("conflicts_enabled", f"{p.id} conflicts with {c} and both are enabled",
                                        file=patch_set.source_of(p.id), key="conflicts", patch=p.id,
                                        hint=f"disable one of them, e.g. SNDR_ENABLE_{c.upper()}=0"))

    files: dict[str, FileState] = {}

    def state(path: str) -> FileState:
        if path not in files:
            try:
                text = read(path)
            except SndrError as exc:
                problems.extend(exc.problems)
                text = None
            files[path] = FileState(path, text, text)
        return files[path]

    results: list[PatchResult] = []
    for p in ordered:
        g = gates[p.id]
        if not g.enabled:
            results.append(PatchResult(id=p.id, title=p.title, kind=p.kind, status="gated", reason=g.reason,
                                       reason_code=g.code,
                                       edits=[EditResult(patch=p.id, file=f.path, name=e.name, verdict=Verdict.GATED,
                                                         required=e.required, group=e.group, reason=g.reason)
                                              for f, e in p.edits()]))
            continue
        result, new_states = _simulate_patch(p, state, _requires_closure(p, by_id))
        if result.status == "failed":
            for e in result.edits:
                if e.verdict in FAILING and (e.required or e.group):
                    code = e.reason_code if e.reason_code in BAD_INPUT_REASONS else f"edit_{e.verdict.value}"
                    problems.append(Problem(code, f"edit {e.name!r}: {e.reason or e.verdict.value}",
                                            file=e.file, line=e.line, patch=p.id, hint=_HINTS.get(code)))
        else:
            files.update(new_states)
        for r in p.runtime:
            verdict, reason, b = check_binding(r, lambda rel: state(rel).text if state(rel).pristine is not None else None)
            v = Verdict(verdict)
            result.edits.append(EditResult(patch=p.id, file=b.file if b else r.target.split(":")[0], name=r.name,
                                           verdict=v, required=r.required, reason=reason or f"runtime target {r.target}",
                                           line=b.line if b else None, qualname=b.qualname if b else None))
            if v in FAILING and r.required:
                result.status = "failed"
                problems.append(Problem(f"runtime_{v.value}", f"runtime edit {r.name!r}: {reason}", patch=p.id,
                                        file=patch_set.source_of(p.id)))
        results.append(result)

    changes: dict[str, FileChange] = {}
    for path, st in files.items():
        if st.text is not None and st.text != st.pristine:
            changes[path] = FileChange(path, st.pristine, st.text, list(st.patches))
    if check_compile:
        problems.extend(_compile_check(changes, files))
    digest = patch_set_digest(patch_set, enabled)
    return Plan(version=version, patches=results, changes=changes, problems=problems, enabled=enabled, digest=digest)


def patch_set_digest(patch_set: PatchSet, enabled: list[str]) -> str:
    return patch_set.digest(enabled)


def _simulate_patch(p: Patch, state: Callable[[str], FileState],
                    required_ids: set[str]) -> tuple[PatchResult, dict[str, FileState]]:
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
                st.patches.append(p.id)
            edits_out.append(EditResult(patch=p.id, file=f.path, name="create", verdict=fd.verdict, reason=fd.reason,
                                        line=1 if fd.verdict != Verdict.DRIFTED else None, qualname=""))
            failed |= fd.verdict in FAILING
            continue
        decided: dict[str, Finding] = {}
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
            if fd.verdict == Verdict.APPLIES:
                a0, a1 = fd.offset, fd.offset + len(e.anchor)
                overlap = [r for r in st.regions if r[2] != p.id and r[0] < a1 and a0 < r[1]]
                foreign = [r for r in overlap if r[2] not in required_ids]
                if foreign:
                    others = sorted({r[2] for r in foreign})
                    fd = Finding(Verdict.AMBIGUOUS, offsets=[fd.offset],
                                 reason=f"overlaps bytes already changed by {', '.join(others)} (conflict: declare requires or re-anchor)",
                                 code="overlap_conflict")
                    er = _edit_result(p, f.path, e, fd, st)
                    er.chained_from = others
                else:
                    er.chained_from = sorted({r[2] for r in overlap})
                    st.replace(fd.offset, len(e.anchor), e.replacement, p.id)
            if fd.verdict in FAILING and (e.required or e.group is not None):
                failed = True
            edits_out.append(er)
    verdicts = {e.verdict for e in edits_out}
    if failed:
        status = "failed"
    elif verdicts <= {Verdict.MERGED, Verdict.OPTIONAL_ABSENT} and Verdict.MERGED in verdicts:
        status = "merged"
    elif Verdict.APPLIES in verdicts:
        status = "applies"
    elif Verdict.AMBIGUOUS in verdicts:
        status = "partial"
    else:
        status = "applied"
    reason = ""
    if status == "failed":
        bad = [e for e in edits_out if e.verdict in FAILING]
        reason = "; ".join(f"{e.name}: {e.verdict.value}" for e in bad)
    elif status == "merged":
        reason = "upstream carries this change (merged markers present)"
    return PatchResult(id=p.id, title=p.title, kind=p.kind, status=status, reason=reason, edits=edits_out), local


def _edit_result(p: Patch, path: str, e, fd: Finding, st: FileState) -> EditResult:
    er = EditResult(patch=p.id, file=path, name=e.name, verdict=fd.verdict, required=e.required, group=e.group,
                    reason=fd.reason, reason_code=fd.code)
    base = st.pristine
    if base is None or fd.verdict in (Verdict.FILE_MISSING, Verdict.DRIFTED, Verdict.OPTIONAL_ABSENT):
        return er
    if fd.verdict == Verdict.MERGED:
        off = fd.offset if fd.offset is not None and fd.offset >= 0 else None
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
    for path, ch in sorted(changes.items()):
        if not path.endswith(".py"):
            continue
        key = _compiled_ok_key(ch.new)
        if key is not None and key.exists():
            continue
        try:
            compile(ch.new, path, "exec", dont_inherit=True)
            _remember_compiled(key)
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
    return problems


def _compiled_ok_key(text: str):
    """Marker file that records "this exact text compiled under this Python".

    Content-addressed (sha256 of the text), so an entry can never vouch for
    different bytes; only successes are recorded.
    """
    try:
        import sys

        d = envmod.cache_dir() / "compiled-ok" / f"py{sys.version_info[0]}{sys.version_info[1]}"
        return d / hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
    except OSError:
        return None


def _remember_compiled(key) -> None:
    if key is None:
        return
    try:
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key.touch()
    except OSError:
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


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
