"""The data model: patch files, verdicts, ledgers and reports (pydantic v2).

The patch file format is a contract (docs/format.md): unknown keys are
errors, and every validation error names the file and the key.
"""

from __future__ import annotations

import enum
import hashlib
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator

from .errors import Problem  # errors are values: reports carry the same dataclass
from .state import canonical_json, read_only_entry, relpath_problem

ID_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*$"
# A runtime target or replacement: ``package.module:Qual.name``.
DOTTED_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


class Verdict(str, enum.Enum):  # noqa: UP042 - StrEnum changes str(member) ("Verdict.X" -> "x"): a behaviour change
    """What one edit is on one tree. One classifier produces these everywhere."""

    APPLIES = "applies"  # anchor found exactly once: the edit can be applied
    APPLIED = "applied"  # replacement present, anchor not (outside the replacement)
    MERGED = "merged"  # a merged marker is present: upstream carries the change
    DRIFTED = "drifted"  # required anchor not found
    AMBIGUOUS = "ambiguous"  # anchor found two or more times
    OPTIONAL_ABSENT = "optional_absent"  # optional anchor not found
    FILE_MISSING = "file_missing"  # target file does not exist
    GATED = "gated"  # patch not enabled on this tree (reason says why)
    CONFLICT = "conflict"  # an earlier patch of the set consumed the anchor (ordering, not drift)

    @property
    def ok(self) -> bool:
        return self in _OK_VERDICTS


_OK_VERDICTS = {Verdict.APPLIES, Verdict.APPLIED, Verdict.MERGED, Verdict.OPTIONAL_ABSENT, Verdict.GATED}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _check_relpath(path: str) -> str:
    why = relpath_problem(path)
    if why is not None:
        raise ValueError(why)
    return path


class Edit(Strict):
    """Anchor -> replacement, matched exactly and exactly once."""

    name: str = Field(pattern=ID_PATTERN)
    anchor: str
    replacement: str
    required: StrictBool = True
    group: str | None = Field(default=None, pattern=ID_PATTERN, description="name of a group declared in the patch's [groups] table")
    merged_markers: list[str] = Field(default_factory=list)
    description: str = ""

    @field_validator("anchor")
    @classmethod
    def _anchor_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("anchor is empty or whitespace only; an anchor must be text that occurs exactly once in the file")
        return v

    @field_validator("replacement")
    @classmethod
    def _replacement_not_empty(cls, v: str) -> str:
        if not v:
            raise ValueError("replacement is empty; include one line of context so the edit stays recognisable once applied")
        return v

    @field_validator("merged_markers")
    @classmethod
    def _markers_not_blank(cls, v: list[str]) -> list[str]:
        for m in v:
            if not m.strip():
                raise ValueError("a merged marker must not be empty or whitespace")
        return v

    @model_validator(mode="after")
    def _anchor_differs(self) -> Edit:
        if self.anchor == self.replacement:
            raise ValueError(f"edit {self.name!r}: anchor equals replacement; the edit would change nothing")
        return self


class FileEdits(Strict):
    """The edits of one patch on one file, or a file the patch creates."""

    path: str
    edits: list[Edit] = Field(default_factory=list)
    create: str | None = Field(default=None, description="full content of a file this patch creates; exclusive with edits")
    merged_markers: list[str] = Field(default_factory=list)

    @field_validator("path")
    @classmethod
    def _path_ok(cls, v: str) -> str:
        return _check_relpath(v)

    @model_validator(mode="after")
    def _edits_or_create(self) -> FileEdits:
        if self.create is not None and self.edits:
            raise ValueError(f"{self.path}: 'create' and 'edits' are exclusive")
        if self.create is None and not self.edits:
            raise ValueError(f"{self.path}: a file entry needs 'edits' or 'create'")
        if self.create is not None and not self.create:
            raise ValueError(f"{self.path}: 'create' content is empty")
        return self


