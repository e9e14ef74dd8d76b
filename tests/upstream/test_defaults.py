"""sndr/upstream/defaults.py: the upstream cycle's names and defaults have one stdlib-only home, and the
engines use the very objects the command parsers print."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from sndr.upstream import decisions, defaults, queue, vendor

SRC = Path(defaults.__file__)


def test_the_engines_use_the_parsers_defaults():
    assert decisions.DECISIONS_NAME is defaults.DECISIONS_NAME
    assert queue.SYNC_CONFIG_NAME is defaults.SYNC_CONFIG_NAME
    assert vendor.DEFAULT_MAX_CONTEXT == defaults.DEFAULT_MAX_CONTEXT
    assert vendor.DEFAULT_FUZZ == defaults.DEFAULT_FUZZ


def test_defaults_import_nothing_but_the_standard_library():
    tree = ast.parse(SRC.read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    assert mods <= set(sys.stdlib_module_names) | {"__future__"}, mods
