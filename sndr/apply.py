"""Apply, dry-run, verify or revert the patch set on a tree (the command: :mod:`sndr.commands.apply`).

The functions here are the imperative shell: they read the tree, call the
pure planner, and hand the result to :mod:`sndr.commit`.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m sndr.apply`: an alias of `python -m sndr apply` (the same parser and run)
    import _signal  # the builtin (always loaded): importing signal.py would itself be a window for a traceback

    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)  # until sndr.cli's early handler is in: Ctrl-C ends it, no traceback
    from sndr.__main__ import alias

    alias("apply")

import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from . import PIN_VERSION, env
from .errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, Problem, SndrError
from .state import JOURNAL, LEDGER, MAX_STATE_BYTES, find_probes, pid_alive

# The engine (commit, load, model, plan; pydantic under model) is imported inside the functions that run it,
# so `python -m sndr.apply --help` and the parse errors cost no engine import.
if TYPE_CHECKING:
    from .commit import FileWrite, TreeRoot
    from .load import PatchSet
    from .model import Ledger, LedgerFile, PatchResult, PatchStatus, Report, ReportMode
    from .plan import EnabledSet, Plan



def _report(mode: ReportMode, tree: TreeRoot, version: str, plan: Plan | None, **kw) -> Report:
    from .model import Report

    problems = kw.pop("problems", None)
    if problems is None:
        problems = plan.problems if plan else []
    patches = kw.pop("patches", [])
    if plan is not None:
        # --only: the other patches are one line, not one "gated" row each.
        others = plan.not_selected
        patches = [p for p in plan.patches if p.reason_code != "not_selected"]
        if others:
            kw["notes"] = [f"--only: {len(others)} other patch(es) not selected (not planned, not counted): "
                           f"{', '.join(p.id for p in others)}"] \
                + list(kw.get("notes", []))
        if plan.left_out:
            kw["left_out"] = list(plan.left_out)
            kw["notes"] = list(kw.get("notes", [])) + _left_out_notes(plan.left_out)
            if kw.get("exit_code") == EXIT_OK and not all(lo.allowed for lo in plan.left_out):
                kw["exit_code"], kw["ok"] = EXIT_FINDINGS, False
    return Report(mode=mode, tree=str(tree.root), vllm_version=version,
                  patch_set_digest=plan.digest if plan else kw.pop("digest", ""),
                  counts=plan.counts() if plan else kw.pop("counts", {}),
                  patches=patches, problems=list(problems), **kw)


def _left_out_notes(left_out) -> list[str]:
    """One line for the patches skipped as their on_failure = "skip" allows (a warning), one for the rest."""
    skipped = [lo for lo in left_out if lo.allowed]
    failed = [lo for lo in left_out if not lo.allowed]
    out = []
    if failed:
        out.append(f"left out {len(failed)} patch(es) whole: " + "; ".join(lo.describe() for lo in failed))
    if skipped:
        out.append(f"skipped {len(skipped)} patch(es) whole, as their on_failure = \"skip\" allows: "
                   + "; ".join(lo.describe() for lo in skipped))
    return out


def _plan_exit(plan: Plan) -> int:
    if not plan.problems:
        return EXIT_OK
    from .plan import BAD_INPUT_REASONS

    bad_input = {"compile_error", "not_utf8", "path_escape", "not_a_file", "unknown_id",
                 "file_too_large", "unreadable"} | BAD_INPUT_REASONS
    from .errors import registered_exit

    if any(p.code in bad_input or registered_exit(p.code, EXIT_FINDINGS) == EXIT_BAD_INPUT for p in plan.problems):
        return EXIT_BAD_INPUT
    return EXIT_FINDINGS


#: What --force does over a file someone else changed: apply plans from its current bytes; revert puts the
#: pristine bytes back over it.
FORCE_APPLY_HINT = ("inspect the change; --force merges it (3-way) into the pristine copy, which becomes the new "
                    "pristine, and applies the set on it (refused where it overlaps sndr's own lines)")
FORCE_REVERT_HINT = "inspect the change; --force puts the pristine bytes back over it (the change is lost)"


def _foreign_changes(tree: TreeRoot, ledger: Ledger, hint: str = FORCE_APPLY_HINT) -> list[Problem]:
    return _foreign_problems(tree, _ledger_state(tree, ledger).foreign, hint)


def _foreign_problems(tree: TreeRoot, rels: list[str], hint: str = FORCE_APPLY_HINT) -> list[Problem]:
    out = []
    for rel in rels:
        gone = tree.read_bytes(rel) is None
        out.append(Problem("modified_since_apply",
                           "file was deleted since sndr patched it" if gone else
                           "file was changed by someone else since sndr patched it (it holds neither the pristine "
                           "nor the patched bytes the ledger records)",
                           file=rel, hint=hint))
    return out


@dataclass
class _LedgerState:
    """Where each file the ledger names stands now, by hash (milliseconds for a whole set)."""

    patched: list[str] = field(default_factory=list)  # holds the patched bytes the ledger records
    pristine: list[str] = field(default_factory=list)  # back to its pristine bytes (reinstall, restore)
    foreign: list[str] = field(default_factory=list)  # neither: someone else changed or deleted it
    reread: list[str] = field(default_factory=list)  # read by the set, written by none: changed or deleted since


def _ledger_state(tree: TreeRoot, ledger: Ledger) -> _LedgerState:
    from .commit import sha256_bytes

    st = _LedgerState()
    for rel, entry in sorted(ledger.files.items()):
        now = tree.read_bytes(rel)
        sha = sha256_bytes(now) if now is not None else None
        if now is not None and sha == entry.patched_sha256:
            st.patched.append(rel)
        elif entry.read_only:
            st.reread.append(rel)
        elif (now is None and entry.created) or (sha == entry.pristine_sha256 and not entry.created):
            st.pristine.append(rel)
        else:
            st.foreign.append(rel)
    return st


def _target_paths(patch_set: PatchSet) -> set[str]:
    return {f.path for p in patch_set.patches for f in p.files}


def stale_probes(tree: TreeRoot, rels: set[str]) -> list[Path]:
    """Writability probes (``.sndr-probe-<pid>``) whose process is gone, in the tree root, the state
    directory and every directory holding ``rels``: what a Ctrl-C or a kill during a probe leaves."""
    return [Path(path) for path, pid in find_probes(tree.root, rels)
            if pid is not None and pid != os.getpid() and not pid_alive(pid)]


def sweep_probes(tree: TreeRoot, rels: set[str]) -> list[str]:
    """Remove :func:`stale_probes` (the caller holds the exclusive lock). Returns them, relative to the root."""
    removed = []
    for p in stale_probes(tree, rels):
        try:
            p.unlink()
        except OSError:
            continue
        removed.append(os.path.relpath(p, tree.root))
    return removed


@contextmanager
def _no_interrupt():
    """Defer SIGINT (Ctrl-C) across a short step that must not be cut in half; it is delivered after."""
    import signal

    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    except (AttributeError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _writes_any(ledger: Ledger) -> bool:
    """A ledger is kept only for a set that changes some file: one that only reads (a runtime-only set, every
    edit merged) leaves the tree with no ledger, as before files read were recorded."""
    return any(not e.read_only for e in ledger.files.values())


def _drop_entries(ledger: Ledger, rels: set[str]) -> Ledger:
    """The ledger without ``rels``: the plan then reads their current bytes as pristine."""
    return ledger.model_copy(update={"files": {r: e for r, e in ledger.files.items() if r not in rels}})


def run_apply(root: Path | str, patch_set: PatchSet, *, dry_run: bool = False, force: bool = False,
              only: list[str] | None = None, environ=None, keep_going: bool = False, profile=None,
              announce=None) -> Report:
    """``keep_going``: leave out whole every patch that cannot apply (exit 1, listed); ``profile``: the
    deployment profile ``when`` tables are evaluated against (default: ``$SNDR_PROFILE``).
    ``announce(line)`` is called before the commit with what it will do that the caller may not
    expect (files going back to pristine).

    ``dry_run`` takes exactly the apply's decisions (stale-ledger detection, reinstall detection,
    refusals, the fast path, the plan and the writes) on the tree as it is, writes aside: no lock,
    no recovery, no probe, no stored object, no commit. Its verdicts, files and exit status are the
    apply's."""
    from .commit import FileWrite, TreeRoot, probe_writable, recover
    from .plan import build_plan

    environ = os.environ if environ is None else environ
    tree = TreeRoot(root)
    version = tree.version
    if dry_run:
        # Pure: no lock, no recovery, no writes. A pending journal is rolled back in memory only.
        rolled = _as_rolled_back(tree)
        notes = [f"an interrupted commit is pending: apply would roll it back first ({len(rolled)} file(s) "
                 f"restored); planned on the rolled-back files"] if tree.journal_path.exists() else []
        return _apply_decide(tree, version, patch_set, tree.read_ledger(), notes, dry_run=True, force=force,
                             only=only, environ=environ, keep_going=keep_going, profile=profile)
    first_plan = None
    if not tree.state.exists():
        # First contact with this tree: check everything before creating any
        # state (even the lock file), so a refused apply leaves no trace.
        plan = first_plan = build_plan(patch_set, tree.read_text, version, environ=environ, only=only,
                                       keep_going=keep_going, profile=profile)
        _path_typos(tree, version, plan, patch_set)
        if not plan.ok:
            return _report("apply", tree, version, plan, ok=False, exit_code=_plan_exit(plan),
                           notes=["refused: nothing was written"])
        with _no_interrupt():  # a Ctrl-C here must not strand a probe file in the tree
            probe_writable(tree, [FileWrite(rel, b"" if ch.pristine is not None else None, None)
                                  for rel, ch in plan.changes.items()])
    with tree.lock():
        lock_free = tree.take_reads()  # what the first plan read without the lock, if there was one
        restored = recover(tree)
        notes = [f"rolled back an interrupted commit ({len(restored)} file(s) restored)"] if restored else []
        ledger = tree.read_ledger()
        swept = sweep_probes(tree, _target_paths(patch_set) | set(ledger.files if ledger else ()))
        if swept:
            notes.append(f"removed {len(swept)} probe file(s) an interrupted sndr left: {', '.join(swept)}")
        return _apply_decide(tree, version, patch_set, ledger, notes, dry_run=False, force=force, only=only,
                             environ=environ, keep_going=keep_going, profile=profile, announce=announce,
                             first_plan=first_plan if ledger is None and not restored and tree.keep_reads(lock_free)
                             else None)


