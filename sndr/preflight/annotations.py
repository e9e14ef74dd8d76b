"""Machine renderings for code review: SARIF 2.1.0 and GitHub workflow annotations, one per finding."""

from __future__ import annotations

import re
from pathlib import Path

from .models import EditEntry, EditRef, PreflightReport

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
            if sg.confidence == "low":
                return (f"; no confident match: the code was likely removed or rewritten (nearest, a hint only: "
                        f"{sg.file}:{sg.line}, score {sg.score}, confidence low)")
            via = f"; path {_path(e)}" if e.path else ""
            return (f"; best candidate {sg.file}:{sg.line} ({sg.qualname or 'module'}, score {sg.score}, "
                    f"confidence {sg.confidence}){via}")
        if e is not None and e.kind == "runtime" and e.line:
            return f"; the target is still at {e.file}:{e.line}"
        return "; no relocation candidate found (no confident match: the code was likely removed or rewritten)"

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


def _path(e: EditEntry) -> str:
    from .render import path_text

    return path_text(e)


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
        e = next((x for p in report.patches if p.id == r.patch for x in p.edits if x.name == r.name), None)
        if e is not None and e.confidence is not None:
            result["properties"] = {"confidence": e.confidence, "suggestions": [
                {"file": s.file, "line": s.line, "score": s.score, "confidence": s.confidence} for s in e.suggestions]}
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
    """GitHub workflow commands (``::error file=...,line=...::msg``), one per finding, after one ``::warning``
    per warning of the run (``same_version``)."""
    level = {"error": "error", "warning": "warning", "note": "notice"}
    sources = {p.id: p.source for p in report.patches}
    out = [f"::warning title={_gh_escape('sndr ' + w.code, True)}::{_gh_escape(w.message)}" for w in report.warnings]
    for rule, r, msg in _findings_for_annotation(report):
        src = sources.get(r.patch) or r.patch
        props = f"file={_gh_escape(src, True)},line={_toml_line(src, r.name)},title={_gh_escape('sndr ' + rule, True)}"
        out.append(f"::{level[_RULES[rule][0]]} {props}::{_gh_escape(msg)}")
    return out


