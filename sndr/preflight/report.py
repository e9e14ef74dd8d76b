"""Bump preflight: classify every patch on the pin and on a candidate vLLM tree.

``python -m sndr preflight --pin TREE --candidate TREE`` (and
``tools/bump_preflight.py``) answers, before a pin bump, what a week of
reading would: which patches still apply, which upstream merged (retire),
which genuinely drifted (re-anchor, with ranked relocation suggestions),
which soft-skip edits would silently stop working, and which upstream merged
markers appeared or disappeared between the two trees.

There is one classifier: both trees go through :func:`sndr.plan.build_plan`,
the same sequential simulation that apply runs. This module only pairs the
two plans, names the transitions, asks :mod:`sndr.preflight.suggest` where drifted code
went, and renders the result (JSON per DESIGN.md section 4, Markdown,
terminal, SARIF, GitHub annotations).

Public surface::

    run_preflight(patch_set, pin, candidate, ...) -> PreflightReport
    PreflightReport                      # the JSON contract (pydantic)
    render_markdown(report) -> str
    render_terminal(report, console=None)
    render_sarif(report) -> dict
    github_annotations(report) -> list[str]
    exit_code(report, fail_on) -> int
    cli_main(argv) -> int
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field

from .configdrift import ConfigDrift
from ..errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, Problem, SndrError, bad_input
from ..load import PatchSet, load_patch_set
from ..model import EditResult, Location, Patch, PatchResult, Verdict
from ..plan import build_plan

__all__ = [
    "PreflightReport",
    "PatchEntry",
    "EditEntry",
    "EditRef",
    "SuggestionModel",
    "MarkerChange",
    "FAIL_ON_CHOICES",
    "run_preflight",
    "exit_code",
    "render_markdown",
    "render_terminal",
    "render_sarif",
    "github_annotations",
    "cli_main",
]

FORMAT = 1
#: ``--fail-on`` classes. drift > ambiguous > any is a severity order ("at or
#: above"); ``config`` is its own class; ``none`` never fails on findings.
FAIL_ON_CHOICES = ("drift", "ambiguous", "any", "config", "none")
_LEVEL = {"any": 0, "ambiguous": 1, "drift": 2}

_OK = (Verdict.APPLIES, Verdict.APPLIED)
_FAILING = (Verdict.DRIFTED, Verdict.AMBIGUOUS, Verdict.FILE_MISSING)
_NEEDS_SUGGESTIONS = (Verdict.DRIFTED, Verdict.FILE_MISSING)


# ============================================================================ the contract (models)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TreeInfo(_Model):
    spec: str = Field(description="what the user passed: a directory, a wheel, vllm==X, git:REPO@REV, installed")
    kind: str = ""
    version: str
    tree_digest: str = Field(description="sha256 over (relpath, sha256) of every .py under vllm/, pristine bytes")
    files: int = 0
    ledger: bool = Field(default=False, description="the tree carries an sndr ledger; its pristine bytes were read")


class PatchSetInfo(_Model):
    directory: str | None = None
    patches: int = 0
    digest: str = ""


class SuggestionModel(_Model):
    """A place on the candidate where a drifted anchor most likely went. Never applied."""

    file: str
    line: int = Field(description="first line of the window, 1-based")
    end_line: int
    qualname: str = Field(description="enclosing Class.method on the candidate; '' at module level")
    score: int = Field(ge=0, le=100, description="similarity weighted by same qualname / same file / moved file")
    similarity: int = Field(ge=0, le=100, description="rapidfuzz ratio of the stripped lines")
    reasons: list[str] = Field(default_factory=list)
    text: str = Field(default="", description="the candidate window, for the diff")


class ChainBreak(_Model):
    producer: str = Field(description="patch id whose replacement text the anchor lies in (on the pin)")
    producer_edit: str | None = None
    producer_verdict: str = Field(description="the producer's (edit or patch) state on the candidate")
    message: str = ""


class EditEntry(_Model):
    file: str
    name: str
    kind: Literal["text", "create", "runtime"] = "text"
    required: bool = True
    group: str | None = None
    verdict: Verdict = Field(description="on the candidate")
    pin_verdict: Verdict
    transition: str = Field(description="'<pin_verdict>-><verdict>'")
    line: int | None = Field(default=None, description="candidate line where the anchor (or marker) sits")
    qualname: str | None = Field(default=None, description="candidate enclosing Class.method")
    pin_line: int | None = None
    pin_qualname: str | None = None
    reason: str = ""
    pin_reason: str = ""
    notes: list[str] = Field(default_factory=list)
    locations: list[Location] = Field(default_factory=list, description="every occurrence when ambiguous")
    chained_from: list[str] = Field(default_factory=list, description="producers on the pin (patch ids)")
    chain_broken: ChainBreak | None = None
    verdict_if_enabled: Verdict | None = Field(
        default=None, description="when the candidate gates the patch by its vllm range: the verdict with the range widened")
    suggestions: list[SuggestionModel] = Field(default_factory=list)


Action = Literal["keep", "retire", "reanchor", "review", "soft_skip", "gated"]


class PatchEntry(_Model):
    id: str
    title: str = ""
    kind: str = "text"
    source: str = ""
    status: str = Field(description="plan status on the candidate")
    pin_status: str
    action: Action
    reason: str = ""
    pin_reason: str = ""
    notes: list[str] = Field(default_factory=list)
    edits: list[EditEntry] = Field(default_factory=list)


class EditRef(_Model):
    """One edit in one of the report's lists."""

    patch: str
    file: str
    name: str
    required: bool = True
    pin_verdict: Verdict
    verdict: Verdict
    line: int | None = None
    qualname: str | None = None
    pin_line: int | None = None
    pin_qualname: str | None = None
    detail: str = ""


