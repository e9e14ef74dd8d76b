"""The preflight analysis: plan both trees, pair the results, name the transitions and the actions.

There is one classifier: both trees go through :func:`sndr.plan.build_plan`,
the same sequential simulation that apply runs. This module only pairs the
two plans, names the transitions, asks :mod:`.suggest` (through
:mod:`.hops` for ``--via``) where drifted code went, and fills the
:mod:`.models`. Rendering lives in :mod:`.render` and :mod:`.annotations`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..env import enable_var
from ..errors import EXIT_FINDINGS, EXIT_OK, Problem, SndrError
from ..load import PatchSet
from ..model import EditResult, Patch, PatchResult, Verdict
from ..plan import build_plan
from .models import (
    _LEVEL,
    _NEEDS_SUGGESTIONS,
    _OK,
    Action,
    ChainBreak,
    EditEntry,
    EditKind,
    EditRef,
    MarkerChange,
    MarkerScope,
    PatchEntry,
    PatchSetInfo,
    PreflightReport,
    SuggestionModel,
)
from .snapshot import Snapshot, changed_files, same_release
from .suggest import Relocator

# ============================================================================ the preflight


@dataclass
class _Ctx:
    patch_set: PatchSet
    pin: Snapshot
    cand: Snapshot
    pin_plan: Any
    cand_plan: Any
    probe: dict[str, PatchResult] = field(default_factory=dict)
    relocator: Any = None
    #: (entry, anchor text, pin file, pin qualname, pin line): answered in one batch after every entry exists.
    pending: list = field(default_factory=list)


def _all_enabled(patch_set: PatchSet, environ) -> dict:
    env = dict(environ)
    for p in patch_set.patches:
        env[enable_var(p.id)] = "1"
    return env


def run_preflight(patch_set: PatchSet, pin, candidate, *, environ=None, only: list[str] | None = None,
                  suggestions: bool = True, config: bool = True, watch=None, check_compile: bool = False,
                  enable_all: bool = False, fail_on: Iterable[str] = ("drift",), via=None) -> PreflightReport:
    """Classify ``patch_set`` on ``pin`` and ``candidate`` (trees or tree specs) and pair the results.

    ``via``: ``"auto"`` or a list of releases (or tree specs) between the two;
    drifted anchors are then also followed release by release (:mod:`.hops`).
    """
    from ..tree import open_tree

    environ = dict(os.environ if environ is None else environ)
    if enable_all:
        environ = _all_enabled(patch_set, environ)
    pin_s = pin if isinstance(pin, Snapshot) else Snapshot(open_tree(pin))
    cand_s = candidate if isinstance(candidate, Snapshot) else Snapshot(open_tree(candidate))
    pin_s.load_all()
    cand_s.load_all()
    warnings = same_release(pin_s, cand_s)  # the same tree twice is refused here, before any planning
    pin_version, cand_version = pin_s.version, cand_s.version

    pin_plan = build_plan(patch_set, pin_s.read_text, pin_version, environ=environ, only=only,
                          check_compile=check_compile)
    cand_plan = build_plan(patch_set, cand_s.read_text, cand_version, environ=environ, only=only,
                           check_compile=check_compile)
    ctx = _Ctx(patch_set, pin_s, cand_s, pin_plan, cand_plan)

    # Patches the candidate turns off by their vllm range only: classify them
    # with the range widened too, so a bump never hides a drift behind a gate.
    pin_by = {p.id: p for p in pin_plan.patches}
    excluded = [p.id for p in cand_plan.patches
                if p.status == "gated" and _gate_code(p) == "version_mismatch" and pin_by[p.id].status != "gated"]
    if excluded:
        widened = PatchSet(patches=[q.model_copy(update={"vllm": ""}) if q.id in excluded else q
                                    for q in patch_set.patches],
                           directory=patch_set.directory, sources=patch_set.sources)
        # Only the excluded patches (and what they require): the probe answers
        # "would it apply", and must not re-run the rest of the set.
        probe_plan = build_plan(widened, cand_s.read_text, cand_version, environ=environ, only=excluded,
                                check_compile=False)
        ctx.probe = {p.id: p for p in probe_plan.patches if p.id in excluded}

    if suggestions:
        changed, _gone = changed_files(pin_s, cand_s)
        ctx.relocator = Relocator(pin_s.text_or_none, cand_s.text_or_none, changed, index=_line_index(cand_s, changed))

    report = PreflightReport(
        pin=pin_s.info(), candidate=cand_s.info(),
        patch_set=PatchSetInfo(directory=str(patch_set.directory) if patch_set.directory else None,
                               patches=len(patch_set.patches), digest=patch_set.digest()),
        warnings=warnings,
    )
    for cr in cand_plan.patches:
        report.patches.append(_patch_entry(ctx, pin_by[cr.id], cr))
    if ctx.pending:
        report.summary.via = _suggest_all(ctx, via)
    _fill_lists(report)
    report.newly_merged, report.newly_reverted = marker_changes(patch_set, pin_s, cand_s)
    problems = _dedupe_problems([*pin_plan.problems, *cand_plan.problems])
    report.problems = list(problems)
    from .perf import performance_section

    report.performance = performance_section(patch_set, pin_s.text_or_none, cand_s.text_or_none)
    if config:
        report.config = _config_section(pin_s, cand_s, watch, patch_set, report, cand_plan)
    _summarise(report, list(fail_on))
    return report


def _gate_code(p: PatchResult) -> str:
    return getattr(p, "reason_code", "") or ""


def _dedupe_problems(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in problems:
        if p.code.startswith(("edit_", "runtime_")) or p.code in ("anchor_ambiguous", "group_ambiguous",
                                                                    "overlap_conflict", "line_endings"):
            continue  # every edit failure is already an edit entry with its transition
        key = (p.code, p.message, p.file, p.line, p.patch)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _config_section(pin: Snapshot, cand: Snapshot, watch, patch_set: PatchSet, report: PreflightReport,
                    cand_plan=None):
    """Configuration drift (sndr.preflight.configdrift) between the two pristine snapshots; None when it cannot be read.

    Runtime targets are bound against the candidate as the plan's text patches
    leave it, exactly as apply and the running process bind them.
    """
    from . import configdrift

    changes = getattr(cand_plan, "changes", None) or {}

    def cand_read(rel: str):
        return changes[rel].new if rel in changes else cand.read_text(rel)

    if watch is None or isinstance(watch, (str, Path)):
        watch = configdrift.load_watch_config(watch) if watch is not None else configdrift.load_watch_config()
    try:
        drift = configdrift.compare_config(pin, cand, watch, patches=patch_set.patches, candidate_read=cand_read)
    except SndrError as exc:
        report.problems.extend(exc.problems)
        return None
    return drift


# ---------------------------------------------------------------------------- one patch


def _rel_source(path: str) -> str:
    try:
        return os.path.relpath(path) if os.path.isabs(path) and not os.path.relpath(path).startswith("..") else path
    except ValueError:
        return path


def _edit_kind(p: Patch | None, name: str) -> EditKind:
    if p is None:
        return "text"
    if any(r.name == name for r in p.runtime):
        return "runtime"
    if name == "create" and any(f.create is not None for f in p.files):
        return "create"
    return "text"


def _anchor_of(p: Patch, name: str, file: str):
    for f in p.files:
        if f.path != file:
            continue
        for e in f.edits:
            if e.name == name:
                return e
    return None


def _patch_entry(ctx: _Ctx, pr: PatchResult, cr: PatchResult) -> PatchEntry:
    patch = ctx.patch_set.by_id.get(cr.id)
    pin_edits = {e.name: e for e in pr.edits}
    probe = ctx.probe.get(cr.id)
    probe_edits = {e.name: e for e in probe.edits} if probe else {}
    entry = PatchEntry(id=cr.id, title=cr.title, kind=cr.kind, source=_rel_source(ctx.patch_set.source_of(cr.id)),
                       status=cr.status, pin_status=pr.status, action="keep", reason=cr.reason, pin_reason=pr.reason)
    for ce in cr.edits:
        pe = pin_edits.get(ce.name) or ce
        entry.edits.append(_edit_entry(ctx, patch, pe, ce, probe_edits.get(ce.name)))
    entry.action = _action(entry)
    if pr.status == "failed" and cr.status != "failed" and cr.status != "gated":
        entry.notes.append("did not apply on the pin; applies on the candidate")
    if entry.action == "review" and pr.status != "gated" and cr.status == "gated":
        entry.notes.append(f"turned off on {ctx.cand.version}: {cr.reason}; widen `vllm` once it re-validates")
    merged = [e.name for e in entry.edits if e.verdict in (Verdict.MERGED,) or _upstream_has_replacement(e)]
    live = [e.name for e in entry.edits if e.verdict == Verdict.APPLIES]
    if merged and live:
        entry.notes.append(f"partly merged upstream ({', '.join(merged)}); still applies: {', '.join(live)}")
    return entry


def _edit_entry(ctx: _Ctx, patch: Patch | None, pe: EditResult, ce: EditResult, probe: EditResult | None) -> EditEntry:
    kind = _edit_kind(patch, ce.name)
    file = ce.file
    if kind == "runtime" and not file.endswith(".py") and pe.file.endswith(".py"):
        file = pe.file  # the target is gone on the candidate: name the module file it had on the pin
    ee = EditEntry(file=file, name=ce.name, kind=kind, required=ce.required, group=ce.group,
                   verdict=ce.verdict, pin_verdict=pe.verdict, transition=f"{pe.verdict.value}->{ce.verdict.value}",
                   line=ce.line, qualname=ce.qualname, pin_line=pe.line, pin_qualname=pe.qualname,
                   reason=ce.reason, pin_reason=pe.reason if pe is not ce else "",
                   chained_from=list(pe.chained_from), locations=list(ce.locations))
    if probe is not None:
        ee.verdict_if_enabled = probe.verdict
    if ce.verdict not in (Verdict.APPLIES, Verdict.APPLIED, Verdict.AMBIGUOUS, Verdict.MERGED) and kind != "runtime":
        ee.line = ee.qualname = None
    if ce.verdict == Verdict.APPLIES and pe.verdict == Verdict.APPLIES:
        if (pe.qualname or "") != (ce.qualname or ""):
            ee.notes.append(f"enclosing scope changed: {pe.qualname or '<module>'} -> {ce.qualname or '<module>'}")
        if ctx.pin.read_bytes(ce.file) != ctx.cand.read_bytes(ce.file):
            ee.notes.append("file changed upstream around a surviving anchor")
    if ce.verdict == Verdict.APPLIED and pe.verdict in (Verdict.APPLIES, Verdict.GATED) and not ctx.cand.has_ledger:
        ee.notes.append("upstream carries the replacement text; declare a merged marker to retire this edit")
    if ce.verdict == Verdict.OPTIONAL_ABSENT and ce.group and _group_satisfied(ctx, ce):
        ee.notes.append("group variant switched: another member matches on the candidate")
    ee.chain_broken = _chain_break(ctx, pe, ce)
    target = ce.verdict if ce.verdict != Verdict.GATED else (probe.verdict if probe else None)
    wants = target in _NEEDS_SUGGESTIONS or (target == Verdict.OPTIONAL_ABSENT and pe.verdict in _OK
                                             and not (ce.group and _group_satisfied(ctx, ce)))
    if wants and ctx.relocator is not None and patch is not None:
        # A chain-broken anchor holds the producer's text: only a verbatim hit on the candidate (upstream
        # took that text, or the file moved with it) says where it went (_keep_verbatim).
        anchor = _search_text(ctx, patch, kind, pe, ce)
        if anchor is not None:
            ctx.pending.append((ee, anchor, file, pe.qualname or None, pe.line))
    return ee


def _line_index(snap: Snapshot, changed: list[str]):
    """The candidate's on-disk line index, opened (or built) on the first lookup; in memory without a cache."""
    from .lineindex import Lazy, MemoryIndex, for_snapshot

    return Lazy(lambda: for_snapshot(snap) or MemoryIndex(changed, snap.text_or_none))


