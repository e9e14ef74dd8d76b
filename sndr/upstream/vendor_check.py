"""What a vendoring produced, and the plan checks it must pass before anything is written.

:class:`EditReport` says how each hunk became an edit; :class:`VendorResult`
is what :func:`sndr.upstream.vendor.vendor_diff` returns. :func:`verify` plans
the new patch on the pin (it must reproduce the diff's post-image byte for
byte) and on that post-image (every edit must read ``applied`` or ``merged``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import EXIT_OK, Problem
from ..load import PatchSet
from ..model import Patch, Verdict
from ..plan import Reader


@dataclass
class EditReport:
    file: str
    hunk: int  # 1-based within the file
    header: str
    name: str
    line: int  # first line of the anchor in the pin's file
    qualname: str
    anchor_lines: int
    context_before: int  # lines of context the anchor carries before the changed lines
    context_after: int
    widened_before: int  # of those, lines beyond the diff's own context
    widened_after: int
    offset: int = 0  # lines the hunk sat away from where the diff said
    fuzz: int = 0  # context lines of the diff dropped to place it
    marker: str | None = None
    marker_source: str = ""  # auto | --marker | ""
    notes: list[str] = field(default_factory=list)

    @property
    def widened(self) -> bool:
        return bool(self.widened_before or self.widened_after)


@dataclass
class Skip:
    """A file of the diff vendor leaves out, and why, with its reason code (never prose alone)."""

    file: str
    code: str  # not_included, excluded, outside_package, metadata_only
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.reason} ({self.code})"


@dataclass
class VendorResult:
    patch: Patch | None
    text: str | None
    edits: list[EditReport]
    created: list[str]
    skipped: list[Skip]
    problems: list[Problem]
    warnings: list[str]
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    def written(self) -> tuple[Patch, str]:
        """The patch and its TOML text; only a result that is :attr:`ok` has them."""
        if self.patch is None or self.text is None:
            raise ValueError(f"a vendor result that failed (exit {self.exit_code}) has no patch")
        return self.patch, self.text

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "id": self.patch.id if self.patch else None,
            "edits": [dict(asdict(e), widened=e.widened) for e in self.edits],
            "created": self.created,
            "skipped": [asdict(k) for k in self.skipped],
            "warnings": self.warnings,
            "problems": [p.to_json() for p in self.problems],
        }


def verify(patch: Patch, pin: Reader, expected: dict[str, str], version: str, *, check_compile: bool = True,
           warnings: list[str] | None = None) -> list[Problem]:
    """Plan ``patch`` on the pin and on the expected post-image; say where either disagrees."""
    from ..plan import build_plan

    problems: list[Problem] = []
    ps = PatchSet(patches=[patch])
    plan = build_plan(ps, pin, version, environ={}, check_compile=check_compile)
    for p in plan.problems:
        if p.code == "compile_error":
            if warnings is not None:
                warnings.append(f"{p.file}:{p.line}: the patched file does not compile under this Python "
                                f"({p.message}); the planner will refuse it here")
            continue
        problems.append(Problem("verify_failed", f"planning the patch on the pin fails: {p.render()}",
                                file=p.file, line=p.line))
    for rel, want in expected.items():
        got = plan.changes.get(rel)
        if got is None or got.new != want:
            problems.append(Problem("verify_mismatch", "planning the patch on the pin does not reproduce the diff's "
                                    "post-image byte-exactly", file=rel, hint="a bug in sndr vendor: please report"))
    after = build_plan(ps, lambda rel: expected.get(rel, pin(rel)), version, environ={}, check_compile=False)
    for res in after.patches:
        for e in res.edits:
            # A pure deletion cannot read applied from the text alone (classify's rule); the byte-exact
            # post-image check above is what proves it.
            unverifiable = e.verdict in (Verdict.DRIFTED, Verdict.OPTIONAL_ABSENT) \
                and e.reason_code == "deletion_unverifiable"
            if e.verdict not in (Verdict.APPLIED, Verdict.MERGED) and not unverifiable:
                problems.append(Problem("verify_not_applied", f"edit {e.name} reads {e.verdict.value} on the "
                                        f"post-image; it must read applied or merged ({e.reason})", file=e.file,
                                        line=e.line, hint="a bug in sndr vendor: please report"))
    return problems