class MarkerChange(_Model):
    patch: str
    edit: str | None = Field(default=None, description="None for a patch- or file-level marker")
    scope: Literal["patch", "file", "edit"]
    file: str
    marker: str
    pin_present: bool
    candidate_present: bool
    line: int | None = Field(default=None, description="line of the marker on the tree where it is present")


class Summary(_Model):
    patches: int = 0
    edits: int = 0
    pin_counts: dict[str, int] = Field(default_factory=dict, description="edit verdicts on the pin")
    counts: dict[str, int] = Field(default_factory=dict, description="edit verdicts on the candidate")
    transitions: dict[str, int] = Field(default_factory=dict)
    actions: dict[str, int] = Field(default_factory=dict, description="patches per action class")
    findings: dict[str, int] = Field(default_factory=dict, description="findings per --fail-on class")
    suggestion_hits: int = Field(default=0, description="drifted/file_missing edits that got at least one suggestion")
    fail_on: list[str] = Field(default_factory=list)
    exit_code: int = 0


class PreflightReport(_Model):
    """``python -m sndr preflight --json``: pin vs candidate, per DESIGN.md section 4."""

    tool: str = "sndr"
    format: int = FORMAT
    pin: TreeInfo
    candidate: TreeInfo
    patch_set: PatchSetInfo = Field(default_factory=PatchSetInfo)
    patches: list[PatchEntry] = Field(default_factory=list)
    summary: Summary = Field(default_factory=Summary)
    genuine_anchor_drift: list[EditRef] = Field(
        default_factory=list, description="required (or group) edits that match on the pin and are drifted on the candidate")
    retired_upstream: list[EditRef] = Field(
        default_factory=list, description="edits upstream carries on the candidate (merged marker, or the replacement text)")
    newly_merged: list[MarkerChange] = Field(default_factory=list, description="markers absent on the pin, present on the candidate")
    newly_reverted: list[MarkerChange] = Field(default_factory=list, description="markers present on the pin, absent on the candidate")
    file_missing: list[EditRef] = Field(default_factory=list)
    ambiguous: list[EditRef] = Field(default_factory=list)
    chain_broken: list[EditRef] = Field(default_factory=list)
    optional_absent: list[EditRef] = Field(
        default_factory=list, description="soft-skips: edits that matched on the pin and silently would not on the candidate")
    qualname_changed: list[EditRef] = Field(default_factory=list, description="still applies, in another enclosing scope")
    newly_gated: list[EditRef] = Field(
        default_factory=list, description="enabled on the pin, turned off on the candidate by the patch's vllm range")
    config: ConfigDrift | None = Field(default=None, description="configuration drift (dependencies, env defaults, "
                                       "engine args, runtime targets), unless --no-config")
    problems: list[Problem] = Field(default_factory=list)


# ============================================================================ reading trees