def _models(found) -> list[SuggestionModel]:
    return [SuggestionModel(file=s.file, line=s.line, end_line=s.end_line, qualname=s.qualname, score=s.score,
                            similarity=s.similarity, reasons=list(s.reasons), text=s.text, confidence=s.confidence)
            for s in found]


def _suggest_all(ctx: _Ctx, via) -> list[str]:
    """Answer every pending suggestion request: the direct search, then (``via``) the hop chain."""
    chain = None
    if via:
        from . import hops

        specs = hops.resolve_via(via, ctx.pin.version, ctx.cand.version)
        chain = hops.Chain.build(ctx.pin, specs, ctx.cand)
        cand_state = chain.states[-1]  # the direct search shares the candidate's per-file views with the last hop
        ctx.relocator = Relocator(ctx.pin.text_or_none, ctx.cand.text_or_none, ctx.relocator.changed,
                                  files=cand_state.files, index=cand_state.index)
    reloc = ctx.relocator
    reloc.prefetch((anchor, file) for _, anchor, file, _, _ in ctx.pending)
    direct = [_keep_verbatim(ee, reloc.suggest(anchor, file, qualname=q, pin_line=line))
              for ee, anchor, file, q, line in ctx.pending]
    if chain is None:
        for (ee, *_), found in zip(ctx.pending, direct):
            ee.suggestions = _models(found)
            ee.confidence = found[0].confidence if found else _nothing_found(ee)
        return []
    requests = [hops.Request(anchor, file, q, line) for _, anchor, file, q, line in ctx.pending]
    states = hops.follow(chain, requests)
    for (ee, *_), req, st, found in zip(ctx.pending, requests, states, direct):
        via_one = hops.chain_suggestion(chain, req, st)
        if via_one is not None and not _keep_verbatim(ee, [via_one]):
            via_one = None
        chosen, source = hops.pick(found, via_one)
        ee.suggestions = _models(chosen)
        ee.confidence = chosen[0].confidence if chosen else _nothing_found(ee)
        ee.path = st.path
        ee.path_source = source
    return chain.versions[1:-1]


