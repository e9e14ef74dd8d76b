"""The bump preflight: classify the patch set on the pin and a candidate tree.

* :mod:`.report` - the report models, the analysis, the renderers and the CLI;
* :mod:`.suggest` - where drifted code most likely went;
* :mod:`.configdrift` - configuration drift between two trees.

``from sndr.preflight import run_preflight`` (and the other public names of
:mod:`.report`) keeps working; the names are loaded on first use, so importing
:mod:`sndr.preflight.suggest` alone never pays for the report module.
"""

from __future__ import annotations

import importlib


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    report = importlib.import_module(".report", __name__)
    try:
        return getattr(report, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
