"""Watchlist triggers: which rows fire on a preflight's candidate (``watchlist check``).

A row's trigger fires when its local patches come out merged (``retire-on-merge``)
or drifted (``reanchor-on-merge``) on the candidate, or when one of its markers
is newly merged (``review-on-merge``). A PR tracked in both sections fires once,
naming both rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..errors import bad_input
from .watchlist import LoadedWatchlist, Section, Trigger, Watchlist, read_text_file

__all__ = ["CheckReport", "Firing", "PreflightFacts", "check", "load_preflight"]


_DRIFT_VERDICTS = {"drifted", "ambiguous", "file_missing"}


def _ids_of(items: Any) -> set[str]:
    """Patch ids in a preflight list whose items are ids or objects naming one."""
    out: set[str] = set()
    for item in items or []:
        if isinstance(item, str):
            out.add(item)
        elif isinstance(item, dict):
            for k in ("patch", "id", "patch_id"):
                if isinstance(item.get(k), str):
                    out.add(item[k])
                    break
    return out


@dataclass
class PreflightFacts:
    """What trigger evaluation reads from a preflight report (docs/format.md)."""

    candidate: str
    merged: set[str]
    drifted: set[str]
    known: set[str]
    newly_merged: list[dict]
    partly_merged: set[str] = field(default_factory=set)

    @classmethod
    def from_json(cls, data: Any, file: str = "<preflight>") -> PreflightFacts:
        if not isinstance(data, dict):
            raise bad_input("bad_preflight", "a preflight report is a JSON object", file=file)
        keys = ("patches", "genuine_anchor_drift", "retired_upstream", "newly_merged")
        if not any(k in data for k in keys):
            raise bad_input("bad_preflight", f"not a preflight report: none of {', '.join(keys)} is present",
                            file=file)
        for k in keys + ("newly_reverted",):
            if k in data and not isinstance(data[k], list):
                raise bad_input("bad_preflight", f"{k!r} must be a list", file=file, key=k)
        # retired_upstream lists edits: a patch with only some of them carried upstream is partly merged
        partly: set[str] = set(_ids_of(data.get("retired_upstream")))
        merged: set[str] = set()
        drifted: set[str] = set(_ids_of(data.get("genuine_anchor_drift")))
        known: set[str] = set()
        for i, p in enumerate(data.get("patches", [])):
            if not isinstance(p, dict) or not isinstance(p.get("id"), str):
                raise bad_input("bad_preflight", f"patches[{i}] has no 'id'", file=file, key=f"patches[{i}]")
            pid = p["id"]
            known.add(pid)
            edits = [e for e in p.get("edits") or [] if isinstance(e, dict)]
            verdicts = [e.get("verdict") for e in edits]
            if (p.get("status") == "merged" or p.get("action") == "retire"
                    or (verdicts and all(v == "merged" for v in verdicts))):
                merged.add(pid)
            elif any(v == "merged" for v in verdicts):
                partly.add(pid)
            if p.get("action") == "reanchor" or any(
                    v in _DRIFT_VERDICTS and e.get("required", True) for v, e in zip(verdicts, edits)):
                drifted.add(pid)
        newly = []
        for item in data.get("newly_merged", []):
            if isinstance(item, str):
                newly.append({"marker": item})
            elif isinstance(item, dict):
                newly.append(item)
        cand = data.get("candidate")
        if isinstance(cand, dict):
            cand = cand.get("version") or cand.get("spec") or cand.get("tree") or json.dumps(cand, sort_keys=True)
        if not known:  # a report without per-patch entries: its lists are all we have
            merged |= partly
        partly -= merged
        return cls(candidate=str(cand) if cand is not None else "", merged=merged, drifted=drifted,
                   known=known | merged | drifted | partly, newly_merged=newly, partly_merged=partly)

    def marker_hits(self, markers: Iterable[str]) -> list[dict]:
        wanted = set(markers)
        hits = []
        for item in self.newly_merged:
            names = {item.get(k) for k in ("marker", "name", "id") if isinstance(item.get(k), str)}
            if names & wanted:
                hits.append(item)
        return hits


class Firing(BaseModel):
    section: Section
    index: int
    row: str
    line: int | None = None
    trigger: Trigger
    patches: list[str] = Field(default_factory=list, description="local patches that came out merged or drifted")
    markers: list[str] = Field(default_factory=list, description="row markers the candidate newly carries")
    reason: str
    rows: list[str] = Field(default_factory=list, description="every row this one trigger fired from, e.g. "
                            "['watch vllm#52412', 'sweep #52412'] when a PR is in both sections")
    lines: list[int | None] = Field(default_factory=list, description="the line of each of ``rows``")

    def where(self) -> str:
        """``watch vllm#52412 + sweep #52412 (line 58)``: every row, the first one's line given by the caller."""
        parts = [self.rows[0]] + [f"{r} (line {ln})" if ln else r for r, ln in zip(self.rows[1:], self.lines[1:])]
        return " + ".join(parts)


