"""Per-process attestation records: which patch set each vLLM process actually runs.

``register()`` writes one JSON record per process into the run directory
(``$SNDR_RUN_DIR``, or ``<cache>/run/<tree key>``), named ``<pid>-<start>.json``
so a recycled pid never overwrites an older record. ``python -m sndr status``
reads them. The directory is created 0700 and refused when another user
could change it or any directory on its path (a forged record would hide an
unpatched worker); records are written through its held fd.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from .importer import default_cache_root, open_private

FORMAT = 1


def tree_key(root: str) -> str:
    import hashlib

    return hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]


def run_dir(root: str | None, environ: Mapping[str, str] | None = None) -> str:
    """``$SNDR_RUN_DIR`` or the default for ``root`` (the directory that contains ``vllm/``)."""
    from .. import env

    environ = os.environ if environ is None else environ
    if environ.get(env.RUN_DIR):
        return os.path.abspath(environ[env.RUN_DIR])
    return os.path.join(default_cache_root(environ), "run", tree_key(root or "unknown"))


def record_path(directory: str, pid: int, start_ns: int) -> str:
    return os.path.join(directory, f"{pid}-{start_ns}.json")


_DIRS: dict[str, Any] = {}


def write_record(path: str, record: dict[str, Any]) -> None:
    """Write one record through the run directory's held fd (see :class:`sndr.fsio.PrivateDir`).

    The directory is walked and checked once per process; a swap of it or of
    any directory on its path afterwards cannot redirect the write.
    """
    directory, name = os.path.split(path)
    d = _DIRS.get(directory)
    if d is None or d.fd < 0:
        d = _DIRS[directory] = open_private(directory, "attestation")
    d.write(name, (json.dumps(record, sort_keys=True, indent=1) + "\n").encode(), mode=0o600)


def read_records(directory: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(records, problems). Records are sorted by start time; unreadable files become problems."""
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except FileNotFoundError:
        return [], []
    for n in names:
        p = os.path.join(directory, n)
        try:
            with open(p, "rb") as fh:
                rec = json.loads(fh.read())
            if not isinstance(rec, dict) or rec.get("format") != FORMAT or "pid" not in rec:
                raise ValueError("not an sndr attestation record")
        except (OSError, ValueError) as exc:
            problems.append(f"{p}: unreadable attestation ({exc})")
            continue
        rec["_path"] = p
        records.append(rec)
    records.sort(key=lambda r: (r.get("start", 0), r.get("pid", 0)))
    return records, problems


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_role(argv: list[str] | None = None) -> tuple[str, str]:
    """(role, raw process name). Roles: api_server, engine_core, worker, main, or the raw name.

    vLLM names its multiprocessing children (``EngineCore_DP0``, ``VllmWorker-0``,
    ...); the front end is the main process of ``vllm serve``.
    """
    mp = sys.modules.get("multiprocessing")
    name = ""
    if mp is not None:
        try:
            name = mp.current_process().name
        except Exception:  # noqa: BLE001
            name = ""
    low = name.lower()
    if "enginecore" in low.replace("_", "") or "engine_core" in low:
        return "engine_core", name
    if "worker" in low:
        return "worker", name
    if name in ("", "MainProcess"):
        argv = sys.argv if argv is None else argv
        joined = " ".join(str(a) for a in argv[:3])
        if "serve" in joined or "api_server" in joined:
            return "api_server", name or "MainProcess"
        return "main", name or "MainProcess"
    return name, name
