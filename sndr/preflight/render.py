"""Human renderings of a preflight report: Markdown (the committed docs/preflight-*.md) and the terminal."""

from __future__ import annotations

import difflib

from ..load import PatchSet
from ..model import Patch, Verdict
from .analysis import _anchor_of
from .models import _NEEDS_SUGGESTIONS, EditEntry, PatchEntry, PreflightReport, SuggestionModel

# ============================================================================ rendering


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

NO_CONFIDENT = "no confident match: the code was likely removed or rewritten"

_FINDING_WORDS = {
    "drift": ("edit drifted or lost its file", "edits drifted or lost their file"),
    "ambiguous": ("anchor is ambiguous", "anchors are ambiguous"),
    "any": ("other change (a retirement, soft-skip, marker change or gate; listed above, not a review item)",
            "other changes (retirements, soft-skips, marker changes, gates; listed above, not review items)"),
    "config": ("configuration finding", "configuration findings"),
}


def findings_in_words(findings: dict[str, int], config=None) -> str:
    """``drift 3, any 93`` said as words a reader does not have to decode. With the report's
    configuration-drift section, ``config`` is split into what it counts: watched items that changed
    (only with a watch list) and runtime patch targets that changed upstream."""
    parts = []
    for k, n in findings.items():
        if not n:
            continue
        if k == "config" and config is not None:
            watched, broken = config.attention_count, len(config.runtime_broken)
            if watched:
                parts.append(f"{watched} watched configuration item{'s' if watched != 1 else ''} changed "
                             f"(watch list {config.watch_source})")
            if broken:
                parts.append(f"{broken} runtime patch target{'s' if broken != 1 else ''} changed upstream "
                             f"(signature, source or gone)")
            continue
        parts.append(f"{n} {_FINDING_WORDS.get(k, (k, k))[n != 1]}")
    return "; ".join(parts) or "nothing to report"


def _ids(ids: list[str], limit: int = 12) -> str:
    return ", ".join(ids[:limit]) + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def verdict_line(report: PreflightReport) -> str:
    """One plain-words line first: can the bump go ahead, and what it takes."""
    by_action: dict[str, list[str]] = {}
    for p in report.patches:
        by_action.setdefault(p.action, []).append(p.id)
    blocked = report.summary.exit_code != 0
    head = "Bump blocked" if blocked else "Bump clear"
    parts = []
    if by_action.get("reanchor"):
        ids = by_action["reanchor"]
        parts.append(f"{len(ids)} patch{'es' if len(ids) != 1 else ''} drifted ({_ids(ids, 6)})")
    if by_action.get("review"):
        parts.append(f"review {len(by_action['review'])}")
    if by_action.get("retire"):
        parts.append(f"retire {len(by_action['retire'])}")
    if by_action.get("soft_skip"):
        parts.append(f"{len(by_action['soft_skip'])} would silently soft-skip")
    parts.append(f"keep {len(by_action.get('keep', []))}")
    if by_action.get("gated"):
        parts.append(f"{len(by_action['gated'])} gated on both")
    return f"{head}: " + "; ".join(parts)


def path_text(e: EditEntry) -> str:
    """``0.24.0 file:line -> 0.27.1 other:line -> ...`` (only the steps where the place changed)."""
    steps, last = [], None
    for i, st in enumerate(e.path):
        here = (st.file, st.line)
        if st.how == "lost":
            steps.append(f"{st.version} lost")
            break
        if i == 0 or i == len(e.path) - 1 or here != last:
            steps.append(f"{st.version} {_loc(st.file, st.line)}")
        last = here
    return " -> ".join(steps)


