"""Deprecated import path: the preflight report was split at its seams (issue 19).

* :mod:`.models` - the JSON contract (pydantic);
* :mod:`.snapshot` - pristine snapshots of the two trees;
* :mod:`.analysis` - both plans, paired: transitions, actions, lists, exit status;
* :mod:`.hops` - ``--via``: anchors followed release by release;
* :mod:`.render` - Markdown and terminal;
* :mod:`.annotations` - SARIF and GitHub annotations;
* :mod:`.cli` - ``python -m sndr preflight``.

Every name this module had is still importable from here and from
``sndr.preflight``; new code imports from ``sndr.preflight``.
"""

from __future__ import annotations

from .analysis import exit_code, marker_changes, run_preflight
from .annotations import github_annotations, render_sarif
from .cli import build_parser, cli_main
from .models import (
    FAIL_ON_CHOICES,
    FORMAT,
    ChainBreak,
    EditEntry,
    EditRef,
    MarkerChange,
    PatchEntry,
    PatchSetInfo,
    PreflightReport,
    SuggestionModel,
    Summary,
    TreeInfo,
)
from .render import render_markdown, render_terminal, suggestion_diff
from .snapshot import Snapshot, changed_files

__all__ = [
    "PreflightReport", "PatchEntry", "EditEntry", "EditRef", "SuggestionModel", "MarkerChange", "ChainBreak",
    "Summary", "TreeInfo", "PatchSetInfo", "FAIL_ON_CHOICES", "FORMAT", "Snapshot", "changed_files",
    "run_preflight", "exit_code", "marker_changes", "render_markdown", "render_terminal", "suggestion_diff",
    "render_sarif", "github_annotations", "build_parser", "cli_main",
]

if __name__ == "__main__":  # pragma: no cover
    from ..cli import exit_with

    exit_with(cli_main)
