"""Every reason code sndr raises is registered in ``sndr.errors.CODES`` (issue 19 s.4).

An AST scan of ``sndr/``: ``Problem(code, ...)``, ``Problem(code=...)``,
``bad_input(code, ...)``, ``FileProblem(code, ...)`` and ``Finding(code=...)``
with a literal code (an f-string's fixed prefix is not a code and is skipped,
by name, below). ``python -m sndr schema codes`` prints the registry.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from sndr.errors import CODES
from source_scan import parse

SNDR = Path(__file__).resolve().parents[1] / "sndr"
#: Constructors whose first positional argument (or ``code=``) is a reason code.
CALLS = {"Problem": 0, "bad_input": 0, "FileProblem": 0, "Finding": None}


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def raised_codes() -> dict[str, list[str]]:
    """code -> ['path:line', ...] for every literal code passed to a constructor in CALLS."""
    out: dict[str, list[str]] = {}
    for path in sorted(SNDR.rglob("*.py")):
        tree = parse(path)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or _name(node.func) not in CALLS:
                continue
            pos = CALLS[_name(node.func)]
            arg = None
            for kw in node.keywords:
                if kw.arg == "code":
                    arg = kw.value
            if arg is None and pos is not None and len(node.args) > pos:
                arg = node.args[pos]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value:
                out.setdefault(arg.value, []).append(f"{path.relative_to(SNDR.parent)}:{node.lineno}")
    return out


def test_the_scan_sees_the_codes_it_should():
    found = raised_codes()
    # Sanity: the scan is not vacuous; these are raised in the core, the CLI and the tree views.
    for code in ("modified_since_apply", "empty_patch_set", "tree_not_found", "ledger_stale", "not_utf8"):
        assert code in found, code
    assert len(found) > 60


def test_every_raised_code_is_registered():
    missing = {code: where for code, where in raised_codes().items() if code not in CODES}
    assert not missing, "register these in sndr/errors.py CODES (code, exit status, meaning):\n" + "\n".join(
        f"  {code}: {', '.join(where)}" for code, where in sorted(missing.items()))


def test_every_registered_code_has_an_exit_status_and_a_meaning():
    for code, entry in CODES.items():
        assert entry.exit in (1, 2, 3) or (code, entry.exit) == ("interrupted", 130), code  # 130: Ctrl-C (README)
        assert entry.meaning and not entry.meaning.endswith("."), code


def test_schema_codes_prints_the_registry():
    out = subprocess.run([sys.executable, "-m", "sndr", "schema", "codes"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()
    assert rows[0].split() == ["code", "exit", "meaning"]
    assert len(rows) == len(CODES) + 1
    line = next(r for r in rows if r.startswith("empty_patch_set "))
    assert line.split()[1] == "2" and CODES["empty_patch_set"].meaning in line
    js = subprocess.run([sys.executable, "-m", "sndr", "schema", "codes", "--json", "-"], capture_output=True, text=True)
    data = json.loads(js.stdout)
    assert data["modified_since_apply"] == {"exit": 1, "meaning": CODES["modified_since_apply"].meaning}