class Snapshot:
    """Pristine texts of one tree, read once and shared by the plan, suggestions and config drift.

    A tree that carries an sndr ledger (an installed, patched vLLM) is read
    through the ledger, so the preflight always compares upstream to upstream.
    """

    def __init__(self, tree):
        self.tree = tree
        self.spec = str(getattr(tree, "spec", "") or tree)
        self.kind = str(getattr(tree, "kind", "") or "")
        self._ledger = None
        self._root = None
        root = getattr(tree, "root", None)
        if root is not None and (Path(root) / ".sndr" / "ledger.json").is_file():
            from ..commit import TreeRoot

            self._root = TreeRoot(root)
            self._ledger = self._root.read_ledger()
        self._bytes: dict[str, bytes | None] = {}
        self._text: dict[str, str | None] = {}
        self._files: list[str] | None = None
        self._digest: str | None = None

    @property
    def has_ledger(self) -> bool:
        return self._ledger is not None

    @property
    def version(self) -> str:
        return self.tree.version

    def metadata(self) -> str | None:
        return self.tree.metadata()

    def files(self) -> list[str]:
        if self._files is None:
            files = self.tree.files()
            if self._ledger is not None:  # files sndr created are not upstream's
                files = [f for f in files if not (f in self._ledger.files and self._ledger.files[f].created)]
            self._files = files
        return list(self._files)

    def read_bytes(self, rel: str) -> bytes | None:
        if rel not in self._bytes:
            if self._ledger is not None:
                self._bytes[rel] = self._root.pristine_bytes(rel, self._ledger)
            else:
                self._bytes[rel] = self.tree.read_bytes(rel)
        return self._bytes[rel]

    def load_all(self) -> None:
        """Read every source file once (the read-and-hash floor; the digest and the suggestions need them all)."""
        if self._ledger is None and hasattr(self.tree, "_iter_contents"):
            # The view's own bulk reader: for directories it opens the walked
            # absolute paths directly, several times faster than per-file lookups.
            wanted = set(self.files())
            for rel, data in self.tree._iter_contents():
                if rel in wanted:
                    self._bytes.setdefault(rel, data)
        for rel in self.files():
            self.read_bytes(rel)

    def read_text(self, rel: str) -> str | None:
        """Strict UTF-8, like every tree view: a patch engine never guesses an encoding."""
        if rel not in self._text:
            data = self.read_bytes(rel)
            if data is None:
                self._text[rel] = None
            else:
                try:
                    self._text[rel] = data.decode("utf-8")
                except UnicodeDecodeError as exc:
                    line = data[: exc.start].count(b"\n") + 1
                    raise bad_input("not_utf8", f"not valid UTF-8 at byte {exc.start} ({exc.reason})",
                                    file=rel, line=line) from None
        return self._text[rel]

    def text_or_none(self, rel: str) -> str | None:
        try:
            return self.read_text(rel)
        except SndrError:
            return None

    @property
    def digest(self) -> str:
        if self._digest is None:
            from ..tree import tree_digest

            self._digest = tree_digest((rel, self._bytes[rel]) for rel in self.files()
                                       if self.read_bytes(rel) is not None)
        return self._digest

    def info(self) -> TreeInfo:
        return TreeInfo(spec=self.spec, kind=self.kind, version=self.version, tree_digest=self.digest,
                        files=len(self.files()), ledger=self.has_ledger)


def changed_files(pin: Snapshot, cand: Snapshot) -> tuple[list[str], list[str]]:
    """(candidate files that are new or differ from the pin, pin files gone from the candidate)."""
    pin_files = set(pin.files())
    cand_files = cand.files()
    changed = [r for r in cand_files if r not in pin_files or pin.read_bytes(r) != cand.read_bytes(r)]
    gone = sorted(pin_files - set(cand_files))
    return changed, gone


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


def _all_enabled(patch_set: PatchSet, environ) -> dict:
    env = dict(environ)
    for p in patch_set.patches:
        env["SNDR_ENABLE_" + re.sub(r"[^A-Za-z0-9_]", "_", p.id).upper()] = "1"
    return env


def run_preflight(patch_set: PatchSet, pin, candidate, *, environ=None, only: list[str] | None = None,
                  suggestions: bool = True, config: bool = True, watch=None, check_compile: bool = False,
                  enable_all: bool = False, fail_on: Iterable[str] = ("drift",)) -> PreflightReport:
    """Classify ``patch_set`` on ``pin`` and ``candidate`` (trees or tree specs) and pair the results."""
    from ..tree import open_tree

    environ = dict(os.environ if environ is None else environ)
    if enable_all:
        environ = _all_enabled(patch_set, environ)
    pin_s = pin if isinstance(pin, Snapshot) else Snapshot(open_tree(pin))
    cand_s = candidate if isinstance(candidate, Snapshot) else Snapshot(open_tree(candidate))
    pin_s.load_all()
    cand_s.load_all()
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
        from .suggest import Relocator

        changed, _gone = changed_files(pin_s, cand_s)
        ctx.relocator = Relocator(pin_s.text_or_none, cand_s.text_or_none, changed)

    report = PreflightReport(
        pin=pin_s.info(), candidate=cand_s.info(),
        patch_set=PatchSetInfo(directory=str(patch_set.directory) if patch_set.directory else None,
                               patches=len(patch_set.patches), digest=patch_set.digest()),
    )
    for cr in cand_plan.patches:
        report.patches.append(_patch_entry(ctx, pin_by[cr.id], cr))
    _fill_lists(report)
    report.newly_merged, report.newly_reverted = marker_changes(patch_set, pin_s, cand_s)
    problems = _dedupe_problems([*pin_plan.problems, *cand_plan.problems])
    report.problems = list(problems)
    if config:
        report.config = _config_section(pin_s, cand_s, watch, patch_set, report)
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


def _config_section(pin: Snapshot, cand: Snapshot, watch, patch_set: PatchSet, report: PreflightReport):
    """Configuration drift (sndr.preflight.configdrift) between the two pristine snapshots; None when it cannot be read."""
    from . import configdrift

    if watch is None or isinstance(watch, (str, Path)):
        watch = configdrift.load_watch_config(watch) if watch is not None else configdrift.load_watch_config()
    try:
        drift = configdrift.compare_config(pin, cand, watch, patches=patch_set.patches)
    except SndrError as exc:
        report.problems.extend(exc.problems)
        return None
    return drift