def render_markdown(report: PreflightReport, patch_set: PatchSet | None = None) -> str:
    """The human report: verdict counts, then retire / re-anchor / review / soft-skips."""
    patches = patch_set.by_id if patch_set is not None else {}
    s = report.summary
    out = [f"# sndr bump preflight: {report.pin.version} -> {report.candidate.version}", "",
           f"**{verdict_line(report)}**", ""]
    out.append(f"- pin: `{report.pin.spec}` (vllm {report.pin.version}, tree {report.pin.tree_digest[:12]})")
    out.append(f"- candidate: `{report.candidate.spec}` (vllm {report.candidate.version}, "
               f"tree {report.candidate.tree_digest[:12]})")
    out.append(f"- patch set: {report.patch_set.patches} patches ({report.patch_set.digest[:12]}), {s.edits} edits")
    out += [f"- **warning**: {_md_cell(w.message, 600)} ({w.code})" for w in report.warnings]
    fail = [k for k in s.fail_on if k != "none"]
    out.append(f"- result: exit {s.exit_code} (fail on {', '.join(fail) or 'nothing'}): "
               + findings_in_words(s.findings, report.config))
    if s.via:
        out.append(f"- followed through: {', '.join(s.via)} (--via)")
    if s.confidence:
        out.append("- relocation confidence (best suggestion per edit): "
                   + ", ".join(f"{k} {v}" for k, v in s.confidence.items()))
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
    # -- retire: a whole-patch retirement is one row, not one per edit
    whole = [p for p in report.patches if p.action == "retire"]
    whole_ids = {p.id for p in whole}
    partial = [r for r in report.retired_upstream if r.patch not in whole_ids]
    out += [f"## Retire ({len(whole)} whole patches, {len(partial)} single edits)", ""]
    if whole or partial:
        out += ["Upstream carries these changes on the candidate: retire the patch (or the edit).", ""]
    if whole:
        out += ["| patch | title | edits | why |", "|---|---|---:|---|"]
        for p in whole:
            why = sorted({r.detail for r in report.retired_upstream if r.patch == p.id})
            out.append(f"| {p.id} | {_md_cell(p.title, 80)} | {len(p.edits)} | {_md_cell('; '.join(why))} |")
        out.append("")
    if partial:
        out += ["| patch | edit | file | pin -> candidate | why |", "|---|---|---|---|---|"]
        for r in partial:
            out.append(f"| {r.patch} | {r.name} | {_code(_loc(r.file, r.line))} | "
                       f"{r.pin_verdict.value} -> {r.verdict.value} | {_md_cell(r.detail)} |")
        out.append("")
    if not (whole or partial):
        out += ["Nothing to retire.", ""]
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
    # -- keep
    kept = [p for p in report.patches if p.action == "keep"]
    out += [f"## Keep ({len(kept)})", ""]
    if kept:
        out += ["Every edit of these patches still applies on the candidate.", "",
                "| patch | title | edits |", "|---|---|---:|"]
        out += [f"| {p.id} | {_md_cell(p.title, 80)} | {len(p.edits)} |" for p in kept]
        out.append("")
    else:
        out += ["None.", ""]
    # -- markers
    merged_rows = [m for m in report.newly_merged if m.patch not in whole_ids]
    out += [f"## Upstream markers ({len(report.newly_merged)} newly merged, {len(report.newly_reverted)} newly reverted)", ""]
    if len(merged_rows) < len(report.newly_merged):
        out += [f"{len(report.newly_merged) - len(merged_rows)} newly merged markers belong to the whole-patch "
                "retirements above.", ""]
    for title, rows in (("Newly merged", merged_rows), ("Newly reverted", report.newly_reverted)):
        if rows:
            out += [f"**{title}**", "", "| patch | edit | file | marker |", "|---|---|---|---|"]
            out += [f"| {m.patch} | {m.edit or '(' + m.scope + ')'} | {_code(_loc(m.file, m.line))} | "
                    f"{_code(_md_cell(m.marker, 80))} |" for m in rows]
            out.append("")
    if not (report.newly_merged or report.newly_reverted):
        out += ["No marker changed between the two trees.", ""]
    # -- performance plugins
    if report.performance:
        out += perf_markdown(report)
    # -- config
    if report.config is not None:
        try:
            from .configrender import render_markdown as config_md

            out += [config_md(report.config)]
        except Exception as exc:  # pragma: no cover - a render bug must not hide the patch report
            out += ["## Configuration drift", "", f"(could not render: {exc})", ""]
    if report.problems:
        out += ["## Problems", ""]
        for pr in report.problems:
            out.append(f"- {_code(_loc(pr.file or '', pr.line))} {pr.patch or ''}: {_md_cell(pr.message, 300)} ({pr.code})")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def perf_markdown(report: PreflightReport) -> list[str]:
    """``## Performance plugins``: per plugin, whether the upstream code it replaces or competes with changed."""
    n = sum(1 for p in report.performance if p.verdict == "re-measure")
    out = [f"## Performance plugins ({n} to re-measure)", "",
           "Whether the upstream code each plugin replaces or competes with (its bound functions, their kernel "
           "files and callers in the layer, kernels the layer gained or lost) changed between the pin and the "
           "candidate. `re-measure` (a competitor changed): `pin advance` needs `--perf-ref` (the plugin's "
           "benchmark JSON, `{\"plugin\": ID, \"vllm\": \"<candidate>\", ...}`, measured against the "
           "candidate's kernels) or `--no-perf-ref ID=REASON`; `review`: only the code around them changed.", "",
           "| plugin | default | verdict | what changed |", "|---|---|---|---|"]
    for p in report.performance:
        kept = [c for c in p.compared if c.startswith("kernel file ")]
        what = "; ".join(c.detail for c in p.changes) or "nothing changed"
        if p.verdict != "re-measure" and kept:
            what += "; unchanged: " + ", ".join(k.removeprefix("kernel file ") for k in kept)
        out.append(f"| {p.id} | {'on' if p.enabled_by_default else 'off'} | {p.verdict} | {_md_cell(what, 900)} |")
    return out + [""]