def _as_rolled_back(tree: TreeRoot) -> list[str]:
    """Make ``tree`` read, in memory only, as :func:`sndr.commit.recover` would leave it: every journaled
    file holds its before-bytes and the ledger is the journal's ``ledger_before`` (the dry-run of a tree
    with an interrupted commit plans what apply, which rolls it back first, plans). Nothing is written.
    Returns the files the rollback would restore; raises what recover raises (journal_corrupt,
    journal_mismatch)."""
    import json as _json

    from .commit import _journal_entries, sha256_bytes

    raw = tree.read_state(JOURNAL)
    if raw is None:
        return []
    try:
        journal = _json.loads(raw)
    except (ValueError, RecursionError):
        journal = None
    entries = _journal_entries(tree, journal)
    overlay: dict[str, bytes | None] = {}
    for e in entries:
        rel, before, after = e["path"], e.get("before"), e.get("after")
        now = tree.read_bytes(rel)
        if (sha256_bytes(now) if now is not None else None) not in (before, after):
            raise SndrError(Problem("journal_mismatch", "journal does not match the tree: the file holds neither "
                                    "its before- nor its after-bytes", file=rel,
                                    hint=f"the journal at {tree.journal_path} belongs to another tree or patch set; "
                                         "remove it only after checking the tree by hand"))
        overlay[rel] = tree.get_object(before) if before is not None else None
    restored = sorted(rel for rel, want in overlay.items() if tree.read_bytes(rel) != want)
    lb = journal.get("ledger_before") if isinstance(journal, dict) else None
    ledger_raw = tree.get_object(lb) if lb is not None else None
    read_bytes, read_state = tree.read_bytes, tree.read_state

    def rolled_bytes(rel: str) -> bytes | None:
        return overlay[rel] if rel in overlay else read_bytes(rel)

    def rolled_state(name: str, max_bytes: int = MAX_STATE_BYTES) -> bytes | None:
        if name == JOURNAL:
            return None
        if name == LEDGER:
            return ledger_raw
        return read_state(name, max_bytes)

    tree.read_bytes = rolled_bytes  # type: ignore[method-assign]  # this TreeRoot is the dry-run's own
    tree.read_state = rolled_state  # type: ignore[method-assign]
    return restored