# ---------------------------------------------------------------------------- one patch


def _edit_kind(p: Patch | None, name: str) -> str:
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
    if wants and ee.chain_broken is None and ctx.relocator is not None and patch is not None:
        # A chain-broken anchor is the producer's text: where it "went" means nothing.
        anchor = _search_text(ctx, patch, kind, pe, ce)
        if anchor is not None:
            found = ctx.relocator.suggest(anchor, file, qualname=pe.qualname or None, pin_line=pe.line)
            ee.suggestions = [SuggestionModel(file=s.file, line=s.line, end_line=s.end_line, qualname=s.qualname,
                                              score=s.score, similarity=s.similarity, reasons=list(s.reasons),
                                              text=s.text) for s in found]
    return ee


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
    s.pin_counts = dict(sorted(s.pin_counts.items()))
    s.counts = dict(sorted(s.counts.items()))
    s.transitions = dict(sorted(s.transitions.items(), key=lambda kv: (-kv[1], kv[0])))
    s.actions = dict(sorted(s.actions.items()))
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
        checks: list[tuple[str | None, str, str, str]] = []  # (edit, scope, file, marker)
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


# ============================================================================ rendering


def _rel_source(path: str) -> str:
    try:
        return os.path.relpath(path) if os.path.isabs(path) and not os.path.relpath(path).startswith("..") else path
    except ValueError:
        return path


def _loc(file: str, line: int | None, qual: str | None = None) -> str:
    s = f"{file}:{line}" if line else file
    return s + (f" ({qual})" if qual else "")


def _anchor_text(report_patches: dict[str, Patch], pid: str, e: EditEntry) -> str | None:
    p = report_patches.get(pid)
    if p is None:
        return None
    a = _anchor_of(p, e.name, e.file)
    return a.anchor if a is not None else None


def suggestion_diff(anchor: str, s: SuggestionModel, file: str, pin_line: int | None) -> str:
    a = anchor.splitlines(keepends=True)
    b = s.text.splitlines(keepends=True)
    for seq in (a, b):
        if seq and not seq[-1].endswith("\n"):
            seq[-1] += "\n"
    return "".join(difflib.unified_diff(a, b, fromfile=f"{file}{':' + str(pin_line) if pin_line else ''} (anchor, pin)",
                                        tofile=f"{s.file}:{s.line}-{s.end_line} (candidate)", n=2))


def _md_cell(text: str | None, limit: int = 160) -> str:
    if not text:
        return ""
    t = " ".join(str(text).split())
    if len(t) > limit:
        t = t[: limit - 3] + "..."
    return t.replace("|", "\\|")


def _code(text: str | None) -> str:
    return f"`{text}`" if text else ""