def _md_edit_block(p: PatchEntry, e: EditEntry, anchor: str | None, level: str = "###") -> list[str]:
    verdict = e.verdict.value
    if e.verdict == Verdict.GATED:
        verdict = f"gated (would be {e.verdict_if_enabled.value})" if e.verdict_if_enabled else "gated"
    out = [f"{level} {p.id} `{e.name}`: {verdict} in `{e.file}`", ""]
    where = _loc(e.file, e.pin_line, e.pin_qualname)
    out += [f"{p.title} - on the pin at {_code(where)}. {_md_cell(e.reason, 300)}", ""]
    return out + _md_suggestions(e, anchor)


def _no_suggestion_text(e: EditEntry) -> str:
    if e.kind == "runtime" and e.line:
        return (f"The target is still at {e.file}:{e.line} ({e.qualname or 'module'}); its signature or source "
                "changed: review the replacement.")
    return f"No relocation candidate found ({NO_CONFIDENT})."


def _md_suggestions(e: EditEntry, anchor: str | None) -> list[str]:
    out = []
    if e.path:
        out += [f"Path ({e.path_source or 'direct'} search chosen): {_code(path_text(e))}", ""]
    if not e.suggestions:
        return out + [_no_suggestion_text(e), ""]
    confident = e.suggestions[0].confidence != "low"
    if not confident:
        out += [f"**{NO_CONFIDENT[0].upper() + NO_CONFIDENT[1:]}.** The nearest candidate below is a hint only, "
                "not a place to re-anchor.", ""]
    out += ["| # | where | qualname | score | confidence | why |", "|---:|---|---|---:|---|---|"]
    for i, sg in enumerate(e.suggestions, 1):
        out.append(f"| {i} | {_code(f'{sg.file}:{sg.line}-{sg.end_line}')} | {_code(sg.qualname)} | {sg.score} | "
                   f"{sg.confidence} | {_md_cell(', '.join(sg.reasons))} |")
    out.append("")
    if anchor is not None and confident:
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
    """Compact terminal layout: the verdict line, one line per count, one block per edit to act on."""
    from rich.text import Text

    from ..render import make_console

    console = console or make_console()
    s = report.summary
    console.print(f"[bold]sndr preflight[/bold] {report.pin.version} -> {report.candidate.version}  "
                  f"({s.patches} patches, {s.edits} edits{', via ' + ', '.join(s.via) if s.via else ''})")
    console.print(Text(verdict_line(report), style="bold red" if s.exit_code else "bold green"))
    counts = []
    for v in Verdict:
        a, b = s.pin_counts.get(v.value, 0), s.counts.get(v.value, 0)
        if a or b:
            counts.append(Text(f"{v.value} {a}->{b}", style=_STYLE.get(v.value, "")))
    console.print(Text("edits (pin->candidate): ").append(Text("  ").join(counts)))
    by_id = {p.id: p for p in report.patches}

    def head(title: str, n: int, style: str) -> None:
        console.print(Text(f"{title} ({n})", style=f"bold {style}"))

    drifted = [*report.genuine_anchor_drift, *report.file_missing]
    if drifted:
        head("re-anchor", len(drifted), "red")
    for r in drifted:
        e = next(x for x in by_id[r.patch].edits if x.name == r.name)
        console.print(Text(f"  {r.patch}/{r.name}  {r.verdict.value}  pin {_loc(r.file, r.pin_line, r.pin_qualname)}"))
        if e.path:
            console.print(Text(f"      path: {path_text(e)}", style="dim"))
        if e.suggestions and e.suggestions[0].confidence == "low":
            sg = e.suggestions[0]
            console.print(Text(f"      {NO_CONFIDENT} (nearest, a hint only: {sg.file}:{sg.line} score {sg.score})",
                               style="yellow"))
            continue
        for sg in e.suggestions[: 3 if verbose else 1]:
            console.print(Text(f"      -> {sg.file}:{sg.line}-{sg.end_line} {sg.qualname}  score {sg.score} "
                               f"{sg.confidence}  ({', '.join(sg.reasons)})", style="dim"))
        if not e.suggestions:
            console.print(Text(f"      {_no_suggestion_text(e)}", style="dim"))
    whole = [p.id for p in report.patches if p.action == "retire"]
    single = [r for r in report.retired_upstream if r.patch not in set(whole)]
    if whole or single:
        head("retire", len(whole) + len(single), "blue")
    if whole:
        console.print(Text(f"  whole patches: {_ids(whole, 40)}"))
    for r in single:
        console.print(Text(f"  {r.patch}/{r.name}  {_loc(r.file, r.line)}  {r.detail}"))
    review = [*report.ambiguous, *report.chain_broken, *report.newly_gated]
    if review:
        head("review", len(review), "yellow")
    for r in review:
        console.print(Text(f"  {r.patch}/{r.name}  {r.pin_verdict.value}->{r.verdict.value}  {_md_cell(r.detail, 200)}"))
    if report.optional_absent:
        head("soft-skips", len(report.optional_absent), "yellow")
    for r in report.optional_absent:
        console.print(Text(f"  {r.patch}/{r.name}  pin {_loc(r.file, r.pin_line, r.pin_qualname)}  {r.detail}"))
    kept = [p.id for p in report.patches if p.action == "keep"]
    if kept:
        head("keep", len(kept), "green")
        console.print(Text(f"  {_ids(kept, 1000 if verbose else 30)}"))
    if report.newly_merged or report.newly_reverted:
        in_retired = sum(1 for m in report.newly_merged if m.patch in set(whole))
        console.print(Text(f"markers: {len(report.newly_merged)} newly merged"
                           f"{f' ({in_retired} of retired patches)' if in_retired else ''}, "
                           f"{len(report.newly_reverted)} newly reverted", style="blue"))
        if verbose:
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
            from .configrender import render_terminal as config_term

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
    console.print(f"[bold]{verdict}[/bold] (exit {s.exit_code}; fail on {', '.join(s.fail_on)}): "
                  + findings_in_words(s.findings, report.config))
