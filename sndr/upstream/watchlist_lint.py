"""Watchlist lint (``watchlist lint``): unknown or retired patches, contradictions, duplicates, twin rows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import Problem
from .watchlist import LoadedWatchlist, SweepRow, WatchRow

__all__ = ["Registry", "lint", "load_registry"]



@dataclass(frozen=True)
class Registry:
    """What lint needs to know about the patch set: id -> lifecycle."""

    lifecycles: dict[str, str]

    @classmethod
    def from_patches(cls, patches) -> Registry:
        return cls({p.id: p.lifecycle for p in patches})

    def __contains__(self, pid: str) -> bool:
        return pid in self.lifecycles


def load_registry(directory: Path | str | None = None) -> Registry:
    from ..load import load_patch_set

    return Registry.from_patches(load_patch_set(directory).patches)


def _action_contradiction(row: WatchRow) -> str | None:
    """Why a watch row's action cannot make sense with its status, or None."""
    if row.action == "retire" and row.status == "closed":
        return ("action 'retire' waits for a merge, but the PR is closed unmerged: the retire can never "
                "fire from this PR")
    if row.action == "drift-check" and row.status == "closed":
        return "action 'drift-check' on a PR that is closed unmerged: it cannot move the anchors any more"
    if row.action == "retire" and not row.local_patches:
        return "action 'retire' with no local_patches: there is nothing to retire"
    if row.action == "drift-check" and not row.local_patches:
        return "action 'drift-check' with no local_patches: there are no anchors to check"
    if row.fix_status == "merged-in-pin" and row.action in ("port", "drift-check"):
        fix = f"fix {row.fix_upstream}" if row.fix_upstream else "the fix"
        return f"{fix} is merged in the pin, so action {row.action!r} is done: retire the local patches or close the row"
    if row.action == "port" and row.status == "merged" and row.fix_status == "merged-in-pin":
        return "action 'port' but the PR is merged and in the pin: there is nothing left to port"
    if (row.fix_upstream is None) != (row.fix_status is None):
        return "fix_upstream and fix_status go together; one is missing"
    return None


def _sweep_contradiction(row: SweepRow) -> str | None:
    ref = row.patch_ref
    if row.trigger in ("retire-on-merge", "reanchor-on-merge") and ref.kind == "watch-only":
        verb = "retire" if row.trigger == "retire-on-merge" else "re-anchor"
        return f"trigger {row.trigger!r} but genesis_patch is 'watch-only': there is no patch to {verb}"
    if row.trigger == "reanchor-on-merge" and ref.kind == "planned":
        return "trigger 'reanchor-on-merge' on a planned patch: it has no anchors yet"
    return None


def lint(loaded: LoadedWatchlist, registry: Registry | None) -> list[Problem]:
    """Every finding on the watchlist. ``registry=None`` skips the checks that need the patch set."""
    wl, file = loaded.model, loaded.file
    out: list[Problem] = []

    def add(code: str, section: str, index: int, msg: str, key: str | None = None, patch: str | None = None,
            hint: str | None = None) -> None:
        out.append(Problem(code, f"{loaded.row_label(section, index)}: {msg}", file=file,
                           line=loaded.line_of(section, index, key), key=key, patch=patch, hint=hint))

    # duplicates: same PR twice in one section
    for section, rows in (("watch", wl.watch), ("sweep", wl.sweep)):
        first: dict[str, int] = {}
        for i, r in enumerate(rows):
            k = r.key
            if k in first:
                same = r.model_dump() == rows[first[k]].model_dump()
                add("duplicate_row", section, i,
                    f"duplicates {section}[{first[k]}] (line {loaded.line_of(section, first[k])})"
                    + (" exactly" if same else "; the two rows disagree"),
                    key="upstream" if section == "watch" else "pr",
                    hint="merge the two rows into one")
            else:
                first[k] = i

    for i, r in enumerate(wl.watch):
        why = _action_contradiction(r)
        if why:
            add("action_contradicts_status", "watch", i, why, key="action")
        seen: set[str] = set()
        for pid in r.local_patches:
            if pid in seen:
                add("duplicate_patch", "watch", i, f"local_patches lists {pid} twice", key="local_patches", patch=pid)
            seen.add(pid)
            if registry is not None and pid not in registry:
                add("unknown_patch", "watch", i, f"local patch {pid} is not in the patch set",
                    key="local_patches", patch=pid)

    for i, r in enumerate(wl.sweep):
        why = _sweep_contradiction(r)
        if why:
            add("action_contradicts_status", "sweep", i, why, key="trigger")
        ref = r.patch_ref
        if ref.kind == "text":
            add("unparsed_patch_ref", "sweep", i, f"genesis_patch {r.genesis_patch!r} names no patch id, "
                "'watch-only' or 'planned: ...'", key="genesis_patch")
        if registry is None:
            continue
        if ref.kind == "ids":
            for pid in ref.ids:
                if pid not in registry:
                    add("unknown_patch", "sweep", i, f"patch {pid} is not in the patch set",
                        key="genesis_patch", patch=pid)
                elif registry.lifecycles[pid] == "retired":
                    add("retired_patch", "sweep", i, f"names {pid}, whose lifecycle is 'retired'",
                        key="genesis_patch", patch=pid, hint="drop the row or point it at the live successor")
        elif ref.kind == "planned":
            for pid in ref.ids:
                if pid in registry:
                    add("planned_patch_exists", "sweep", i, f"planned patch {pid} exists now",
                        key="genesis_patch", patch=pid, hint=f"set genesis_patch to {pid!r}")

    # the same PR in both sections must agree on the trigger it carries
    watch_by_pr = {r.pr_number(): i for i, r in enumerate(wl.watch) if r.pr_number() is not None}
    for j, s in enumerate(wl.sweep):
        wi = watch_by_pr.get(s.pr)
        if wi is None:
            continue
        w = wl.watch[wi]
        if w.trigger != s.trigger and w.action in ("retire", "drift-check"):
            add("twin_rows_disagree", "sweep", j,
                f"trigger {s.trigger!r} but watch[{wi}] {w.upstream} has action {w.action!r} "
                f"({w.trigger})", key="trigger")
        wids, sids = set(w.local_patches), set(s.patch_ids())
        if s.patch_ref.kind == "ids" and wids and wids != sids:
            add("twin_rows_disagree", "sweep", j,
                f"names {', '.join(sorted(sids))} but watch[{wi}] {w.upstream} lists "
                f"{', '.join(sorted(wids))}", key="genesis_patch")
    out.sort(key=lambda p: (p.line or 0, p.code))
    return out