def _apply_decide(tree: TreeRoot, version: str, patch_set: PatchSet, ledger: Ledger | None, notes: list[str], *,
                  dry_run: bool, force: bool, only, environ, keep_going: bool, profile, announce=None,
                  first_plan: Plan | None = None) -> Report:
    """Everything apply decides, from the ledger it read to the commit; ``dry_run`` stops short of
    every write (objects, ledger, files) and reports what the apply would do, on the same path."""
    from .commit import commit
    from .plan import build_plan, enabled_set

    mode: ReportMode = "dry-run" if dry_run else "apply"
    nothing = "apply would write nothing" if dry_run else "nothing was written"
    original = ledger
    forced: set[str] = set()
    es = enabled_set(patch_set, version, environ, only=only, profile=profile)
    digest = es.digest
    if ledger is not None:
        # Re-check every file the ledger names, by hash: a reinstall or a
        # restore puts pristine bytes back under a ledger that says "patched".
        st = _ledger_state(tree, ledger)
        if ledger.vllm_version and ledger.vllm_version != version:
            # Another vLLM is installed now: the ledger's pristine copies are
            # another version's. Plan from the tree as it is; files that still
            # hold the old patched bytes read as their stored pristine, unless the
            # new version's installer recorded exactly those bytes (upstream merged
            # the change): those are the new version's pristine.
            upstream = tree.reinstalled(st.patched)
            notes.append(f"ledger_stale: the ledger was written for vLLM {ledger.vllm_version}, the tree now "
                         f"holds vLLM {version}: planning again from the tree as it is")
            ledger = _drop_entries(ledger, set(st.pristine) | set(st.foreign) | set(st.reread) | set(upstream))
            st = _LedgerState(patched=[r for r in st.patched if r not in upstream])
        reinstalled = tree.reinstalled(st.foreign)
        if reinstalled:
            notes.append(f"ledger_stale: {len(reinstalled)} file(s) hold the bytes vLLM's installer recorded "
                         f"(dist-info RECORD), not the ledger's pristine: vLLM was reinstalled from another "
                         f"build; planning them again from the tree as it is")
            ledger = _drop_entries(ledger, set(reinstalled))
            st.foreign = [r for r in st.foreign if r not in reinstalled]
        if st.pristine:
            notes.append(f"{len(st.pristine)} file(s) were back to pristine (vLLM reinstalled or files "
                         f"restored): patching them again")
        if st.reread:
            # sndr wrote nothing there, so nothing of sndr's is lost: their bytes now are the new pristine
            notes.append(f"read_changed: {len(st.reread)} file(s) the set read and wrote nothing to changed since "
                         f"apply ({', '.join(st.reread)}): planning them again from their bytes now")
            ledger = _drop_entries(ledger, set(st.reread))
        foreign = _foreign_problems(tree, st.foreign)
        if foreign and not force:
            return _report(mode, tree, version, None, ok=False, exit_code=EXIT_FINDINGS, problems=foreign,
                           digest=digest, notes=notes + [f"refused: {nothing}"])
        if foreign and force:
            rels = {p.file for p in foreign if p.file is not None}
            forced = rels
            fm = _force_merge(tree, ledger, rels, patch_set, version, environ, only, keep_going, profile)
            if fm.conflicts:
                return _report(mode, tree, version, None, ok=False, exit_code=EXIT_FINDINGS, problems=fm.conflicts,
                               digest=digest, notes=notes + [f"refused: {nothing}"])
            ledger = _take_merged(tree, ledger, fm.merged, store=not dry_run)
            adopt = set(fm.adopted)
            # The dry-run stores no object: without their entries the plan reads the current bytes as
            # pristine too, which is what adopting them means.
            ledger = _drop_entries(ledger, adopt) if dry_run else _adopt_current(tree, ledger, adopt)
            for how in sorted(set(fm.bases.values())):
                merged = sorted(rel for rel, b in fm.bases.items() if b == how)
                notes.append(f"--force: {'would merge' if dry_run else 'merged'} the change made since apply into "
                             f"the pristine copy (3-way: pristine, the file now and, as the base, the bytes sndr "
                             f"wrote, {how}) and "
                             f"{'would apply' if dry_run else 'applied'} the set on it: {', '.join(merged)}"
                             f" (a revert gives back upstream's file with that change)")
            for rel, why in sorted(fm.adopted.items()):
                notes.append(f"--force: no 3-way merge for {rel} ({why}): {'would take' if dry_run else 'took'} "
                             f"its current bytes as pristine")
        elif ledger is original and not st.pristine and ledger.patch_set_digest == digest and not ledger.left_out:
            # Fast path: same set, and every file holds its patched bytes (checked above).
            damaged = _stored_copy_problems(tree, ledger)
            if damaged:  # "ok" over a tree whose revert would fail is not ok
                return _report(mode, tree, version, None, ok=False, exit_code=EXIT_BAD_INPUT, problems=damaged,
                               digest=digest, notes=notes + [f"refused: {nothing}"])
            results = _ledger_patches(tree, ledger, patch_set, version, environ, only, profile, es, edits=True,
                                      reason="ledger matches; nothing to do")
            return _report(mode, tree, version, None, ok=True, exit_code=EXIT_OK, digest=digest,
                           patches=results, counts=ledger.counts,
                           notes=notes + [f"already applied with this patch set: {nothing}" + (
                               f" (the tree already holds this enabled set, ledger {digest[:12]})"
                               if dry_run else "")])
    if first_plan is not None:
        # Still no ledger, and every file holds what the lock-free plan read. commit()
        # re-checks every before-hash, so a concurrent change still aborts.
        plan = first_plan
    else:
        # Plan from the tree as it is now. (A lock-free plan that read a file another sndr was
        # committing, and has reverted since, is not a change to refuse.)
        plan = build_plan(patch_set, tree.pristine(ledger).read_text, version,
                          environ=environ, only=only, keep_going=keep_going, profile=profile)
        _path_typos(tree, version, plan, patch_set)
    if forced:
        notes.extend(_forced_own_edits(plan, original, forced))
    if not plan.ok:
        return _report(mode, tree, version, plan, ok=False, exit_code=_plan_exit(plan),
                       notes=notes + [f"refused: {nothing}"])
    writes, new_ledger = _writes_for(tree, plan, ledger, patch_set, store=not dry_run)
    dropped = _dropped_files(plan, ledger, writes)
    if dropped:
        assert ledger is not None  # only a ledger holds files to drop
        gone = sorted({i for rel in dropped for i in ledger.files[rel].patches} - set(plan.enabled))
        line = (f"this patch set no longer patches {len(dropped)} file(s) the ledger holds; they "
                f"{'would go' if dry_run else 'go'} back to pristine: {', '.join(dropped)}"
                + (f" (patches no longer enabled: {', '.join(gone)})" if gone else ""))
        notes.append(line)
        if announce is not None and not dry_run:
            announce(line)  # said before the commit does it
    if not writes and original is not None and original.checksum == new_ledger.sealed().checksum:
        return _report(mode, tree, version, plan, ok=True, exit_code=EXIT_OK,
                       notes=notes + ["nothing to write"])
    if dry_run:
        if not writes:
            notes.append("no file would change; apply would only record the ledger")
        return _report(mode, tree, version, plan, ok=True, exit_code=EXIT_OK,
                       files_written=[w.rel for w in writes], notes=notes)
    commit(tree, writes, new_ledger.sealed() if _writes_any(new_ledger) else None, plan.digest)
    return _report(mode, tree, version, plan, ok=True, exit_code=EXIT_OK,
                   files_written=[w.rel for w in writes], notes=notes)