def render_markdown(report: PreflightReport, patch_set: PatchSet | None = None) -> str:
    """The human report: verdict counts, then retire / re-anchor / review / soft-skips."""
    patches = patch_set.by_id if patch_set is not None else {}
    s = report.summary
    out = [f"# sndr bump preflight: {report.pin.version} -> {report.candidate.version}", ""]
    out.append(f"- pin: `{report.pin.spec}` (vllm {report.pin.version}, tree {report.pin.tree_digest[:12]})")
    out.append(f"- candidate: `{report.candidate.spec}` (vllm {report.candidate.version}, "
               f"tree {report.candidate.tree_digest[:12]})")
    out.append(f"- patch set: {report.patch_set.patches} patches ({report.patch_set.digest[:12]}), {s.edits} edits")
    fail = [k for k in s.fail_on if k != "none"]
    out.append(f"- result: exit {s.exit_code} (fail on {', '.join(fail) or 'nothing'}); findings "
               + ", ".join(f"{k} {v}" for k, v in s.findings.items()))
    out += ["", "## Verdicts", "", "| verdict | pin | candidate |", "|---|---:|---:|"]
    for v in Verdict:
        a, b = s.pin_counts.get(v.value, 0), s.counts.get(v.value, 0)
        if a or b:
            out.append(f"| {v.value} | {a} | {b} |")
    out += ["", "| action | patches |", "|---|---:|"]
    for k in ("retire", "reanchor", "review", "soft_skip", "keep", "gated"):
        if s.actions.get(k):
            out.append(f"| {k} | {s.actions[k]} |")
    out += ["", "<details><summary>Transitions</summary>", "", "| pin -> candidate | edits |", "|---|---:|"]
    out += [f"| {k} | {v} |" for k, v in s.transitions.items()]
    out += ["", "</details>", ""]

    by_id = {p.id: p for p in report.patches}
    # -- retire
    out += [f"## Retire ({len(report.retired_upstream)})", ""]
    if report.retired_upstream:
        out += ["Upstream carries these changes on the candidate: retire the patch (or the edit).", "",
                "| patch | edit | file | pin -> candidate | why |", "|---|---|---|---|---|"]
        for r in report.retired_upstream:
            action = by_id[r.patch].action
            out.append(f"| {r.patch}{' (whole patch)' if action == 'retire' else ''} | {r.name} | "
                       f"{_code(_loc(r.file, r.line))} | {r.pin_verdict.value} -> {r.verdict.value} | {_md_cell(r.detail)} |")
    else:
        out.append("Nothing to retire.")
    out.append("")
    # -- re-anchor
    reanchor = [(p, e) for p in report.patches for e in p.edits
                if e.chain_broken is None and (e.required or e.group) and
                (e.verdict in _NEEDS_SUGGESTIONS or (e.verdict == Verdict.GATED and e.verdict_if_enabled in _NEEDS_SUGGESTIONS))]
    out += [f"## Re-anchor ({len(reanchor)})", ""]
    if not reanchor:
        out += ["No genuine anchor drift.", ""]
    for p, e in reanchor:
        out += _md_edit_block(p, e, _anchor_text(patches, p.id, e))
    # -- review
    review = [(p, e) for p in report.patches for e in p.edits
              if e.verdict == Verdict.AMBIGUOUS or e.chain_broken is not None
              or (e.verdict == Verdict.GATED and e.pin_verdict != Verdict.GATED)]
    partly = [p for p in report.patches if p.action == "review" and any("partly merged" in n for n in p.notes)]
    out += [f"## Review ({len(review) + len(partly) + len(report.qualname_changed)})", ""]
    if not (review or partly or report.qualname_changed):
        out += ["Nothing to review.", ""]
    for p, e in review:
        if e.chain_broken is not None:
            out += [f"### {p.id} `{e.name}`: broken by the chain", "", f"{_md_cell(e.chain_broken.message, 400)}. "
                    f"Settle {e.chain_broken.producer} first (re-anchor or retire it), then re-derive this anchor "
                    "from its new text.", ""]
        elif e.verdict == Verdict.AMBIGUOUS:
            out += [f"### {p.id} `{e.name}`: ambiguous in `{e.file}`", "", _md_cell(e.reason, 400), ""]
            out += [f"- {_code(_loc(l.file, l.line, l.qualname))}" for l in e.locations] + [""]
        else:
            ext = f"; with the range widened it is **{e.verdict_if_enabled.value}**" if e.verdict_if_enabled else ""
            out += [f"### {p.id} `{e.name}`: turned off on the candidate", "", f"{_md_cell(p.reason, 300)}{ext}.", ""]
            if e.verdict_if_enabled in _NEEDS_SUGGESTIONS:
                out += _md_suggestions(e, _anchor_text(patches, p.id, e))
    for p in partly:
        out += [f"### {p.id}: partly merged upstream", ""] + [f"- {n}" for n in p.notes] + [""]
    if report.qualname_changed:
        out += ["### Still applies, in another scope", "", "| patch | edit | pin | candidate |", "|---|---|---|---|"]
        for r in report.qualname_changed:
            out.append(f"| {r.patch} | {r.name} | {_code(_loc(r.file, r.pin_line, r.pin_qualname))} | "
                       f"{_code(_loc(r.file, r.line, r.qualname))} |")
        out.append("")
    # -- soft skips
    out += [f"## Soft-skips ({len(report.optional_absent)})", ""]
    if report.optional_absent:
        out += ["Optional edits that matched on the pin and would silently not apply on the candidate.", ""]
        for r in report.optional_absent:
            p = by_id[r.patch]
            e = next(x for x in p.edits if x.name == r.name)
            out += _md_edit_block(p, e, _anchor_text(patches, p.id, e), level="###")
    else:
        out += ["None.", ""]
    # -- markers
    out += [f"## Upstream markers ({len(report.newly_merged)} newly merged, {len(report.newly_reverted)} newly reverted)", ""]
    for title, rows in (("Newly merged", report.newly_merged), ("Newly reverted", report.newly_reverted)):
        if rows:
            out += [f"**{title}**", "", "| patch | edit | file | marker |", "|---|---|---|---|"]
            out += [f"| {m.patch} | {m.edit or '(' + m.scope + ')'} | {_code(_loc(m.file, m.line))} | "
                    f"{_code(_md_cell(m.marker, 80))} |" for m in rows]
            out.append("")
    if not (report.newly_merged or report.newly_reverted):
        out += ["No marker changed between the two trees.", ""]
    # -- config
    if report.config is not None:
        try:
            from .configdrift import render_markdown as config_md

            out += [config_md(report.config)]
        except Exception as exc:  # pragma: no cover - a render bug must not hide the patch report
            out += ["## Configuration drift", "", f"(could not render: {exc})", ""]
    if report.problems:
        out += ["## Problems", ""]
        for pr in report.problems:
            out.append(f"- {_code(_loc(pr.file or '', pr.line))} {pr.patch or ''}: {_md_cell(pr.message, 300)} ({pr.code})")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _md_edit_block(p: PatchEntry, e: EditEntry, anchor: str | None, level: str = "###") -> list[str]:
    verdict = e.verdict.value if e.verdict != Verdict.GATED else f"gated (would be {e.verdict_if_enabled.value})"
    out = [f"{level} {p.id} `{e.name}`: {verdict} in `{e.file}`", ""]
    where = _loc(e.file, e.pin_line, e.pin_qualname)
    out += [f"{p.title} - on the pin at {_code(where)}. {_md_cell(e.reason, 300)}", ""]
    return out + _md_suggestions(e, anchor)