def _nothing_found(ee: EditEntry):
    """The class of an edit with no suggestion: "low" (no confident match), or none for a chain-broken edit
    (the chain is its story, as when it was not searched)."""
    return "low" if ee.chain_broken is None else None


def _keep_verbatim(ee: EditEntry, found):
    """For a chain-broken edit, only the suggestions that hold its anchor's lines verbatim (similarity 100)."""
    if ee.chain_broken is None or not found:
        return found
    return [s for s in found if s.similarity == 100]


def _search_text(ctx: _Ctx, patch: Patch, kind: str, pe: EditResult, ce: EditResult) -> str | None:
    """What to look for on the candidate: the anchor, or the head of a runtime target's pin source."""
    if kind == "text":
        edit = _anchor_of(patch, ce.name, ce.file)
        return edit.anchor if edit is not None else None
    if kind == "runtime" and ce.line is None and pe.line and pe.file.endswith(".py"):
        text = ctx.pin.text_or_none(pe.file)
        if text is None:
            return None
        lines = text.split("\n")[pe.line - 1:]
        head = lines[:1]
        for ln in lines[1:12]:  # the def and the start of its body (enough to recognise it)
            if ln.strip() and not ln.startswith((" ", "\t", ")")):
                break
            head.append(ln)
        return "\n".join(head) + "\n"
    return None