def _forced_own_edits(plan: Plan, ledger: Ledger | None, forced: set[str]) -> list[str]:
    """Notes for the files ``--force`` adopted that still hold sndr's own edits: an edit of a patch the
    ledger recorded on that file reads ``applied`` or ``merged`` on the adopted bytes, which are now the
    file's pristine copy, so revert puts them back (that edit included) and the edit never reads as sndr's."""
    from .model import Verdict

    if ledger is None:
        return []
    own: dict[str, set[str]] = {}
    for p in plan.patches:
        for e in p.edits:
            entry = ledger.files.get(e.file)
            if e.file in forced and entry is not None and p.id in entry.patches \
                    and e.verdict in (Verdict.APPLIED, Verdict.MERGED):
                own.setdefault(e.file, set()).add(p.id)
    return [f"--force: the bytes taken as pristine for {rel} still hold sndr's own edit of {', '.join(sorted(ids))} "
            f"(it now reads as applied or merged upstream); a revert puts those bytes back, that edit included: to "
            f"get upstream's file back, reinstall vLLM" for rel, ids in sorted(own.items())]


def _pin_paths(tree: TreeRoot, version: str) -> set[str] | None:
    """Every ``.py`` path of the pinned vLLM: sndr's cached pristine copy of the pin when there is one
    (never fetched for this), and the tree itself when it is the pin; None when neither is at hand."""
    from .tree_release import cached_tree, want_version

    roots = [r for r in (cached_tree(env.cache_root(), want_version(PIN_VERSION)),
                         tree.root if version == PIN_VERSION else None) if r is not None]
    if not roots:
        return None
    out: set[str] = set()
    for root in roots:
        for dirpath, _dirs, names in os.walk(root / "vllm"):
            rel = os.path.relpath(dirpath, root)
            out.update(os.path.join(rel, n).replace(os.sep, "/") for n in names if n.endswith(".py"))
    return out


def _path_typos(tree: TreeRoot, version: str, plan: Plan, patch_set: PatchSet) -> None:
    """An edit's target missing from the tree whose path the pinned vLLM never had is a typo in the patch
    (``path_unknown``, bad input: exit 2), with the nearest path the pin has; one it had is drift
    (``edit_file_missing``, exit 1): upstream moved or removed it."""
    import difflib

    missing = sorted({pr.file for pr in plan.problems if pr.code == "edit_file_missing" and pr.file
                      and pr.file.endswith(".py")})
    if not missing:
        return
    known = _pin_paths(tree, version)
    if not known:
        return
    typos = [rel for rel in missing if rel not in known]
    if not typos:
        return
    keep = [pr for pr in plan.problems if not (pr.code == "edit_file_missing" and pr.file in typos)]
    for rel in typos:
        near = difflib.get_close_matches(rel, sorted(known), n=1, cutoff=0.6)
        pids = sorted({pr.patch for pr in plan.problems if pr.file == rel and pr.patch})
        for pid in pids:
            source = patch_set.source_of(pid)
            keep.append(Problem("path_unknown", f"{rel} is not a file of vLLM {PIN_VERSION} (the pin): a typo in the "
                                f"patch's path?", file=source, line=_path_line(source, rel), key="files.path",
                                patch=pid, hint=f"did you mean {near[0]}?" if near else
                                "check the path against the pinned vLLM tree"))
    plan.problems[:] = keep


def _path_line(source: str, rel: str) -> int | None:
    try:
        lines = Path(source).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    return next((n + 1 for n, line in enumerate(lines)
                 if line.lstrip().startswith("path") and (f'"{rel}"' in line or f"'{rel}'" in line)), None)


def _dropped_files(plan: Plan, ledger: Ledger | None, writes: list[FileWrite]) -> list[str]:
    """Files the ledger holds that this plan no longer changes and the commit puts back to pristine."""
    if ledger is None:
        return []
    written = {w.rel for w in writes}
    return sorted(rel for rel in ledger.files if rel not in plan.changes and rel in written)


def _stored_copy_problems(tree: TreeRoot, ledger: Ledger) -> list[Problem]:
    """``object_missing`` / ``object_corrupt`` (or the state's own code) for each copy in ``.sndr/objects`` the
    ledger's files need: the pristine copy revert puts back and plans read (a created file needs none). A
    verify or an "already applied" that said ok over a tree whose revert then fails was not ok."""
    from .errors import SndrError

    out: list[Problem] = []
    for rel, entry in sorted(ledger.files.items()):
        if entry.created:
            continue
        try:
            tree.get_object(entry.pristine_sha256)
        except SndrError as exc:
            out += [replace(p, message=f"{p.message} (the pristine copy of {rel})") for p in exc.problems]
    return out


def _ledger_patches(tree: TreeRoot, ledger: Ledger, patch_set: PatchSet, version: str, environ, only, profile,
                    es: EnabledSet, *, edits: bool, reason: str) -> list[PatchResult]:
    """Per-patch results of a tree the ledger describes, gated patches included (named, cheaply).

    With ``edits``, every edit's verdict too: the plan of the set on the stored
    pristine copies (no compile check), read as the tree is now ("applies" is
    "applied"). That costs a plan (~0.1 s on the shipped set), so verify asks
    for it only with -v or --json.
    """
    from .model import PatchResult, PatchStatus
    from .plan import build_plan

    if edits:
        plan = build_plan(patch_set, tree.pristine(ledger).read_text, version, environ=environ,
                          only=only, check_compile=False, profile=profile)
        if plan.digest == ledger.patch_set_digest:
            from .model import Verdict

            for p in plan.patches:
                if p.status == "applies":
                    p.status = "applied"
                for e in p.edits:
                    if e.verdict == Verdict.APPLIES:
                        e.verdict = Verdict.APPLIED
            return plan.patches
    gates = es.gates

    def status(pid: str) -> PatchStatus:
        # the ledger's results are statuses _writes_for recorded from PatchResult.status
        return cast(PatchStatus, ledger.results.get(pid, "applied"))

    out = []
    for patch in es.ordered:
        if patch.id in ledger.patches:
            out.append(PatchResult(id=patch.id, title=patch.title, kind=patch.kind, status=status(patch.id),
                                   reason=reason))
        elif not gates[patch.id].enabled:
            g = gates[patch.id]
            out.append(PatchResult(id=patch.id, title=patch.title, kind=patch.kind, status="gated", reason=g.reason,
                                   reason_code=g.code))
    known = {r.id for r in out}
    out += [PatchResult(id=i, status=status(i), reason=reason)
            for i in ledger.patches if i not in known]
    return out