def _no_suggestion_text(e: EditEntry) -> str:
    if e.kind == "runtime" and e.line:
        return (f"The target is still at {e.file}:{e.line} ({e.qualname or 'module'}); its signature or source "
                "changed: review the replacement.")
    return "No relocation candidate found: the code was likely deleted upstream."


def _md_suggestions(e: EditEntry, anchor: str | None) -> list[str]:
    if not e.suggestions:
        return [_no_suggestion_text(e), ""]
    out = ["| # | where | qualname | score | why |", "|---:|---|---|---:|---|"]
    for i, sg in enumerate(e.suggestions, 1):
        out.append(f"| {i} | {_code(f'{sg.file}:{sg.line}-{sg.end_line}')} | {_code(sg.qualname)} | {sg.score} | "
                   f"{_md_cell(', '.join(sg.reasons))} |")
    out.append("")
    if anchor is not None:
        diff = suggestion_diff(anchor, e.suggestions[0], e.file, e.pin_line)
        if diff:
            out += ["Old anchor vs the best candidate (a suggestion; never applied):", "", "```diff", diff.rstrip("\n"),
                    "```", ""]
        else:
            out += ["The best candidate is the anchor's text, unchanged: only its place moved.", ""]
    return out


_STYLE = {"applies": "cyan", "applied": "green", "merged": "blue", "drifted": "red", "ambiguous": "red",
          "optional_absent": "yellow", "file_missing": "red", "gated": "dim"}


