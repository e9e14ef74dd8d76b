"""SASS digests of NVRTC builds (CPU only): the one home of what ``tq_sass_digest.py`` and ``gdn_sass_digest.py``
share.

A build is ``(label, source, name, arch, defines)``; :func:`print_digests` compiles each with
``_cudart.compile_cubin`` (no cache), disassembles it with cuobjdump and prints one line per kernel:
``<label> <function> <sha256 of its SASS, 16 hex> <instructions>``. Addresses and the source hash do not
enter SASS, so equal digests mean equal instructions; diff two runs (old tree, new tree) to show that a
source refactor left the machine code unchanged.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "tests" / "kernels")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from sndr.kernels import _cudart  # noqa: E402

Build = tuple[str, str, str, str, dict]


def cuobjdump() -> str:
    """The cuobjdump the kernel tests use (``test_mtp_verify._cuobjdump``: triton's, else PATH's)."""
    from test_mtp_verify import _cuobjdump  # the one home of the cubin tools' lookup

    return _cuobjdump() or "cuobjdump"


def sass_by_function(cubin: bytes) -> dict[str, str]:
    """Each kernel's SASS (the instruction lines, whitespace collapsed), by function name."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\w+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
        elif cur and re.match(r"\s*/\*[0-9a-f]{4}\*/", line):
            # (whitespace collapsed: cuobjdump pads the columns to the widest instruction of the whole cubin, so
            # removing another kernel from a module would otherwise change every line)
            out[cur].append(" ".join(line.split()))
    return {k: "\n".join(v) for k, v in out.items()}


def digest(sass: str) -> str:
    return hashlib.sha256(sass.encode()).hexdigest()[:16]


def print_digests(builds: Iterable[Build], only: str = "") -> int:
    """One line per kernel of every build whose label contains ``only``; returns the builds compiled."""
    n = 0
    for label, src, name, arch, defs in builds:
        if only not in label:
            continue
        fns = sass_by_function(_cudart.compile_cubin(src, name, arch, defs, cache=False))
        if not fns:
            raise SystemExit(f"{label}: cuobjdump found no function in the cubin")
        for fn, sass in sorted(fns.items()):
            print(f"{label} {fn} {digest(sass)} {len(sass.splitlines())}", flush=True)
        n += 1
    print(f"{n} builds, NVRTC {_cudart.nvrtc_version()}", file=sys.stderr)
    return n
