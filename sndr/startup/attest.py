"""Per-process attestation records: which patch set each vLLM process actually runs.

``register()`` writes one JSON record per process into the run directory
(``$SNDR_RUN_DIR``, or ``<cache>/run/<tree key>``), named ``<pid>-<start>.json``
so a recycled pid never overwrites an older record. ``python -m sndr status``
reads them. The directory is created 0700 and refused when another user
could write it: a forged record would hide an unpatched worker.
"""

from __future__ import annotations

import json
import os
import sys

from .importer import atomic_write, default_cache_root, secure_dir

FORMAT = 1


def tree_key(root: str) -> str:
    import hashlib

    return hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]


def run_dir(root: str | None, environ=None) -> str:
    """``$SNDR_RUN_DIR`` or the default for ``root`` (the directory that contains ``vllm/``)."""
    from .. import env

    environ = os.environ if environ is None else environ
    if environ.get(env.RUN_DIR):
        return os.path.abspath(environ[env.RUN_DIR])
    return os.path.join(default_cache_root(environ), "run", tree_key(root or "unknown"))


def record_path(directory: str, pid: int, start_ns: int) -> str:
    return os.path.join(directory, f"{pid}-{start_ns}.json")


def write_record(path: str, record: dict) -> None:
    secure_dir(os.path.dirname(path), "attestation")
    atomic_write(path, (json.dumps(record, sort_keys=True, indent=1) + "\n").encode())


def read_records(directory: str) -> tuple[list[dict], list[str]]:
    """(records, problems). Records are sorted by start time; unreadable files become problems."""
    records, problems = [], []
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


def process_role(argv=None) -> tuple[str, str]:
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