def _adopt_current(tree: TreeRoot, ledger: Ledger, rels: set[str]) -> Ledger:
    from .model import LedgerFile

    files = dict(ledger.files)
    for rel in rels:
        now = tree.read_bytes(rel)
        if now is None:
            files.pop(rel, None)
            continue
        sha = tree.put_object(now)
        files[rel] = LedgerFile(pristine_sha256=sha, patched_sha256=sha, patches=[], created=False)
    return ledger.model_copy(update={"files": files})


#: Where :func:`_force_merge` found the bytes sndr wrote (its merge base), as the notes name it.
BASE_STORED = "stored at apply"
BASE_REBUILT = "rebuilt from this set: no stored copy, the ledger is from before sndr kept them"


@dataclass
class _ForceMerge:
    """What ``apply --force`` makes of the files someone else changed since apply (:func:`_force_merge`)."""

    merged: dict[str, bytes] = field(default_factory=dict)  # the change merged onto the pristine copy
    bases: dict[str, str] = field(default_factory=dict)  # merged file -> its base: BASE_STORED or BASE_REBUILT
    adopted: dict[str, str] = field(default_factory=dict)  # no merge base: rel -> why its bytes are taken as is
    conflicts: list[Problem] = field(default_factory=list)


def _stored_copy(tree: TreeRoot, sha: str) -> bytes | None:
    """The object ``sha`` from ``.sndr/objects``, None when there is none; a damaged one still raises."""
    try:
        return tree.get_object(sha)
    except SndrError as exc:
        if [p.code for p in exc.problems] == ["object_missing"]:
            return None
        raise


def _force_merge(tree: TreeRoot, ledger: Ledger, rels: set[str], patch_set: PatchSet, version: str, environ, only,
                 keep_going: bool, profile) -> _ForceMerge:
    """A 3-way merge (merge3) per file: base = the bytes sndr wrote, one side = the file as it is now, the other =
    its pristine copy. The result is upstream's file with the other writer's change (sndr's edits taken out),
    the file's new pristine, on which the set is applied again.

    The base is the copy in ``.sndr/objects`` whose sha256 is the ledger's ``patched_sha256`` (apply stores the
    bytes it writes, :func:`_writes_for`), so the merge works whatever set is applied now, the set that wrote
    the file or a changed one. A ledger written before sndr stored them has no such copy: then the bytes are
    rebuilt by planning this set on the pristine copies, and used only when their sha256 is the ledger's.
    A change on or next to lines sndr's edits changed is a conflict (:func:`_merge_conflict`);
    a file deleted, one sndr created, or one with neither a stored copy nor bytes that rebuild (an old
    ledger and a set changed since apply) has no merge base: its current bytes are taken as pristine (as
    before), and a note says why."""
    from merge3 import Merge3  # a well-kept implementation of the 3-way merge (bzr's, used by breezy/dulwich)

    from .commit import sha256_bytes
    from .plan import build_plan

    out = _ForceMerge()
    rebuilt = None
    for rel in sorted(rels):
        entry, now = ledger.files[rel], tree.read_bytes(rel)
        if now is None or entry.created:
            out.adopted[rel] = "deleted since apply" if now is None else "a file sndr created (its pristine is absence)"
            continue
        base, how = _stored_copy(tree, entry.patched_sha256), BASE_STORED
        if base is None:
            if rebuilt is None:
                plan = build_plan(patch_set, tree.pristine(ledger).read_text, version, environ=environ, only=only,
                                  keep_going=keep_going, check_compile=False, profile=profile)
                rebuilt = {r: ch.new.encode("utf-8") for r, ch in plan.changes.items()} if plan.ok else {}
            base, how = rebuilt.get(rel), BASE_REBUILT
            if base is None or sha256_bytes(base) != entry.patched_sha256:
                out.adopted[rel] = ("the bytes sndr wrote are not stored (a ledger from before sndr kept them) and "
                                    "cannot be rebuilt: the patch set changed since apply")
                continue
        pristine = tree.get_object(entry.pristine_sha256)
        m = Merge3(base.splitlines(True), now.splitlines(True), pristine.splitlines(True))
        clashes = [r for r in m.merge_regions() if r[0] == "conflict"]
        if clashes:
            writers = {p.id: [e.replacement for f, e in p.edits() if f.path == rel]
                       for p in patch_set.patches if p.id in entry.patches}
            out.conflicts.append(_merge_conflict(rel, m, clashes, writers, entry.patches))
            continue
        out.merged[rel] = b"".join(m.merge_lines())
        out.bases[rel] = how
    return out