def render_terminal(report: PreflightReport, console=None, verbose: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console(highlight=False, soft_wrap=True)
    s = report.summary
    console.print(f"[bold]sndr preflight[/bold] {report.pin.version} -> {report.candidate.version}  "
                  f"({s.patches} patches, {s.edits} edits)")
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    t.add_column("verdict")
    t.add_column("pin", justify="right")
    t.add_column("candidate", justify="right")
    for v in Verdict:
        a, b = s.pin_counts.get(v.value, 0), s.counts.get(v.value, 0)
        if a or b:
            t.add_row(Text(v.value, style=_STYLE.get(v.value, "")), str(a), str(b))
    console.print(t)
    by_id = {p.id: p for p in report.patches}

    def head(title: str, n: int, style: str) -> None:
        console.print(Text(f"\n{title} ({n})", style=f"bold {style}"))

    head("retire", len(report.retired_upstream), "blue")
    for r in report.retired_upstream:
        console.print(Text(f"  {r.patch}/{r.name}  {_loc(r.file, r.line)}  {r.detail}"))
    drifted = [*report.genuine_anchor_drift, *report.file_missing]
    head("re-anchor", len(drifted), "red")
    for r in drifted:
        e = next(x for x in by_id[r.patch].edits if x.name == r.name)
        console.print(Text(f"  {r.patch}/{r.name}  {r.verdict.value}  pin {_loc(r.file, r.pin_line, r.pin_qualname)}"))
        for sg in e.suggestions:
            console.print(Text(f"      -> {sg.file}:{sg.line}-{sg.end_line} {sg.qualname}  score {sg.score}"
                               f"  ({', '.join(sg.reasons)})", style="dim"))
        if not e.suggestions:
            console.print(Text(f"      {_no_suggestion_text(e)}", style="dim"))
    review = [*report.ambiguous, *report.chain_broken, *report.newly_gated]
    head("review", len(review), "yellow")
    for r in review:
        console.print(Text(f"  {r.patch}/{r.name}  {r.pin_verdict.value}->{r.verdict.value}  {_md_cell(r.detail, 200)}"))
    head("soft-skips", len(report.optional_absent), "yellow")
    for r in report.optional_absent:
        console.print(Text(f"  {r.patch}/{r.name}  pin {_loc(r.file, r.pin_line, r.pin_qualname)}  {r.detail}"))
    if report.newly_merged or report.newly_reverted:
        head("markers", len(report.newly_merged) + len(report.newly_reverted), "blue")
        for m in report.newly_merged:
            console.print(Text(f"  newly merged   {m.patch}{'/' + m.edit if m.edit else ''}  {_loc(m.file, m.line)}"))
        for m in report.newly_reverted:
            console.print(Text(f"  newly reverted {m.patch}{'/' + m.edit if m.edit else ''}  {_loc(m.file, m.line)}"))
    if verbose and report.qualname_changed:
        head("scope changed", len(report.qualname_changed), "cyan")
        for r in report.qualname_changed:
            console.print(Text(f"  {r.patch}/{r.name}  {r.detail}"))
    if report.config is not None:
        try:
            from .configdrift import render_terminal as config_term

            drift = report.config
            if verbose or drift.has_attention or drift.runtime_broken:
                config_term(drift, console=console)
            else:  # the tables are long; the Markdown report and -v carry them
                parts = [f"{name} {len(sec.changed)} changed, {len(sec.added)} added, {len(sec.removed)} removed"
                         for name, sec in (("dependencies", drift.dependencies), ("env", drift.env),
                                           ("engine args", drift.engine_args)) if sec.available]
                head("configuration drift", sum(1 for _ in drift.items()), "cyan")
                console.print(Text("  " + "; ".join(parts) + " (none watched; -v or --markdown for the tables)"))
        except Exception as exc:  # pragma: no cover
            console.print(f"configuration drift: could not render ({exc})")
    for pr in report.problems:
        console.print(Text(f"error {_loc(pr.file or '', pr.line)} {pr.patch or ''}: {pr.message} ({pr.code})", style="red"))
    verdict = "clean" if s.exit_code == 0 else "FINDINGS"
    console.print(f"\n[bold]{verdict}[/bold] (exit {s.exit_code}; fail on {', '.join(s.fail_on)}): "
                  + ", ".join(f"{k} {v}" for k, v in s.findings.items()))


# ---------------------------------------------------------------------------- SARIF and GitHub annotations

_RULES = {
    "anchor-drift": ("error", "A required anchor matches on the pin but not on the candidate"),
    "file-missing": ("error", "The target file is gone on the candidate"),
    "chain-broken": ("error", "The anchor lies in text another patch produces, and that patch is gone on the candidate"),
    "ambiguous": ("warning", "The anchor occurs more than once on the candidate"),
    "retire": ("note", "Upstream carries the change on the candidate: retire it"),
    "soft-skip": ("warning", "An optional edit matched on the pin and silently would not on the candidate"),
    "newly-gated": ("warning", "The patch's vllm range turns it off on the candidate"),
}


def _findings_for_annotation(report: PreflightReport):
    """(rule, patch, edit name, edit file, message) for every reportable edit."""
    def entry(r: EditRef) -> EditEntry | None:
        return next((x for p in report.patches if p.id == r.patch for x in p.edits if x.name == r.name), None)

    def best(r: EditRef) -> str:
        e = entry(r)
        if e is not None and e.suggestions:
            sg = e.suggestions[0]
            return f"; best candidate {sg.file}:{sg.line} ({sg.qualname or 'module'}, score {sg.score})"
        if e is not None and e.kind == "runtime" and e.line:
            return f"; the target is still at {e.file}:{e.line}"
        return "; no relocation candidate found"

    for r in report.genuine_anchor_drift:
        e = entry(r)
        what = f"runtime target changed ({r.detail})" if e is not None and e.kind == "runtime" else "anchor drifted"
        yield "anchor-drift", r, f"{r.patch}/{r.name}: {what} in {r.file} on {report.candidate.version}{best(r)}"
    for r in report.file_missing:
        yield "file-missing", r, f"{r.patch}/{r.name}: {r.file} is gone on {report.candidate.version}{best(r)}"
    for r in report.chain_broken:
        yield "chain-broken", r, r.detail
    for r in report.ambiguous:
        yield "ambiguous", r, f"{r.patch}/{r.name}: {r.detail}"
    for r in report.retired_upstream:
        yield "retire", r, f"{r.patch}/{r.name}: upstream carries it on {report.candidate.version} ({r.detail})"
    for r in report.optional_absent:
        yield "soft-skip", r, f"{r.patch}/{r.name}: optional edit would silently not apply on {report.candidate.version}{best(r)}"
    for r in report.newly_gated:
        yield "newly-gated", r, f"{r.patch}/{r.name}: {r.detail}"


_TOML_NAME = re.compile(r"""^\s*name\s*=\s*["']([^"']+)["']""")


def _toml_line(source: str, edit: str) -> int:
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError:
        return 1
    for i, line in enumerate(text.splitlines(), 1):
        m = _TOML_NAME.match(line)
        if m and m.group(1) == edit:
            return i
    return 1


def render_sarif(report: PreflightReport) -> dict:
    sources = {p.id: p.source for p in report.patches}
    results = []
    for rule, r, msg in _findings_for_annotation(report):
        src = sources.get(r.patch) or r.patch
        result = {
            "ruleId": rule,
            "level": _RULES[rule][0],
            "message": {"text": msg},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": src},
                                                "region": {"startLine": _toml_line(src, r.name)}}}],
            "relatedLocations": [{"id": 1, "message": {"text": f"vLLM {report.pin.version} (pin)"},
                                  "physicalLocation": {"artifactLocation": {"uri": r.file},
                                                       "region": {"startLine": r.pin_line or 1}}}],
            "partialFingerprints": {"sndrEdit": f"{r.patch}/{r.name}"},
        }
        results.append(result)
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "sndr-preflight", "informationUri": "https://github.com/",
                                "rules": [{"id": k, "shortDescription": {"text": v[1]},
                                           "defaultConfiguration": {"level": v[0]}} for k, v in _RULES.items()]}},
            "properties": {"pin": report.pin.version, "candidate": report.candidate.version},
            "results": results,
        }],
    }


