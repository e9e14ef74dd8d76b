"""The installed vLLM (``--tree installed[:PYTHON]``): located in a child interpreter, never imported.

``find_spec`` on a top-level package only locates it; the child runs in a
neutral directory, so neither sndr's own ``sys.path`` nor a ``vllm/`` in the
caller's cwd can shadow the install. The tree itself is a
:class:`sndr.treeview.DirTree` of the directory that holds ``vllm/``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import bad_input
from .treespec import Spec
from .treeview import DirTree

__all__ = ["find_installed_root", "open_installed"]


_PROBE = r"""
import importlib.util, json
out = {}
spec = importlib.util.find_spec("vllm")
if spec is not None and spec.submodule_search_locations:
    out["package"] = list(spec.submodule_search_locations)[0]
try:
    import importlib.metadata as md
    dist = md.distribution("vllm")
    out["metadata"] = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
except Exception:
    pass
print(json.dumps(out))
"""


def _resolve_python(python: str | None) -> str:
    if python is None:
        return sys.executable
    p = Path(python).expanduser()
    if p.is_dir():  # a venv or prefix: take its interpreter
        for cand in (p / "bin" / "python", p / "bin" / "python3", p / "Scripts" / "python.exe"):
            if cand.exists():
                return str(cand)
    if not p.exists() and shutil.which(python) is None:
        raise bad_input("python_not_found", f"python interpreter {python!r} does not exist", file=python)
    return str(p) if p.exists() else str(shutil.which(python))


def _probe_installed(python: str | None = None) -> tuple[Path, str | None]:
    """(root containing vllm/, METADATA text) as seen by ``python``, without importing vLLM.

    ``find_spec`` on a top-level package only locates it. It runs in a child
    interpreter started in a neutral directory, so neither sndr's own
    ``sys.path`` nor a ``vllm/`` in the caller's cwd can shadow the install.
    """
    exe = _resolve_python(python)
    try:
        proc = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise bad_input("python_not_found", f"cannot run {exe}: {exc}", file=exe) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise bad_input("python_failed", f"{exe} could not look up vllm: {last}", file=exe)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if "package" not in found:
        raise bad_input("vllm_not_found", f"vllm is not importable by {exe}", file=exe,
                        hint="pass the interpreter of the vLLM environment: --tree installed:/path/to/python")
    return Path(found["package"]).parent, found.get("metadata")


def find_installed_root(python: str | None = None) -> Path:
    """The directory containing ``vllm/`` that ``import vllm`` would use in ``python``."""
    return _probe_installed(python)[0]


def open_installed(spec: Spec) -> DirTree:
    """``installed`` (this interpreter) or ``installed:PYTHON`` (an interpreter, a venv or a prefix)."""
    root, meta = _probe_installed(spec.arg or None)
    return DirTree(root, spec=spec.text, kind="installed", metadata=meta)