def _group_satisfied(ctx: _Ctx, ce: EditResult) -> bool:
    for p in ctx.cand_plan.patches:
        if p.id == ce.patch:
            return any(e.group == ce.group and e.name != ce.name and e.verdict in (Verdict.APPLIES, Verdict.APPLIED,
                                                                                Verdict.MERGED) for e in p.edits)
    return False


def _upstream_has_replacement(e: EditEntry) -> bool:
    return e.verdict == Verdict.APPLIED and e.pin_verdict in (Verdict.APPLIES, Verdict.GATED)


def _chain_break(ctx: _Ctx, pe: EditResult, ce: EditResult) -> ChainBreak | None:
    """The dependent's anchor lay in a producer's replacement on the pin; the producer is gone on the candidate."""
    if not pe.chained_from or ce.verdict in (Verdict.APPLIES, Verdict.APPLIED, Verdict.MERGED, Verdict.GATED):
        return None
    cand = {p.id: p for p in ctx.cand_plan.patches}
    for producer in pe.chained_from:
        pr = cand.get(producer)
        if pr is None or pr.status in ("applies", "applied"):
            continue
        p_edit, p_verdict = _producer_edit(ctx, producer, pr, ce)
        verdict = p_verdict or pr.status
        msg = (f"{ce.patch}/{ce.name}: its anchor lies in text that {producer}"
               f"{'/' + p_edit if p_edit else ''} produces, and {producer} is {verdict} on the candidate")
        return ChainBreak(producer=producer, producer_edit=p_edit, producer_verdict=verdict, message=msg)
    return None