def _merge_conflict(rel: str, m, clashes: list[tuple], writers: dict[str, list[str]], patches: list[str]) -> Problem:
    """The ``force_merge_conflict`` of one file. For each conflict region of the 3-way merge ``m`` (base = the bytes
    sndr wrote, a = the file now, b = its pristine copy): the lines changed since apply, in the file now (the
    problem's line is the first), and the lines sndr's edits changed that they overlap or sit next to (merge3
    places no change on or next to the other side's: there is no common line between them), each with the
    patches that wrote it: those whose replacement text holds it (``writers``: id -> its replacements in this
    file), else every patch the ledger records on the file (``patches``)."""
    from difflib import SequenceMatcher

    base, now, pristine = m.base, m.a, m.b
    text = b"".join(base)
    owned: list[tuple[str, int, int]] = []  # (patch, lines [lo, hi) of the base that one of its replacements holds)
    for pid, reps in writers.items():
        for raw in (r.encode("utf-8") for r in reps if r):
            at = text.find(raw)
            while at >= 0:
                owned.append((pid, text.count(b"\n", 0, at), text.count(b"\n", 0, at + len(raw) - 1) + 1))
                at = text.find(raw, at + 1)

    def owners(s: int, e: int) -> list[str]:
        """The patches that wrote base lines [s, e) (e == s: the place of lines they removed)."""
        found = {pid for pid, lo, hi in owned if (max(lo, s) < min(hi, e) if e > s else lo <= s <= hi)}
        return [pid for pid in patches if pid in found] or patches

    def sndrs(s: int, e: int) -> list[tuple[int, int, list[str]]]:
        """Base lines [s, e) sndr changed, split where the patch that wrote them changes (two patches' edits on
        adjacent lines are one block of the diff)."""
        out = [(s, e, owners(s, e))] if e == s else []
        for k in range(s, e):
            who = owners(k, k + 1)
            if out and out[-1][2] == who:
                out[-1] = (out[-1][0], k + 1, who)
            else:
                out.append((k, k + 1, who))
        return out

    def span(a: int, b: int) -> str:
        return f"line {a + 1}" if b <= a + 1 else f"lines {a + 1}-{b}"

    parts: list[str] = []
    named: set[str] = set()
    first, overlap = None, False
    for _, z1, z2, a1, a2, b1, b2 in clashes:
        ours = [g for tag, _, _, j1, j2 in SequenceMatcher(None, pristine[b1:b2], base[z1:z2], autojunk=False)
                .get_opcodes() if tag != "equal" for g in sndrs(z1 + j1, z1 + j2)]
        ops = SequenceMatcher(None, base[z1:z2], now[a1:a2], autojunk=False).get_opcodes()
        to_now = {z1 + i1 + k: a1 + j1 + k for tag, i1, i2, j1, _ in ops if tag == "equal" for k in range(i2 - i1)}
        for tag, i1, i2, j1, j2 in ops:
            if tag == "equal":
                continue
            t0, t1 = z1 + i1, z1 + i2  # the base lines the change replaced (t0 == t1: it inserted there)
            first = a1 + j1 + 1 if first is None else first
            theirs = (f"{span(a1 + j1, a1 + j2)} of the file now" if j2 > j1
                      else f"the deletion of {span(t0, t1)} of the bytes sndr wrote")
            hit = [g for g in ours if max(g[0], t0) < min(g[1], t1) or (t0 == t1 and g[0] < t0 < g[1])]
            near = hit or [g for g in ours if max(g[0], t0) <= min(g[1], t1)] or ours
            overlap |= bool(hit)
            said = []
            for s, e, who in near:
                named.update(who)
                if e == s:
                    said.append(f"the place of lines sndr removed, before {span(s, s + 1)} of the bytes it wrote")
                elif all(k in to_now for k in range(s, e)) and to_now[e - 1] - to_now[s] == e - 1 - s:
                    # unchanged since apply, and together: where they are in the file now
                    said.append(f"sndr's {span(to_now[s], to_now[e - 1] + 1)}")
                else:
                    said.append(f"sndr's {span(s, e)} of the bytes it wrote")
                said[-1] += f" ({', '.join(who)})"
            parts.append(f"{theirs} {'overlaps' if hit else 'is next to'} {' and '.join(said)}")
    why = "" if overlap else " (a 3-way merge places no change next to another without a common line between them)"
    return Problem("force_merge_conflict", f"--force cannot merge the change made since apply: {'; '.join(parts)}"
                   f"{why}; nothing was written", file=rel, line=first,
                   patch=", ".join(pid for pid in patches if pid in named) or None,
                   hint="resolve it by hand: put sndr's lines back and re-apply, or revert (--force gives back "
                        "upstream's file) and make the change there, then apply")


def _take_merged(tree: TreeRoot, ledger: Ledger, merged: dict[str, bytes], *, store: bool) -> Ledger:
    """The ledger with each merged file's result as its pristine copy. ``store``: put the copies into the
    object store (the apply); without (the dry-run), this TreeRoot serves them from memory."""
    from .commit import sha256_bytes
    from .model import LedgerFile

    if store:
        tree.put_objects(list(merged.values()))
    elif merged:
        held = {sha256_bytes(b): b for b in merged.values()}
        stored = tree.get_object
        tree.get_object = lambda sha: held[sha] if sha in held else stored(sha)  # type: ignore[method-assign]
    files = dict(ledger.files)
    for rel, data in merged.items():  # as _adopt_current: the file's bytes now are what the plan starts from
        now = tree.read_bytes(rel) or b""
        files[rel] = LedgerFile(pristine_sha256=sha256_bytes(data), patched_sha256=sha256_bytes(now), patches=[])
    return ledger.model_copy(update={"files": files})


def _writes_for(tree: TreeRoot, plan: Plan, ledger: Ledger | None, patch_set: PatchSet, *,
                store: bool = True) -> tuple[list[FileWrite], Ledger]:
    """The writes and the new ledger of ``plan``; ``store``: put into the object store, for every file the
    plan patches (not one it creates), its pristine copy (what revert puts back) and its patched bytes (the
    bytes sndr writes, the base of :func:`_force_merge`'s 3-way merge); a dry-run stores nothing. A file the
    plan leaves as it is gets its copies too, so the files of a ledger written before sndr stored patched
    bytes have them after the next apply that plans again (any but the "already applied" fast path)."""
    from .commit import FileWrite, sha256_bytes
    from .model import Ledger, LedgerFile

    writes: list[FileWrite] = []
    files: dict[str, LedgerFile] = {}
    touched = set(plan.changes) | set(ledger.files if ledger else {})
    to_store: list[bytes] = []
    upstream = tree.pristine(ledger)
    for rel in sorted(touched):
        now = tree.read_bytes(rel)
        after: bytes | None  # None: the file goes (a created file back to pristine)
        if rel in plan.changes:
            ch = plan.changes[rel]
            after = patched = ch.new.encode("utf-8")
            if ch.pristine is None:
                pristine_sha, created = sha256_bytes(patched), True
            else:
                pristine_bytes = ch.pristine.encode("utf-8")
                pristine_sha, created = sha256_bytes(pristine_bytes), False
                # the pristine copy (revert's bytes), and the bytes sndr writes (apply --force's merge base)
                to_store += [pristine_bytes, patched]
            files[rel] = LedgerFile(pristine_sha256=pristine_sha, patched_sha256=sha256_bytes(patched),
                                    patches=ch.patches, created=created)
        else:  # touched by an older patch set, untouched now: back to pristine
            after = upstream.read_bytes(rel)
        if now != after:
            writes.append(FileWrite(rel, now, after))
    for rel, text in plan.read.items():
        # Read, written by no patch: recorded with the bytes the verdicts rest on (state.read_only_entry).
        data = text.encode("utf-8")
        sha = sha256_bytes(data)
        files[rel] = LedgerFile(pristine_sha256=sha, patched_sha256=sha, patches=[], created=False)
        to_store.append(data)
    if store:
        tree.put_objects(to_store)  # durable before the journal (and the ledger) name them
    # The ledger describes the tree after the commit: what "applies" now is "applied".
    as_applied = {"applies": "applied"}
    results = {p.id: as_applied.get(p.status, p.status) for p in plan.patches if p.status != "gated"}
    counts: dict[str, int] = {}
    for v, n in plan.counts().items():
        counts[as_applied.get(v, v)] = counts.get(as_applied.get(v, v), 0) + n
    new = Ledger(patch_set_digest=plan.digest, patches=plan.applied, vllm_version=plan.version, files=files,
                 left_out={lo.id: lo for lo in plan.left_out},
                 results=results, counts=dict(sorted(counts.items())))
    return writes, new


