"""Per-process attestation records: which patch set each vLLM process actually runs.

``register()`` writes one JSON record per process into the run directory
(``$SNDR_RUN_DIR``, or ``<cache>/run/<tree key>``), named ``<pid>-<start>.json``
so a recycled pid never overwrites an older record. ``python -m sndr status``
reads them. The directory is created 0700 and refused when another user
could change it or any directory on its path (a forged record would hide an
unpatched worker); records are written through its held fd.

A record says which enabled set the process resolved (``patch_set_digest``), which
ledger the tree held when it registered (``ledger_digest``) and the sha256 of every
file that ledger names as the process saw it (``files``): ``sndr status`` compares
those with the tree as it is now, so a re-apply under a live process is a finding.
Records are read bounded and never through a FIFO, device or symlink, and their
shape is validated (:func:`validate_record`) before any field is trusted.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from .hookcache import default_cache_root, open_private

#: 2: ``files`` (per-file sha256 the process verified) added; a format-1 record is an older sndr's.
FORMAT = 2
#: A record is a few KB (its runtime outcomes, its problems); anything past this is not one of ours.
MAX_RECORD_BYTES = 1 << 20
MODES = ("disk", "memory", "none")


def missing_patch_id(entry: str) -> str:
    """The patch a ``missing_required`` entry names: entries read ``<id>: <why>`` or ``<id>/<edit>: <why>``
    (a runtime edit). The one reading of them: status's line and the metrics' gauges count the same."""
    return entry.split(":", 1)[0].split("/", 1)[0]


def tree_key(root: str) -> str:
    import hashlib

    return hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]


def run_dir(root: str | None, environ: Mapping[str, str] | None = None) -> str:
    """``$SNDR_RUN_DIR`` or the default for ``root`` (the directory that contains ``vllm/``)."""
    from .. import env

    environ = os.environ if environ is None else environ
    if environ.get(env.RUN_DIR):
        return os.path.abspath(environ[env.RUN_DIR])
    return os.path.join(default_cache_root(environ), env.CACHE_RUN, tree_key(root or "unknown"))


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


def _dead_by_name(name: str) -> bool:
    """Whether a record file named ``<pid>-<start>.json`` names a process that no longer runs (a name that
    does not say: False)."""
    from ..state import pid_alive

    head = name.split("-", 1)[0]
    return head.isdigit() and int(head) > 0 and not pid_alive(int(head))


def read_records(directory: str, *, live: bool = False,
                 prune: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    """(records, problems). Records are sorted by start time.

    Every ``*.json`` is read bounded (:data:`MAX_RECORD_BYTES`), never through a
    symlink, a FIFO or a device (those are refused without blocking), and its shape
    is validated (:func:`validate_record`); a file that is not a valid record
    becomes a problem naming it, never a record.
    """
    from ..fsio import FileProblem, read_regular

    records: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{directory}: cannot list the attestation directory ({exc.strerror})"]
    for n in names:
        p = os.path.join(directory, n)
        try:
            raw = read_regular(p, MAX_RECORD_BYTES, "attestation record", follow_symlinks=False)
            rec = json.loads(raw)
        except FileProblem as exc:
            problems.append(f"{p}: unreadable attestation ({exc.message}, {exc.code})")
            continue
        except (ValueError, RecursionError) as exc:
            problems.append(f"{p}: unreadable attestation (not JSON: {exc})")
            continue
        why = validate_record(rec, n)
        if why is not None:
            if (live or prune) and _dead_by_name(n):
                # a record another sndr version wrote for a process gone since: --live leaves it out and
                # --prune removes it, as they do a valid record of an exited process
                if prune:
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
                continue
            problems.append(f"{p}: not a valid attestation record ({why}); no process is attested by it")
            continue
        rec["_path"] = p
        records.append(rec)
    records.sort(key=lambda r: (r["start"], r["pid"]))
    return records, problems


def validate_record(rec: object, name: str | None = None) -> str | None:
    """None when ``rec`` has the shape :meth:`sndr.startup.hook._Process.record` writes; else why not.

    Checked with :class:`sndr.model.AttestationRecord` (pydantic in strict mode: no coercion, a pid
    ``"12"`` or ``true`` is not an int), plus what a type cannot say: the pid is a real process id (> 0; ``-1`` would
    make ``kill(pid, 0)`` probe every process) and matches the file name
    ``<pid>-<start>.json``.
    """
    from ..model import attestation_problem  # pydantic: status only, never register()

    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    if rec.get("format") != FORMAT:
        return (f"format {rec.get('format')!r}, this sndr reads format {FORMAT}: written by another sndr version; "
                f"restart the process so it attests again")
    why = attestation_problem(rec)
    if why is not None:
        return why
    if name is not None and not name.startswith(f"{rec['pid']}-"):
        return f"its pid {rec['pid']} is not the one its file name {name} says"
    return None


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