def _producer_edit(ctx: _Ctx, producer: str, pr: PatchResult, ce: EditResult) -> tuple[str | None, str | None]:
    """The producer's edit whose replacement holds the dependent's anchor (best line overlap)."""
    patch = ctx.patch_set.by_id.get(producer)
    dep_patch = ctx.patch_set.by_id.get(ce.patch)
    dep = _anchor_of(dep_patch, ce.name, ce.file) if dep_patch else None
    if patch is None or dep is None:
        return None, None
    lines = {ln.strip() for ln in dep.anchor.split("\n") if ln.strip()}
    best, best_n = None, -1
    for f in patch.files:
        if f.path != ce.file:
            continue
        for e in f.edits:
            n = len(lines & {ln.strip() for ln in e.replacement.split("\n")}) + (100 if dep.anchor in e.replacement else 0)
            if n > best_n:
                best, best_n = e.name, n
    verdict = next((e.verdict.value for e in pr.edits if e.name == best), None)
    return best, verdict


def _action(entry: PatchEntry) -> Action:
    edits = entry.edits
    if entry.status == "gated" and entry.pin_status == "gated":
        return "gated"
    if entry.status == "gated":
        return "review"  # the bump turns it off: someone has to decide
    blocking = [e for e in edits if e.required or e.group]
    if any(e.verdict in _NEEDS_SUGGESTIONS and e.chain_broken is None for e in blocking):
        return "reanchor"
    if any(e.verdict == Verdict.AMBIGUOUS or e.chain_broken is not None for e in edits):
        return "review"
    retiring = [e for e in edits if e.verdict == Verdict.MERGED or _upstream_has_replacement(e)]
    rest = [e for e in edits if e not in retiring and e.verdict != Verdict.OPTIONAL_ABSENT]
    if retiring and not rest:
        return "retire"
    if retiring:
        return "review"  # partly merged upstream
    if any(_is_soft_skip(e) for e in edits):
        return "soft_skip"
    return "keep"


def _is_soft_skip(e: EditEntry) -> bool:
    if e.chain_broken is not None:
        return False
    if e.verdict == Verdict.OPTIONAL_ABSENT and e.pin_verdict in _OK and "group variant switched" not in " ".join(e.notes):
        return True
    return e.verdict == Verdict.FILE_MISSING and not (e.required or e.group) and e.pin_verdict != Verdict.FILE_MISSING


# ---------------------------------------------------------------------------- lists and summary


def _ref(patch: str, e: EditEntry, detail: str = "") -> EditRef:
    return EditRef(patch=patch, file=e.file, name=e.name, required=e.required, pin_verdict=e.pin_verdict,
                   verdict=e.verdict, line=e.line, qualname=e.qualname, pin_line=e.pin_line,
                   pin_qualname=e.pin_qualname, detail=detail)


def _fill_lists(report: PreflightReport) -> None:
    for p in report.patches:
        for e in p.edits:
            blocking = e.required or e.group is not None
            if e.chain_broken is not None:
                report.chain_broken.append(_ref(p.id, e, e.chain_broken.message))
                continue
            if e.verdict == Verdict.DRIFTED and blocking:
                report.genuine_anchor_drift.append(_ref(p.id, e, e.reason))
            elif e.verdict == Verdict.FILE_MISSING:
                (report.file_missing if blocking else report.optional_absent).append(_ref(p.id, e, e.reason))
            elif e.verdict == Verdict.AMBIGUOUS:
                report.ambiguous.append(_ref(p.id, e, e.reason))
            elif e.verdict == Verdict.MERGED and e.pin_verdict != Verdict.MERGED:
                report.retired_upstream.append(_ref(p.id, e, e.reason))
            elif e.verdict == Verdict.MERGED:
                report.retired_upstream.append(_ref(p.id, e, "already merged on the pin: " + e.reason))
            elif _upstream_has_replacement(e):
                report.retired_upstream.append(_ref(p.id, e, "replacement text already upstream (no merged marker)"))
            elif _is_soft_skip(e):
                report.optional_absent.append(_ref(p.id, e, e.reason))
            elif e.verdict == Verdict.GATED and e.pin_verdict != Verdict.GATED:
                extra = f" (with the range widened: {e.verdict_if_enabled.value})" if e.verdict_if_enabled else ""
                report.newly_gated.append(_ref(p.id, e, p.reason + extra))
            if e.verdict == Verdict.APPLIES and any(n.startswith("enclosing scope changed") for n in e.notes):
                report.qualname_changed.append(_ref(p.id, e, e.notes[0]))


