"""The bump preflight: classify the patch set on the pin and a candidate tree.

* :mod:`.models` - the JSON contract (pydantic);
* :mod:`.snapshot` - pristine snapshots of the two trees;
* :mod:`.analysis` - both plans, paired: transitions, actions, lists, exit status;
* :mod:`.hops` - ``--via``: anchors followed release by release;
* :mod:`.render` - Markdown and terminal;
* :mod:`.annotations` - SARIF and GitHub annotations;
* the command, ``python -m sndr preflight``: :mod:`sndr.commands.preflight`;
* :mod:`.suggest` - where drifted code most likely went;
* :mod:`.configdrift` - configuration drift between two trees (:mod:`.configmodels` the models and
  watch list, :mod:`.configsource` the static readers, :mod:`.configrender` the rendering).

``from sndr.preflight import run_preflight`` (and the other public names in
:data:`_HOME`) keeps working; each name is loaded from its home module on first
use, so importing :mod:`sndr.preflight.suggest` alone never pays for the report.
"""

from __future__ import annotations

import importlib

# public name -> the submodule that defines it
_HOME: dict[str, str] = {
    **dict.fromkeys(("exit_code", "marker_changes", "run_preflight"), ".analysis"),
    **dict.fromkeys(("github_annotations", "render_sarif"), ".annotations"),
    **dict.fromkeys(("FAIL_ON_CHOICES", "FORMAT", "ChainBreak", "EditEntry", "EditRef", "MarkerChange", "PatchEntry",
                     "PatchSetInfo", "PreflightReport", "SuggestionModel", "Summary", "TreeInfo"), ".models"),
    **dict.fromkeys(("render_markdown", "render_terminal", "suggestion_diff"), ".render"),
    **dict.fromkeys(("Snapshot", "changed_files"), ".snapshot"),
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value