class LocatedError(ValueError):
    """A cross-field check's ValueError that names the key it is about (``loc``, pydantic's form), so the
    loader can point at that key's line; a model validator's own errors carry only the model's location."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


class RuntimeEdit(Strict):
    """Replace an attribute at import time (kind = runtime or plugin)."""

    name: str = Field(pattern=ID_PATTERN)
    target: str = Field(pattern=DOTTED_PATTERN, description="module:Qual.name to replace, e.g. vllm.v1.core.sched.scheduler:Scheduler.schedule")
    replacement: str = Field(pattern=DOTTED_PATTERN, description="module:attr of the new object; the module must live in sndr or an installed patch pack")
    required: StrictBool = True
    signature: str | None = Field(default=None, description="expected parameter list of the target in sndr's normalised form, e.g. '(self, scheduler_output, *, k=)' (names and kinds only; see sndr.binding.normalise_signature)")
    source_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    chain: StrictBool = Field(default=False, description="allow another runtime edit on the same target (wraps the previous one)")
    wrap: StrictBool = Field(default=False, description="call replacement(original) and install what it returns")
    description: str = ""


class GroupMode(str, enum.Enum):  # noqa: UP042 - as Verdict: StrEnum would change str(member)
    ONE_OF = "one_of"  # exactly one member applies (anchor variants)
    ANY_OF = "any_of"  # at least one member applies


class Patch(Strict):
    id: str = Field(pattern=ID_PATTERN)
    title: str = Field(min_length=1)
    kind: Literal["text", "runtime", "plugin"] = "text"
    lifecycle: Literal["active", "experimental", "retired"] = "active"
    default: StrictBool = True
    vllm: str = Field(default="", description="PEP 440 specifier the tree's vLLM version must satisfy; empty = any")
    upstream: list[str] = Field(default_factory=list)
    requires: list[str] = Field(default_factory=list, description="patches this one needs: applied first, and "
                                "this one is gated requires_gated when one of them is not enabled")
    after: list[str] = Field(default_factory=list, description="patches this one is applied after when both are "
                             "enabled; never enables or disables anything")
    conflicts: list[str] = Field(default_factory=list)
    on_failure: Literal["fail", "skip"] = Field(default="fail", description="fail: a failing edit refuses the whole "
                                                "set; skip: the patch is left out whole, listed, and the rest applies "
                                                "(a warning: exit 0 when every failure is a declared skip)")
    when: dict[str, str | list[str]] | None = Field(default=None, description="applicability predicates "
                                                    "(sndr.profile.KEYS): gated when_mismatch / when_unknown "
                                                    "unless every key matches the deployment profile",
                                                    json_schema_extra=lambda s: s.update(_when_schema()))
    merged_markers: list[str] = Field(default_factory=list)
    description: str = ""
    groups: dict[str, GroupMode] = Field(default_factory=dict)
    files: list[FileEdits] = Field(default_factory=list)
    runtime: list[RuntimeEdit] = Field(default_factory=list)
    module: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
                               description="plugin patches: the module that ships the code")

    @field_validator("vllm")
    @classmethod
    def _spec_ok(cls, v: str) -> str:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(v)
        except InvalidSpecifier as exc:
            raise ValueError(f"not a PEP 440 specifier: {v!r} ({exc})") from None
        return v

    @field_validator("requires", "after", "conflicts")
    @classmethod
    def _ids_ok(cls, v: list[str]) -> list[str]:
        for i in v:
            if not re.match(ID_PATTERN, i):
                raise ValueError(f"{i!r} is not a patch id")
        if len(set(v)) != len(v):
            raise ValueError(f"{sorted({i for i in v if v.count(i) > 1})[0]!r} is listed twice")
        return v

    @field_validator("when", mode="before")
    @classmethod
    def _when_ok(cls, v):
        from .profile import check_when

        return None if v is None else check_when(v)

    @model_validator(mode="after")
    def _consistent(self) -> Patch:
        if not self.files and not self.runtime and not self.module:
            raise ValueError("a patch needs 'files' (text), 'runtime' or 'module' (plugin)")
        if self.kind == "text" and not self.files:
            raise LocatedError(("kind",), "kind = 'text' needs at least one [[files]] entry")
        if self.kind == "runtime" and not self.runtime:
            raise LocatedError(("kind",), "kind = 'runtime' needs at least one [[runtime]] entry")
        if self.kind == "plugin" and not self.module:
            raise LocatedError(("kind",), "kind = 'plugin' needs 'module'")
        for key in ("requires", "conflicts", "after"):
            if self.id in getattr(self, key):
                raise LocatedError((key,), f"{self.id} cannot require, follow or conflict with itself")
        both = sorted(set(self.after) & set(self.requires))
        if both:
            raise LocatedError(("after",), f"{both[0]} is in both requires and after; requires already orders it first")
        seen: set[str] = set()
        named = [(("files", i, "edits", j, "name"), e.name) for i, f in enumerate(self.files)
                 for j, e in enumerate(f.edits)] + [(("runtime", k, "name"), r.name) for k, r in enumerate(self.runtime)]
        for loc, name in named:
            if name in seen:
                raise LocatedError(loc, f"edit name {name!r} is used twice in patch {self.id}")
            seen.add(name)
        firsts: set[str] = set()
        for i, f in enumerate(self.files):
            if f.path in firsts:
                raise LocatedError(("files", i, "path"),
                                   f"file {f.path!r} is listed twice; put all its edits in one [[files]] entry")
            firsts.add(f.path)
        members: dict[str, int] = {g: 0 for g in self.groups}
        for i, f in enumerate(self.files):
            for j, e in enumerate(f.edits):
                if e.group is not None:
                    if e.group not in self.groups:
                        raise LocatedError(("files", i, "edits", j, "group"),
                                           f"edit {e.name!r} names group {e.group!r}, which is not declared in [groups]")
                    members[e.group] += 1
        for g, n in members.items():
            if n == 0:
                raise LocatedError(("groups", g), f"group {g!r} has no member edits")
        return self

    def edits(self):
        for f in self.files:
            for e in f.edits:
                yield f, e

    def digest(self) -> str:
        return hashlib.sha256(canonical_json(self.model_dump(mode="json")).encode()).hexdigest()


def _when_schema() -> dict:
    from .profile import when_schema

    return {"anyOf": [when_schema(), {"type": "null"}]}


# ----------------------------------------------------------------------------- reports


class Location(BaseModel):
    file: str
    line: int
    offset: int
    qualname: str = ""


class EditResult(BaseModel):
    patch: str
    file: str
    name: str
    verdict: Verdict
    required: StrictBool = True
    group: str | None = None
    reason: str = ""
    reason_code: str = ""
    line: int | None = None
    offset: int | None = None
    qualname: str | None = None
    locations: list[Location] = Field(default_factory=list, description="every occurrence, for ambiguous anchors")
    chained_from: list[str] = Field(default_factory=list, description="patch ids ordered before this one whose changed "
                              "bytes this anchor holds (re-emitted context is not theirs)")
    conflict_with: list[str] = Field(default_factory=list, description="conflict/overlap: the patches that changed "
                                     "bytes of this anchor")
    hint: str = ""
    binding: StrictBool = Field(default=False, description="a runtime binding ([[runtime]]), not a text edit: nothing "
                                "on disk holds it; each vLLM process installs it at startup")


#: A patch's outcome in a report.
PatchStatus = Literal["applies", "applied", "merged", "gated", "failed", "partial", "nothing_to_do", "left_out"]
#: What a report is of.
ReportMode = Literal["apply", "dry-run", "verify", "revert"]


class PatchResult(BaseModel):
    id: str
    title: str = ""
    kind: str = "text"
    status: PatchStatus = "applies"
    reason: str = ""
    reason_code: str = ""
    on_failure: Literal["fail", "skip"] = "fail"
    edits: list[EditResult] = Field(default_factory=list)

    def applies_at_startup_only(self) -> bool:
        """It ``applies``, and every edit that applies is a runtime binding: nothing is left to write on disk
        (each vLLM process installs the bindings at startup), so the tree is not short of it."""
        return self.status == "applies" and all(e.binding for e in self.edits if e.verdict == Verdict.APPLIES)


class LeftOut(BaseModel):
    """A patch left out whole (on_failure = "skip", --keep-going, or a patch it requires was left out)."""

    id: str
    reason: str
    code: str = Field(description="the failure that left it out (edit_drifted, conflict, ..., or requires_left_out)")
    by: Literal["on_failure", "keep_going", "requires"] = Field(
        description="on_failure: its own policy allowed it; keep_going: --keep-going overrode on_failure = fail; "
                    "requires: a patch it requires was left out")
    on_failure: Literal["fail", "skip"] = "fail"

    @property
    def allowed(self) -> bool:
        """Left out as the patch's own ``on_failure = "skip"`` allows: a warning (listed, exit 0), not a finding.
        A patch left out against ``on_failure = "fail"`` (by ``--keep-going``) is a finding (exit 1)."""
        return self.on_failure == "skip"

    def describe(self) -> str:
        return f"{self.id} ({self.code}, {self.by}: {self.reason})"


class LedgerFile(BaseModel):
    pristine_sha256: str
    patched_sha256: str
    patches: list[str]
    created: bool = Field(default=False, description="the file did not exist before sndr created it")

    @property
    def read_only(self) -> bool:
        """Read by the set, written by none of its patches (:func:`sndr.state.read_only_entry`)."""
        return read_only_entry(self)


class Ledger(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal[1] = 1
    patch_set_digest: str
    patches: list[str] = Field(description="ids of the patches the set enabled, in apply order")
    vllm_version: str = ""
    files: dict[str, LedgerFile] = Field(default_factory=dict)
    results: dict[str, str] = Field(default_factory=dict, description="patch id -> status once the ledger was written")
    counts: dict[str, int] = Field(default_factory=dict, description="edit verdict counts once the ledger was written")
    left_out: dict[str, LeftOut] = Field(default_factory=dict, description="enabled patches left out whole, and why")
    checksum: str = Field(default="", description="sha256 of the ledger without this field; catches hand edits")

    @field_validator("files")
    @classmethod
    def _files_inside_the_tree(cls, v: dict[str, LedgerFile]) -> dict[str, LedgerFile]:
        # A ledger (even with a valid checksum) names only relative paths inside the tree: no NUL, no '..'.
        for rel in v:
            _check_relpath(rel)
        return v

    def compute_checksum(self) -> str:
        body = self.model_dump(mode="json", exclude={"checksum"})
        return hashlib.sha256(canonical_json(body).encode()).hexdigest()

    def sealed(self) -> Ledger:
        return self.model_copy(update={"checksum": self.compute_checksum()})


class Report(BaseModel):
    """What ``python -m sndr.apply`` did (or would do) on one tree."""

    tool: str = "sndr"
    mode: ReportMode
    tree: str
    vllm_version: str = ""
    patch_set_digest: str = ""
    ok: bool
    exit_code: int
    counts: dict[str, int] = Field(default_factory=dict)
    patches: list[PatchResult] = Field(default_factory=list)
    files_written: list[str] = Field(default_factory=list)
    left_out: list[LeftOut] = Field(default_factory=list, description="enabled patches left out whole, and why")
    problems: list[Problem] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class AttestationRecord(BaseModel):
    """The shape of a per-process attestation record (``sndr.startup.attest``; written by
    ``register()`` as a plain dict, read and validated here by ``sndr status`` only, strict: no
    coercion, so a pid ``"12"`` or ``true`` is not an int). Extra keys are allowed: the record
    carries more (runtime outcomes, the profile) than status trusts."""

    model_config = ConfigDict(extra="allow", strict=True)

    format: Literal[2]  # sndr.startup.attest.FORMAT
    pid: int = Field(gt=0)
    ppid: int = Field(ge=0)
    start: float = Field(gt=0)
    updated: float = Field(gt=0)
    role: str
    process_name: str
    forked_from: int | None
    mode: Literal["disk", "memory", "none"]
    tree: str | None
    vllm_version: str
    patch_set_digest: str
    ledger_digest: str | None
    enabled: list[str]
    gated: list[str]
    gate_reasons: dict[str, str]
    counts: dict[str, int]
    files: dict[str, str | None]
    missing_required: list[str]
    problems: list[str]


def attestation_problem(rec: dict) -> str | None:
    """None when ``rec`` is a valid :class:`AttestationRecord`; else its first error, located."""
    try:
        AttestationRecord.model_validate(rec, strict=True)
    except ValidationError as exc:  # every error named, never "(+N more)"
        return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'record'}: {err['msg']}" for err in exc.errors())
    return None