def run_revert(root: Path | str, *, force: bool = False) -> Report:
    from .commit import FileWrite, TreeRoot, commit, recover

    tree = TreeRoot(root)
    version = tree.version
    if not tree.state.exists():
        return _report("revert", tree, version, None, ok=True, exit_code=EXIT_OK,
                       notes=["no .sndr state: sndr never patched this tree; nothing to revert"])
    with tree.lock():
        restored = recover(tree)
        notes = [f"rolled back an interrupted commit ({len(restored)} file(s) restored)"] if restored else []
        ledger = tree.read_ledger()
        swept = sweep_probes(tree, set(ledger.files) if ledger else set())
        if swept:
            notes.append(f"removed {len(swept)} probe file(s) an interrupted sndr left: {', '.join(swept)}")
        if ledger is None:
            return _report("revert", tree, version, None, ok=True, exit_code=EXIT_OK,
                           notes=notes + ["no ledger: sndr has no record of writing any file here, so it has nothing to "
                                          "restore (a tree whose ledger was deleted may still hold patched files: "
                                          "`--verify --patches DIR` classifies them; reinstalling vLLM restores "
                                          "pristine files)"])
        foreign = _foreign_changes(tree, ledger, FORCE_REVERT_HINT)
        if foreign and not force:
            return _report("revert", tree, version, None, ok=False, exit_code=EXIT_FINDINGS, problems=foreign,
                           digest=ledger.patch_set_digest, notes=notes + ["refused: nothing was written"])
        writes = []
        for rel, entry in sorted(ledger.files.items()):
            if entry.read_only:
                continue  # sndr wrote nothing there: revert leaves it as it is, changed since or not
            now = tree.read_bytes(rel)
            want = None if entry.created else tree.get_object(entry.pristine_sha256)
            if now != want:
                writes.append(FileWrite(rel, now, want))
        commit(tree, writes, None, ledger.patch_set_digest)
        # .sndr/objects stays: the pristine copies make the next apply cheaper (the patched copies are
        # no longer named by any ledger; a later apply stores what it writes again).
        return _report("revert", tree, version, None, ok=True, exit_code=EXIT_OK, digest=ledger.patch_set_digest,
                       files_written=[w.rel for w in writes], notes=notes)


def run_verify(root: Path | str, patch_set: PatchSet, *, only: list[str] | None = None, environ=None,
               profile=None, edits: bool = False) -> Report:
    """Is the tree patched with exactly this patch set? Read-only, except crash recovery.

    ``edits``: also give every edit's verdict on a tree the ledger describes (costs a plan).
    """
    from .commit import TreeRoot, recover

    environ = os.environ if environ is None else environ
    tree = TreeRoot(root)
    version = tree.version
    if tree.journal_path.exists():
        with tree.lock():
            recover(tree)
    untouched = not tree.state.exists()
    report = _verify_locked(tree, version, patch_set, only, environ, profile, edits)
    if untouched and tree.state.exists():
        # A first apply started while we read without a lock: read again under it.
        report = _verify_locked(tree, version, patch_set, only, environ, profile, edits)
    return report


def _verify_locked(tree: TreeRoot, version: str, patch_set: PatchSet, only, environ, profile,
                   edits: bool = False) -> Report:
    from .commit import sha256_bytes
    from .model import PatchResult
    from .plan import build_plan, enabled_set

    with tree.lock(shared=True):
        ledger = tree.read_ledger()
        es = enabled_set(patch_set, version, environ, only=only, profile=profile)
        digest = es.digest
        if ledger is None:
            # No ledger (fresh or in-memory-patched tree): classify the current texts.
            plan = build_plan(patch_set, tree.read_text, version, environ=environ, only=only, check_compile=False,
                              profile=profile)
            # A runtime binding that applies needs nothing on disk (each vLLM process installs it at
            # startup): only text edits that still apply leave the tree short of the set.
            runtime_only = [p.id for p in plan.patches if p.applies_at_startup_only()]
            pending = [p for p in plan.patches if p.status in ("applies", "failed") and p.id not in runtime_only]
            problems = list(plan.problems) + [
                Problem("not_applied", f"patch is not applied ({p.status})", patch=p.id) for p in pending]
            notes = ["no ledger: verified by classifying the current files"]
            if runtime_only:
                notes.append(f"{', '.join(runtime_only)}: runtime binding(s) in place; nothing on disk to apply: "
                             f"each vLLM process installs them at startup (python -m sndr status shows them)")
            return _report("verify", tree, version, plan, ok=not problems,
                           exit_code=EXIT_OK if not problems else EXIT_FINDINGS, problems=problems, notes=notes)
        problems = []
        if ledger.vllm_version and ledger.vllm_version != version:
            problems.append(Problem("ledger_stale", f"the ledger was written for vLLM {ledger.vllm_version}, the tree "
                                    f"now holds vLLM {version}", file=str(tree.ledger_path),
                                    hint="run python -m sndr.apply to plan again from the tree as it is"))
        if ledger.patch_set_digest != digest:
            problems.append(_set_mismatch(tree, ledger, patch_set, es))
        for rel, entry in sorted(ledger.files.items()):
            now = tree.read_bytes(rel)
            if now is not None and sha256_bytes(now) == entry.patched_sha256:
                continue
            if entry.read_only:
                readers = [p.id for p in patch_set.patches if p.id in ledger.patches and any(f.path == rel for f in p.files)]
                problems.append(Problem("read_changed", f"file {'was deleted' if now is None else 'changed'} since "
                                        f"apply; sndr wrote nothing to it, but the set's verdicts there (merged, optional "
                                        f"absent, a runtime target) rest on the bytes it had", file=rel,
                                        patch=", ".join(readers) or None,
                                        hint="run python -m sndr.apply to plan the set again from the file as it is"))
                continue
            problems.append(Problem("hash_mismatch", "file does not hold the patched bytes the ledger records",
                                    file=rel, patch=", ".join(entry.patches)))
        damaged = _stored_copy_problems(tree, ledger)
        problems += damaged
        bad = {pr.file for pr in problems if pr.code == "hash_mismatch" and pr.file}
        results = _ledger_patches(tree, ledger, patch_set, version, environ, only, profile, es,
                                  edits=(edits and not problems) or bool(bad), reason="verified against the ledger")
        counts = ledger.counts
        if bad:  # the counts say what the tree holds, never "applied" for a file that is not
            counts = _unpatched_files(tree, ledger, patch_set, results, bad)
        stale = [os.path.relpath(p, tree.root) for p in stale_probes(tree, set(ledger.files) | _target_paths(patch_set))]
        vnotes = [f"{len(stale)} probe file(s) an interrupted sndr left: {', '.join(stale)}; the next apply or "
                  f"revert removes them"] if stale else []
        # One row per patch: a left-out patch is `left_out` (with the plan's edit verdicts, when it has them).
        prior = {r.id: r for r in results if r.id in ledger.left_out}
        results = [r for r in results if r.id not in ledger.left_out]
        for lo in ledger.left_out.values():
            results.append(PatchResult(id=lo.id, title=patch_set.by_id[lo.id].title if lo.id in patch_set.by_id else "",
                                       status="left_out", reason=lo.reason, reason_code=lo.code,
                                       on_failure=lo.on_failure, edits=prior[lo.id].edits if lo.id in prior else []))
            if not lo.allowed:
                problems.append(Problem("left_out", f"left out at apply ({lo.by}): {lo.reason}", patch=lo.id,
                                        hint="fix the patch (or its order) and apply again"))
        vnotes += _left_out_notes([lo for lo in ledger.left_out.values() if lo.allowed])
        return _report("verify", tree, version, None, ok=not problems,
                       exit_code=EXIT_OK if not problems else EXIT_BAD_INPUT if damaged else EXIT_FINDINGS,
                       problems=problems, digest=digest, patches=results, counts=counts, notes=vnotes)


