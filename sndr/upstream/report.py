"""The sync queue report (JSON model) and its Markdown rendering."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .decisions import Decision
from .judge import FileResult

__all__ = ["QUEUED", "CommitEntry", "DeviationHit", "Disposition", "QueueReport", "QueueStatus", "SurfaceInfo",
           "Wave", "render_markdown"]

Disposition = Literal["satisfied", "applicable", "review", "conflict", "outside"]
#: What the queue does with a commit.
#: port: applicable, in a wave; port-by-hand: conflict or review, in a wave; skip: satisfied or outside;
#: cancelled: one half of a revert pair inside the range; net-zero: its change is undone inside the range;
#: refused: one half of a revert pair whose other half the tree already carries;
#: superseded: a by-hand commit whose every added line a later commit of the range rewrote.
QueueStatus = Literal["port", "port-by-hand", "skip", "cancelled", "net-zero", "refused", "superseded"]
QUEUED = ("port", "port-by-hand")


class CommitEntry(BaseModel):
    sha: str
    subject: str
    position: int = Field(description="1-based position in the range, upstream order")
    disposition: Disposition
    status: QueueStatus
    reason: str = ""
    wave: int | None = None
    depends_on: list[str] = Field(default_factory=list, description="earlier queued commits this one builds on")
    pair: str | None = Field(default=None, description="the other half of a revert pair inside the range")
    reverts: str | None = Field(default=None, description="the commit (or quoted subject) this one reverts; "
                                "None for a re-land (see relands)")
    relands: str | None = Field(default=None, description="the commit this one lands again after its revert inside "
                                "the range: a revert of that revert (Reapply \"X\", Revert \"Revert \"X\"\", or X "
                                "again with the revert's inverse diff; `pair` names the revert when they cancel), or "
                                "X's title again with a diff of its own")
    superseded_by: list[str] = Field(default_factory=list)
    cherry_pick_of: str | None = Field(default=None, description="the commit with the same patch-id already on "
                                       "the pin's side (or a 3-way pick of it there), or earlier in the range")
    blocked_by: list[str] = Field(default_factory=list, description="queued by-hand commits whose added lines "
                                  "every failing hunk of this one stands on: it applies once they are ported")
    deviations: list[str] = Field(default_factory=list, description="patch ids of deviations this commit touches")
    decision: Decision | None = None
    flags: list[str] = Field(default_factory=list)
    files: list[FileResult] = Field(default_factory=list)
    other_files: int = Field(default=0, description="files the commit touches outside the mirrored surface")

    @property
    def decided(self) -> bool:
        return self.decision is not None and self.decision.decided


class Wave(BaseModel):
    number: int
    commits: list[str]


class SurfaceInfo(BaseModel):
    files: list[str]
    globs: list[str] = Field(default_factory=list)
    renamed: list[str] = Field(default_factory=list, description="paths mirrored because a rename inside the "
                               "range connects them to the surface ('old -> new')")


class DeviationHit(BaseModel):
    patch: str
    upstream: str | None = None
    why: str
    paths: list[str]
    touched_by: list[str] = Field(description="in-range commits that touch the deviation's files")
    discharge: str | None = None
    discharge_in_range: str | None = Field(default=None, description="the discharge commit, when it is in range")
    reviewed: str | None = None


class QueueReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str = "sndr"
    command: str = "sync plan"
    repo: str
    from_ref: str
    from_sha: str
    to_ref: str
    to_sha: str
    merge_base: str | None = Field(default=None, description="git merge-base of FROM and TO; the range is "
                                   "FROM..TO (reachable from TO, not from FROM)")
    from_is_ancestor: bool = True
    pin_side: list[str] = Field(default_factory=list, description="commits reachable from FROM and not from TO "
                                "(a release branch's own commits)")
    tree: str
    surface: SurfaceInfo
    decisions_file: str | None = None
    patches_dir: str | None = Field(default=None, description="the patch directory the queue was planned for "
                                    "(where `sync decide` and `pin advance` write by default)")
    patch_set_digest: str | None = Field(default=None, description="digest of that patch set (PatchSet.digest())")
    warnings: list[str] = Field(default_factory=list, description="e.g. a range that runs backwards")
    counts: dict[str, int] = Field(default_factory=dict)
    waves: list[Wave] = Field(default_factory=list)
    commits: list[CommitEntry] = Field(default_factory=list)
    merges_skipped: list[str] = Field(default_factory=list)
    selected: list[str] | None = None
    deviations: list[DeviationHit] = Field(default_factory=list)
    deviations_checked: list[str] | None = Field(default=None, description="patch ids of every deviation the "
                                                 "plan checked against the range (touched or not); `pin advance` "
                                                 "checks the ones recorded later itself")
    stale_decisions: list[str] = Field(default_factory=list, description="decided shas not in this range (kept)")
    findings: list[dict] = Field(default_factory=list)

    def entry(self, sha: str) -> CommitEntry:
        for c in self.commits:
            if c.sha == sha:
                return c
        raise KeyError(sha)

    def queued(self) -> list[CommitEntry]:
        order = [s for w in self.waves for s in w.commits]
        return [self.entry(s) for s in order]


# ----------------------------------------------------------------------------- markdown


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _names(entries: list[CommitEntry], limit: int = 12) -> str:
    shown = ", ".join(f"`{e.sha[:10]}`" for e in entries[:limit])
    return shown + (f" and {len(entries) - limit} more" if len(entries) > limit else "")


def _label(e: CommitEntry) -> str:
    """The disposition as the queue shows it: ``blocked by <sha>`` for a commit that waits on a by-hand one,
    ``applicable (fuzz N)`` for one that needed reduced context."""
    if e.blocked_by:
        return "blocked by " + ", ".join(f"`{s[:10]}`" for s in e.blocked_by)
    if e.disposition == "applicable":
        fz = sorted({h.fuzz for f in e.files for h in f.hunks if h.fuzz is not None})
        if fz:
            near = sorted({p for f in e.files for h in f.hunks for p in h.local_patches})
            return f"applicable (fuzz {min(fz)}" + (f", next to {', '.join(near)}" if near else "") + ")"
    return e.disposition


def render_markdown(rep: QueueReport) -> str:
    c = rep.counts
    out = [f"# Sync queue: {rep.from_ref} ({rep.from_sha[:10]}) .. {rep.to_ref} ({rep.to_sha[:10]})", ""]
    out.append(f"- repository: `{rep.repo}`")
    if rep.merge_base:
        side = ("--from is an ancestor of --to" if rep.from_is_ancestor else
                f"--from is not an ancestor of --to (release branches); {len(rep.pin_side)} commit(s) on the "
                "pin's side only")
        out.append(f"- range: `{rep.from_ref}..{rep.to_ref}` (reachable from --to, not from --from); merge-base "
                   f"`{rep.merge_base[:10]}`; {side}")
    out.append(f"- tree: `{rep.tree}`")
    out.append(f"- mirrored surface: {len(rep.surface.files)} files"
               + (f" + globs {', '.join('`' + g + '`' for g in rep.surface.globs)}" if rep.surface.globs else "")
               + (f"; followed through renames: {', '.join('`' + r + '`' for r in rep.surface.renamed)}"
                  if rep.surface.renamed else ""))
    blocked = [e for e in rep.commits if e.blocked_by]
    nb = {d: sum(1 for e in blocked if e.disposition == d) for d in ("review", "conflict")}
    by = sorted({s[:10] for e in blocked for s in e.blocked_by})
    fuzz = sum(1 for e in rep.commits if e.disposition == "applicable"
               and any(h.fuzz is not None for f in e.files for h in f.hunks))
    out.append(f"- {c.get('commits', 0)} commits in range, {c.get('mirrored', 0)} touch the surface: "
               f"{c.get('satisfied', 0)} satisfied, {c.get('applicable', 0)} applicable"
               + (f" ({fuzz} with fuzz)" if fuzz else "")
               + f", {c.get('review', 0) - nb['review']} review, {c.get('conflict', 0) - nb['conflict']} conflict, "
               + (f"{len(blocked)} blocked by {', '.join('`' + s + '`' for s in by)} (they apply once it is ported), "
                  if blocked else "")
               + f"{c.get('outside', 0)} outside")
    out.append(f"- queue: {c.get('queued', 0)} commits in {len(rep.waves)} wave(s), {c.get('decided', 0)} decided "
               f"and {c.get('undecided', 0)} undecided; {c.get('status:cancelled', 0)} cancelled by revert pairs, "
               f"{c.get('status:net-zero', 0)} net-zero, {c.get('status:superseded', 0)} superseded, "
               f"{c.get('status:refused', 0)} refused, {c.get('cherry_picked', 0)} cherry-picked"
               + (f" ({c['cherry_picked_3way']} by a 3-way pick)" if c.get("cherry_picked_3way") else ""))
    if rep.merges_skipped:
        out.append(f"- {len(rep.merges_skipped)} merge commit(s) skipped: the planner reads each commit's diff "
                   "against its first parent")
    out.append("")
    if rep.warnings:
        out += ["## Warnings", ""] + [f"- {_md(w)}" for w in rep.warnings] + [""]
    if rep.findings:
        out += ["## Findings", ""] + [f"- **{f['code']}**: {f['message']}" for f in rep.findings] + [""]
    if rep.deviations:
        out += ["## Deviations touched by the range", "", "| patch | upstream | why | touched by | discharge | "
                "reviewed for |", "|---|---|---|---|---|---|"]
        for d in rep.deviations:
            dis = (f"`{d.discharge_in_range[:10]}` (in range)" if d.discharge_in_range
                   else (f"{d.discharge} (not in range)" if d.discharge else "-"))
            out.append(f"| {d.patch} | {d.upstream or '-'} | {_md(d.why)} | "
                       f"{', '.join('`' + s[:10] + '`' for s in d.touched_by)} | {dis} | {d.reviewed or '-'} |")
        out.append("")
    undecided_waves = []
    for w in rep.waves:
        rows = [rep.entry(s) for s in w.commits if not rep.entry(s).decided]
        if rows:
            undecided_waves.append((w.number, rows))
    if undecided_waves:
        out += ["## Undecided", ""]
    for number, rows in undecided_waves:
        out += [f"### Wave {number}", "", "| # | commit | subject | disposition | after | reason |",
                "|---|---|---|---|---|---|"]
        for e in rows:
            after = ", ".join(d[:10] for d in e.depends_on) or "-"
            flags = f" ({'; '.join(e.flags)})" if e.flags else ""
            tier = f" [{e.decision.tier}]" if e.decision and e.decision.tier else ""
            out.append(f"| {e.position} | `{e.sha[:10]}` | {_md(e.subject)}{tier} | {_label(e)} | {after} | "
                       f"{_md(e.reason + flags)} |")
        out.append("")
    decided = [(e, dec) for e in rep.queued() if (dec := e.decision) is not None and dec.decided]
    if decided:
        out += ["## Decided", "", "| # | commit | subject | disposition | wave | decision |", "|---|---|---|---|---|---|"]
        for e, dec in decided:
            out.append(f"| {e.position} | `{e.sha[:10]}` | {_md(e.subject)} | {_label(e)} | {e.wave} | "
                       f"{_md(dec.summary())} |")
        out.append("")
    rest = [e for e in rep.commits if e.status not in QUEUED and e.disposition != "outside"]
    if rest:
        out += ["## Not queued", "", "| # | commit | subject | disposition | status | reason |", "|---|---|---|---|---|---|"]
        for e in rest:
            out.append(f"| {e.position} | `{e.sha[:10]}` | {_md(e.subject)} | {e.disposition} | {e.status} | "
                       f"{_md(e.reason)} |")
        out.append("")
    if rep.stale_decisions:
        out += [f"{len(rep.stale_decisions)} decision(s) name commits outside this range and are kept: "
                + ", ".join(f"`{s[:10]}`" for s in rep.stale_decisions), ""]
    return "\n".join(out)