def _gh_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def github_annotations(report: PreflightReport) -> list[str]:
    """GitHub workflow commands (``::error file=...,line=...::msg``), one per finding."""
    level = {"error": "error", "warning": "warning", "note": "notice"}
    sources = {p.id: p.source for p in report.patches}
    out = []
    for rule, r, msg in _findings_for_annotation(report):
        src = sources.get(r.patch) or r.patch
        props = f"file={_gh_escape(src, True)},line={_toml_line(src, r.name)},title={_gh_escape('sndr ' + rule, True)}"
        out.append(f"::{level[_RULES[rule][0]]} {props}::{_gh_escape(msg)}")
    return out


# ============================================================================ CLI


def _parse_fail_on(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or ["drift"]:
        for part in v.split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part not in FAIL_ON_CHOICES:
                raise bad_input("bad_fail_on", f"--fail-on {part!r}: choose from {', '.join(FAIL_ON_CHOICES)}",
                                key="--fail-on")
            out.append(part)
    return out or ["drift"]


def _write(dest: str, text: str) -> None:
    if dest == "-":
        sys.stdout.write(text)
        return
    p = Path(dest)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sndr preflight",
                                 description="Classify the patch set on a pin and a candidate vLLM tree.")
    ap.add_argument("--patches", metavar="DIR", help="patch directory (default: the shipped set)")
    ap.add_argument("--pin", required=True, metavar="TREE", help="dir, wheel, vllm==X, git:REPO@REV or installed")
    ap.add_argument("--candidate", required=True, metavar="TREE")
    ap.add_argument("--json", metavar="OUT", help="write the JSON report ('-' for stdout)")
    ap.add_argument("--markdown", metavar="OUT", help="write the Markdown report ('-' for stdout)")
    ap.add_argument("--sarif", metavar="OUT", help="write SARIF 2.1.0 ('-' for stdout)")
    ap.add_argument("--github", action="store_true", help="print GitHub workflow annotations")
    ap.add_argument("--fail-on", action="append", metavar="CLASS",
                    help="drift (default), ambiguous, any, config, none; repeat or comma-separate")
    ap.add_argument("--watch", metavar="FILE", help="watch config for the configuration-drift section (default: sndr.toml/pyproject.toml found upward)")
    ap.add_argument("--no-config", action="store_true", help="skip the configuration-drift section")
    ap.add_argument("--no-suggestions", action="store_true", help="skip relocation suggestions")
    ap.add_argument("--only", metavar="IDS", help="comma-separated patch ids (plus what they require)")
    ap.add_argument("--enable-all", action="store_true", help="classify default-off patches too (SNDR_ENABLE_<ID>=1 for all)")
    ap.add_argument("--check-compile", action="store_true", help="also compile every patched file of both plans")
    ap.add_argument("-q", "--quiet", action="store_true", help="no terminal report")
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap


def cli_main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code == 0 else EXIT_BAD_INPUT
    try:
        fail_on = _parse_fail_on(args.fail_on)
        patch_set = load_patch_set(args.patches)
        only = [i.strip() for i in args.only.split(",") if i.strip()] if args.only else None
        t0 = time.perf_counter()
        report = run_preflight(patch_set, args.pin, args.candidate, only=only, suggestions=not args.no_suggestions,
                               config=not args.no_config, watch=args.watch, check_compile=args.check_compile,
                               enable_all=args.enable_all, fail_on=fail_on)
        elapsed = time.perf_counter() - t0
        if args.json:
            _write(args.json, report.model_dump_json(indent=2) + "\n")
        if args.markdown:
            _write(args.markdown, render_markdown(report, patch_set))
        if args.sarif:
            _write(args.sarif, json.dumps(render_sarif(report), indent=2) + "\n")
        if args.github:
            for line in github_annotations(report):
                print(line)
        to_stdout = "-" in (args.json, args.markdown, args.sarif)
        if not args.quiet and not to_stdout:
            from rich.console import Console

            render_terminal(report, Console(highlight=False, soft_wrap=True), verbose=args.verbose)
            if args.verbose:
                print(f"({elapsed:.2f}s)")
        return report.summary.exit_code
    except SndrError as exc:
        for p in exc.problems:
            print(f"sndr preflight: {p.render()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception:  # pragma: no cover - exit code 3 is the contract for bugs
        import traceback

        traceback.print_exc()
        print("sndr preflight: internal error (exit 3); please report it with the traceback above", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli_main())