def _set_mismatch(tree: TreeRoot, ledger: Ledger, patch_set: PatchSet, es: EnabledSet) -> Problem:
    """patch_set_mismatch, naming the patches that differ and the variable that would make them agree
    (as the startup hook names them), not two digests only."""
    on, digest = es.ids, es.digest
    applied = set(ledger.patches) | set(ledger.left_out)
    extra = [i for i in ledger.patches if i not in on]  # on disk, not enabled here
    absent = [i for i in on if i not in applied and patch_set.by_id[i].files]  # enabled here, not on disk
    parts = []
    if extra:
        parts.append("on disk, not enabled here: " + ", ".join(
            f"{i} ({env.enable_var(i)}=1 enables it)" if i in patch_set.by_id else f"{i} (not in this patch set)"
            for i in extra))
    if absent:
        parts.append("enabled here, not on disk: " + ", ".join(f"{i} ({env.enable_var(i)}=0 disables it)"
                                                             for i in absent))
    if not parts:
        parts.append("the same ids, but the patches' contents differ (a patch file was edited since apply)")
    return Problem("patch_set_mismatch", f"tree was patched with another patch set (ledger "
                   f"{ledger.patch_set_digest[:12]}, current {digest[:12]}): " + "; ".join(parts),
                   file=str(tree.ledger_path),
                   hint="give this command the SNDR_ENABLE_* values (and --only/--profile) apply ran with, or run "
                        "python -m sndr.apply to re-plan from pristine")


#: The count key of an edit in a file that fails its ledger hash (``render`` names them).
NOT_APPLIED = "not_applied"


def _unpatched_files(tree: TreeRoot, ledger: Ledger, patch_set: PatchSet, results: list[PatchResult],
                     bad: set[str]) -> dict[str, int]:
    """Re-read the edits of files that fail their ledger hash on the files as they are now.

    Each such edit is classified on the current text (pristine after a reinstall or a
    restore: ``applies``); one that no longer reads ``applied``/``merged`` is counted
    ``not_applied`` (reason code ``hash_mismatch``) and its patch is ``failed``. Without
    per-edit results (the set differs from the ledger's) the edits of the patches that
    touch those files are moved from ``applied`` to ``not_applied`` by count.
    """
    from .classify import classify_edit
    from .model import Verdict

    texts: dict[str, str | None] = {}
    pristine: dict[str, str | None] = {}
    upstream = tree.pristine(ledger)
    counts: dict[str, int] = {}
    for p in results:
        hit = [e for e in p.edits if e.file in bad and e.verdict == Verdict.APPLIED]  # what apply changed
        patch = patch_set.by_id.get(p.id)
        for e in hit:
            if e.file not in texts:
                try:
                    texts[e.file] = tree.read_text(e.file)
                except SndrError:  # not UTF-8 any more: no edit of ours reads applied there
                    texts[e.file] = None
                pristine[e.file] = upstream.read_text(e.file)
            edit = next((ed for fe in (patch.files if patch else []) if fe.path == e.file
                         for ed in fe.edits if ed.name == e.name), None)
            if edit is None:
                verdict = Verdict.FILE_MISSING if texts[e.file] is None else Verdict.APPLIES
            else:
                verdict = classify_edit(edit, texts[e.file], pristine[e.file]).verdict
            if verdict in (Verdict.APPLIED, Verdict.MERGED):
                continue
            e.verdict = Verdict.DRIFTED if verdict == Verdict.CONFLICT else verdict
            e.reason_code = "hash_mismatch"
            e.reason = (f"not applied: {e.file} does not hold the patched bytes the ledger records "
                        f"(as the file is now, the edit reads {e.verdict.value})")
        if any(e.reason_code == "hash_mismatch" for e in hit) or (not p.edits and p.id in ledger.patches and any(
                p.id in ledger.files[rel].patches for rel in bad if rel in ledger.files)):
            files = sorted({rel for rel in bad if rel in ledger.files and p.id in ledger.files[rel].patches})
            p.status = "failed"
            p.reason = f"not applied in {', '.join(files)}: the file does not hold the patched bytes (hash_mismatch)"
            p.reason_code = "hash_mismatch"
        for e in p.edits:
            key = NOT_APPLIED if e.reason_code == "hash_mismatch" else e.verdict.value
            counts[key] = counts.get(key, 0) + 1
        if p.status == "gated" and not p.edits:
            counts["gated"] = counts.get("gated", 0) + 1
    if any(p.edits for p in results):
        return dict(sorted(counts.items()))
    # No per-edit results (another set than the ledger's): move the edits of those files by count.
    counts = dict(ledger.counts)
    moved = 0
    for rel in bad:
        for pid in ledger.files[rel].patches if rel in ledger.files else []:
            patch = patch_set.by_id.get(pid)
            moved += sum(len(fe.edits) or 1 for fe in (patch.files if patch else []) if fe.path == rel)
    moved = min(moved, counts.get("applied", 0))
    if moved:
        counts["applied"] -= moved
        counts[NOT_APPLIED] = counts.get(NOT_APPLIED, 0) + moved
        if not counts["applied"]:
            del counts["applied"]
    return dict(sorted(counts.items()))


# ----------------------------------------------------------------------------- the --tree of the command


def _default_root() -> tuple[Path, bool]:
    """No ``--tree``: :func:`sndr.tree.default_root` for the pinned vLLM (root, is_fallback)."""
    from .tree import default_root

    return default_root(PIN_VERSION)


def resolve_tree(spec: str, *, dry_run: bool) -> Path:
    """``--tree`` -> the directory that contains ``vllm/`` (:func:`sndr.tree.directory`: the one rule, with
    the reason when the spec is not a directory apply may use)."""
    from .tree import directory

    return directory(spec, dry_run=dry_run)