class CheckReport(BaseModel):
    tool: str = "sndr"
    command: str = "watchlist check"
    watchlist: str
    preflight: str
    candidate: str = ""
    fired: list[Firing] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def check(loaded: LoadedWatchlist, facts: PreflightFacts, preflight_name: str = "") -> CheckReport:
    """Which triggers fired on the preflight's candidate."""
    report = CheckReport(watchlist=loaded.file, preflight=preflight_name, candidate=facts.candidate)
    for section, index, row in loaded.model.rows():
        trigger = row.trigger
        ids = row.patch_ids()
        hits = facts.marker_hits(row.markers)
        hit_markers = sorted({str(h.get("marker") or h.get("name") or h.get("id")) for h in hits})
        fired_ids: list[str] = []
        reason = ""
        if trigger == "retire-on-merge":
            fired_ids = [p for p in ids if p in facts.merged]
            partly = [p for p in ids if p in facts.partly_merged]
            if fired_ids:
                reason = f"{', '.join(fired_ids)} came out merged on the candidate: retire"
            if partly:
                fired_ids += partly
                reason = (reason + "; " if reason else "") + \
                    f"{', '.join(partly)} partly merged (some edits carried upstream): review before retiring"
        elif trigger == "reanchor-on-merge":
            fired_ids = [p for p in ids if p in facts.drifted]
            if fired_ids:
                reason = f"{', '.join(fired_ids)} drifted on the candidate: re-anchor"
        elif hits:
            where = ", ".join(sorted({f"{h.get('file')}" for h in hits if h.get("file")}))
            reason = f"marker(s) {', '.join(hit_markers)} newly merged" + (f" in {where}" if where else "") + ": review"
        if not reason and hits and trigger != "review-on-merge":
            report.notes.append(f"{loaded.row_label(section, index)}: marker(s) {', '.join(hit_markers)} newly "
                                f"merged but none of its patches came out "
                                f"{'merged' if trigger == 'retire-on-merge' else 'drifted'}")
        if reason:
            line = loaded.line_of(section, index)
            report.fired.append(Firing(section=section, index=index, row=row.key, line=line,
                                       trigger=trigger, patches=fired_ids, markers=hit_markers, reason=reason,
                                       rows=[f"{section} {row.key}"], lines=[line]))
        missing = [p for p in ids if p not in facts.known]
        if missing and trigger != "review-on-merge" and facts.known:
            report.notes.append(f"{loaded.row_label(section, index)}: {', '.join(missing)} not in the preflight")
    report.fired = _merge_twins(loaded.model, report.fired)
    return report


def _merge_twins(wl: Watchlist, fired: list[Firing]) -> list[Firing]:
    """One firing per trigger: a PR tracked in both sections fires once, naming both rows."""
    def pr_of(f: Firing) -> int | None:
        return wl.watch[f.index].pr_number() if f.section == "watch" else wl.sweep[f.index].pr

    out: list[Firing] = []
    seen: dict[tuple[int, str], Firing] = {}
    for f in fired:
        pr = pr_of(f)
        first = seen.get((pr, f.trigger)) if pr is not None else None
        if first is None:
            out.append(f)
            if pr is not None:
                seen[(pr, f.trigger)] = f
            continue
        first.rows += f.rows
        first.lines += f.lines
        first.patches = sorted(set(first.patches) | set(f.patches))
        first.markers = sorted(set(first.markers) | set(f.markers))
        if f.reason != first.reason:
            first.reason = f"{first.reason}; {f.rows[0]}: {f.reason}"
    return out


def load_preflight(path: Path | str) -> PreflightFacts:
    text = read_text_file(Path(path), "preflight report")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_input("bad_json", f"malformed JSON: {exc.msg}", file=str(path), line=exc.lineno) from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit integer (int max str digits), nesting too deep
        raise bad_input("bad_json", f"unusable JSON: {str(exc).split(';')[0]}", file=str(path)) from None
    return PreflightFacts.from_json(data, str(path))