def _findings(report: PreflightReport) -> dict[str, int]:
    """Findings per --fail-on class (each counted once, in its highest class)."""
    drift = len(report.genuine_anchor_drift) + len(report.file_missing)
    drift += sum(1 for r in report.chain_broken if r.required)
    drift += sum(1 for p in report.patches for e in p.edits
                 if e.verdict == Verdict.GATED and e.verdict_if_enabled in _NEEDS_SUGGESTIONS and (e.required or e.group))
    drift += sum(1 for pr in report.problems if pr.code in ("conflicts_enabled", "compile_error"))
    ambiguous = len(report.ambiguous)
    anything = (len(report.retired_upstream) + len(report.optional_absent) + len(report.newly_merged)
                + len(report.newly_reverted) + len(report.newly_gated)
                + sum(1 for r in report.chain_broken if not r.required))
    config = 0
    if report.config is not None:
        config = report.config.attention_count + len(report.config.runtime_broken)
    return {"drift": drift, "ambiguous": ambiguous, "any": anything, "config": config}


def exit_code(report: PreflightReport, fail_on: Iterable[str]) -> int:
    """0 clean, 1 when a finding is at or above one of the ``fail_on`` classes."""
    f = report.summary.findings or _findings(report)
    for cls in fail_on:
        if cls == "none":
            continue
        if cls == "config":
            if f.get("config"):
                return EXIT_FINDINGS
            continue
        level = _LEVEL[cls]
        if any(f.get(k) for k, lv in _LEVEL.items() if lv >= level):
            return EXIT_FINDINGS
        if cls == "any" and f.get("config"):
            return EXIT_FINDINGS
    return EXIT_OK


def _summarise(report: PreflightReport, fail_on: list[str]) -> None:
    s = report.summary
    s.patches = len(report.patches)
    for p in report.patches:
        s.actions[p.action] = s.actions.get(p.action, 0) + 1
        for e in p.edits:
            s.edits += 1
            s.pin_counts[e.pin_verdict.value] = s.pin_counts.get(e.pin_verdict.value, 0) + 1
            s.counts[e.verdict.value] = s.counts.get(e.verdict.value, 0) + 1
            s.transitions[e.transition] = s.transitions.get(e.transition, 0) + 1
            if (e.verdict in _NEEDS_SUGGESTIONS or e.verdict_if_enabled in _NEEDS_SUGGESTIONS) and e.suggestions:
                s.suggestion_hits += 1
            if e.confidence is not None:
                s.confidence[e.confidence] = s.confidence.get(e.confidence, 0) + 1
    s.pin_counts = dict(sorted(s.pin_counts.items()))
    s.counts = dict(sorted(s.counts.items()))
    s.transitions = dict(sorted(s.transitions.items(), key=lambda kv: (-kv[1], kv[0])))
    s.actions = dict(sorted(s.actions.items()))
    s.confidence = {k: s.confidence[k] for k in ("high", "medium", "low") if k in s.confidence}
    s.findings = _findings(report)
    s.fail_on = list(fail_on)
    s.exit_code = exit_code(report, fail_on)


# ---------------------------------------------------------------------------- merged markers between trees


def marker_changes(patch_set: PatchSet, pin: Snapshot, cand: Snapshot) -> tuple[list[MarkerChange], list[MarkerChange]]:
    """Markers whose presence differs between the two pristine trees: (newly merged, newly reverted).

    A diff, not "present now": a marker that both trees carry is old news and
    appears in neither list.
    """
    merged: list[MarkerChange] = []
    reverted: list[MarkerChange] = []
    for p in patch_set.patches:
        checks: list[tuple[str | None, MarkerScope, str, str]] = []  # (edit, scope, file, marker)
        for f in p.files:
            for m in p.merged_markers:
                checks.append((None, "patch", f.path, m))
            for m in f.merged_markers:
                checks.append((None, "file", f.path, m))
            for e in f.edits:
                for m in e.merged_markers:
                    checks.append((e.name, "edit", f.path, m))
        seen = set()
        for edit, scope, file, marker in checks:
            if (edit, scope, file, marker) in seen:
                continue
            seen.add((edit, scope, file, marker))
            a, b = pin.text_or_none(file), cand.text_or_none(file)
            in_a = a is not None and marker in a
            in_b = b is not None and marker in b
            if in_a == in_b:
                continue
            text = b if in_b else a
            line = text.count("\n", 0, text.find(marker)) + 1 if text is not None else None
            mc = MarkerChange(patch=p.id, edit=edit, scope=scope, file=file, marker=marker,
                              pin_present=in_a, candidate_present=in_b, line=line)
            (merged if in_b else reverted).append(mc)
    return merged, reverted


