"""Terminal rendering of apply/verify/revert reports (rich)."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from .model import Report

_STYLE = {"applies": "cyan", "applied": "green", "merged": "blue", "drifted": "red", "ambiguous": "red",
          "optional_absent": "yellow", "file_missing": "red", "gated": "dim", "failed": "red", "partial": "yellow",
          "conflict": "red", "nothing_to_do": "yellow", "left_out": "red", "not_applied": "red"}


def print_report(report: Report, verbose: bool = False, console: Console | None = None) -> None:
    console = console or make_console()
    head = f"sndr {report.mode}: {report.tree}"
    if report.vllm_version:
        head += f" (vllm {report.vllm_version})"
    console.print(f"[bold]{head}[/bold]")
    if report.counts:
        names = edit_names(report)
        t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        t.add_column("verdict")
        t.add_column("edits", justify="right")
        t.add_column("which")
        for k, v in report.counts.items():
            t.add_row(f"[{_STYLE.get(k, '')}]{k}[/]", str(v), _which(k, names.get(k, []), verbose))
        console.print(t)
    for p in report.patches:
        interesting = p.status not in ("applies", "applied") or verbose
        if not interesting:
            continue
        style = _STYLE.get(p.status, "")
        console.print(f"  [{style}]{p.id:<10} {p.status:<8}[/] {_esc(p.title)}" + (f" - {_esc(p.reason)}" if p.reason
                                                                                  else ""), markup=True)
        for e in p.edits:
            if verbose or e.verdict.value in ("drifted", "ambiguous", "file_missing", "optional_absent", "conflict"):
                loc = f"{e.file}:{e.line}" if e.line else e.file
                q = f" in {e.qualname}" if e.qualname else ""
                console.print(f"      {_esc(e.name)}: [{_STYLE.get(e.verdict.value, '')}]{e.verdict.value}[/] "
                              f"{_esc(loc)}{_esc(q)}" + (f" - {_esc(e.reason)}" if e.reason else ""))
                for l in e.locations[1:] if e.verdict.value == "ambiguous" else []:
                    console.print(f"        also at {_esc(f'{l.file}:{l.line} {l.qualname}')}")
    for pr in report.problems:
        where = pr.file or ""
        if where and pr.line:
            where += f":{pr.line}"
        who = f"{pr.patch}: " if pr.patch else ""
        console.print(f"  [red]error[/] {_esc(where + ': ' if where else '')}{_esc(who)}{_esc(pr.message)} ({pr.code})")
        if pr.hint:
            console.print(f"        hint: {_esc(pr.hint)}")
    if report.files_written:
        verb = "would write" if report.mode == "dry-run" else "wrote"
        written = report.files_written
        which = f": {', '.join(written)}" if verbose or len(written) <= 8 else " (-v names them)"
        console.print(f"{verb} {len(written)} file(s){_esc(which)}")
    for n in report.notes:
        console.print(f"note: {_esc(n)}")
    status = "ok" if report.ok else f"FAILED (exit {report.exit_code})"
    # The digest of the *enabled* patches (what the ledger and every process attest), not of
    # the whole set as the preflight and `sndr list` show it: named apart everywhere.
    digest = f"  enabled set {report.patch_set_digest[:12]}" if report.patch_set_digest else ""
    if report.mode == "revert" and report.patch_set_digest and report.ok:
        digest = (f"  reverted enabled set {report.patch_set_digest[:12]}: "
                  f"{len(report.files_written)} file(s) restored")
    console.print(f"[bold]{status}[/bold]{digest}")


#: Width of a console that is not a terminal (a pipe, a file, a CI log) when COLUMNS is not set: where a long
#: cell wraps. Wide, so that a dependency pin or a path stays whole in its cell (rich's 80 broke them mid-word;
#: 120 still broke the 0.32.0 -> 0.33.0 preflight's dependency table, 149 columns); lines are never padded to
#: it (:class:`_Unpadded`), so a line is as long as what it says.
PIPE_WIDTH = 240


def console_width(target: Any) -> int:
    """The width sndr renders for on ``target``, by :func:`shutil.get_terminal_size`'s rule applied to the
    stream written to: ``COLUMNS`` when it is a positive number, else the terminal's width when ``target`` is
    a terminal, else :data:`PIPE_WIDTH`. (shutil asks stdout only; a report on stderr asks stderr.)"""
    import os

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if _isatty(target):
        try:
            return os.get_terminal_size(target.fileno()).columns or PIPE_WIDTH
        except (AttributeError, ValueError, OSError):
            pass
    return PIPE_WIDTH


def _isatty(target: Any) -> bool:
    try:
        return bool(target.isatty())
    except (AttributeError, ValueError):
        return False


class _Unpadded:
    """A stream that is not a terminal, as rich writes to it: each line without the spaces rich pads a table's
    cells with to the table's width (in a log every wrapped row was padded to the full width)."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def write(self, text: str) -> int:
        import re

        return int(self._target.write(re.sub(r"[ \t]+(?=\n)", "", text)) or 0)

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:  # flush, fileno, encoding: the stream's own
        return getattr(self._target, name)


def make_console(*, stderr: bool = False, file: Any = None) -> Any:
    """The one way sndr builds a rich Console: no highlighting, soft-wrapped text, :func:`console_width`
    columns, and off a terminal no trailing padding on any line (:class:`_Unpadded`)."""
    from rich.console import Console

    target = file if file is not None else (sys.stderr if stderr else sys.stdout)
    width = console_width(target)
    if not _isatty(target):
        target = _Unpadded(target)
    return Console(file=target, highlight=False, soft_wrap=True, width=width)


def _esc(text: str) -> str:
    """User text (messages, reasons, paths, notes) printed through rich: ``[id]`` is text, not markup."""
    from rich.markup import escape

    return escape(text)


#: Verdicts a count of which is named edit by edit (the ordinary outcomes are not).
_ORDINARY = ("applies", "applied")


def edit_names(report: Report) -> dict[str, list[str]]:
    """verdict -> ``PATCH/edit`` names behind its count; a gated patch without edits is named by its id."""
    out: dict[str, list[str]] = {}
    for p in report.patches:
        if p.status == "gated" and not p.edits:
            out.setdefault("gated", []).append(p.id)
        for e in p.edits:  # an edit in a file that fails its ledger hash is counted not_applied (verify)
            key = "not_applied" if e.reason_code == "hash_mismatch" else e.verdict.value
            out.setdefault(key, []).append(f"{e.patch}/{e.name}")
    return out


def _which(verdict: str, names: list[str], verbose: bool, limit: int = 6) -> str:
    if verdict in _ORDINARY and not verbose:
        return ""
    if not names:
        return "" if verdict in _ORDINARY else "(-v names them)"
    if verbose or len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f" and {len(names) - limit} more (-v lists all)"
