"""The preflight report's contract: the pydantic models ``--json`` writes (docs/format.md).

``python -m sndr schema preflight`` prints their JSON Schema. Nothing here
reads a tree or renders text: :mod:`.analysis` fills these models,
:mod:`.render` and :mod:`.annotations` print them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import Problem
from ..model import Location, Verdict
from .configmodels import ConfigDrift

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


Confidence = Literal["high", "medium", "low"]
EditKind = Literal["text", "create", "runtime"]
MarkerScope = Literal["patch", "file", "edit"]


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
    confidence: Confidence = Field(default="low", description="high / medium / low from calibrated thresholds "
                                   "(docs/preflight-calibration.md); low is a hint, never a re-anchor target")


class HopStep(_Model):
    """Where an anchor was on one release of a ``--via`` chain."""

    version: str
    file: str
    line: int | None = None
    qualname: str | None = None
    how: Literal["pin", "exact", "relocated", "lost"] = Field(
        description="pin: the start; exact: the text still there; relocated: best suggestion of the hop; "
                    "lost: no confident match on this release")
    score: int | None = None
    confidence: Confidence | None = None


class ChainBreak(_Model):
    producer: str = Field(description="patch id whose replacement text the anchor lies in (on the pin)")
    producer_edit: str | None = None
    producer_verdict: str = Field(description="the producer's (edit or patch) state on the candidate")
    message: str = ""


class EditEntry(_Model):
    file: str
    name: str
    kind: EditKind = "text"
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
    confidence: Confidence | None = Field(
        default=None, description="the best suggestion's class; 'low' means no confident match (likely removed or "
                                  "rewritten upstream); None when no suggestion was asked for")
    path: list[HopStep] = Field(default_factory=list, description="--via: where the anchor was on each release")
    path_source: Literal["", "direct", "via"] = Field(
        default="", description="which search the suggestions come from when --via ran: the hop chain or the direct pair")


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
    scope: MarkerScope
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
    confidence: dict[str, int] = Field(default_factory=dict, description="edits with suggestions per confidence class "
                                       "of the best one")
    via: list[str] = Field(default_factory=list, description="releases between pin and candidate that --via followed")
    fail_on: list[str] = Field(default_factory=list)
    exit_code: int = 0


PerfKind = Literal["bound", "callee", "caller", "kernel_file", "layer_file", "gained", "lost"]


class PerfChange(_Model):
    """One change, pin -> candidate, in the upstream code a performance plugin replaces or competes with."""

    kind: PerfKind = Field(description="bound: the target's own function; callee: a method the wrapped method "
                                       "calls; caller: a layer function that calls the target; kernel_file: the "
                                       "file defining an imported target; layer_file: the layer module as a whole; "
                                       "gained/lost: a kernel the layer imports on one side only")
    file: str
    name: str = ""
    added: int = 0
    removed: int = 0
    detail: str = ""


class PerfPlugin(_Model):
    """A plugin patch's entry in the performance section (sndr.preflight.perf)."""

    id: str
    title: str = ""
    enabled_by_default: bool = False
    verdict: Literal["unchanged", "review", "re-measure"] = Field(
        description="re-measure: vLLM's code it replaces or competes with (bound functions, their kernel files, "
                    "kernels gained or lost) changed; pin advance then needs --perf-ref (a benchmark against the "
                    "candidate) or a recorded waiver. review: only the code around them (callers, callees) changed")
    compared: list[str] = Field(default_factory=list, description="what was compared, pin against candidate")
    changes: list[PerfChange] = Field(default_factory=list)


class PreflightReport(_Model):
    """``python -m sndr preflight --json``: every edit's verdict (docs/format.md, "Verdicts of one edit")
    on the pin and on the candidate, paired."""

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
    performance: list[PerfPlugin] = Field(
        default_factory=list, description="performance plugins: did the upstream code each replaces or competes "
                                          "with change (verdict re-measure)?")
    config: ConfigDrift | None = Field(default=None, description="configuration drift (dependencies, env defaults, "
                                       "engine args, runtime targets), unless --no-config")
    problems: list[Problem] = Field(default_factory=list)
    warnings: list[Problem] = Field(
        default_factory=list, description="what the run is not, said on stderr too: same_version (pin and candidate "
                                          "are two builds of one vLLM version, not a bump). The same tree as both is "
                                          "refused (same_tree, exit 2)")


