"""A tree's ``.sndr/`` state directory: its layout, and the one ledger reader every part of sndr uses.

Stdlib and :mod:`sndr.fsio` only: this runs in every vLLM process (the startup hook reads the
ledger at each start), so it must stay cheap and import no pydantic.

Layout (``<root>/.sndr/``; :mod:`sndr.commit` describes what each file holds and writes them)::

    lock  ledger.json  journal.json  created-dirs.json  objects/<sha256>

One reader, one answer. :func:`read_ledger` (and :func:`read_ledger_at` for a caller that already
holds the directory's fd) opens ``.sndr`` through a directory handle with ``O_NOFOLLOW``, reads the
ledger as a regular file only (never a blocking open of a FIFO or device, never through a symlink,
at most :data:`MAX_STATE_BYTES`), checks its shape strictly (every key and type sndr writes, every
path a plain relative path) and its checksum, and classifies it as one :class:`LedgerState`:
``absent``, ``ok`` (with the ledger), or ``corrupt`` with a code and why. The codes:
``ledger_corrupt`` (not JSON, wrong shape, checksum mismatch), ``symlink_refused`` (``.sndr`` or the
ledger is a symlink), ``state_unsafe`` (not a directory / not a regular file, or unreadable),
``file_too_large``. The hook, ``sndr status``, the ``--verify`` fast path and
:meth:`sndr.commit.TreeRoot.read_ledger` all answer from it, so no reader accepts a ledger another
refuses (``tests/test_state.py`` hands the same bad ledgers to each).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import posixpath
import re
from collections.abc import Iterable
from typing import Any, Literal

from . import fsio

STATE_DIR = ".sndr"
LEDGER = "ledger.json"
JOURNAL = "journal.json"
OBJECTS = "objects"
LOCK = "lock"
CREATED_DIRS = "created-dirs.json"
#: Writability probes (``.sndr-probe-<pid>``) apply creates and removes; an interrupted one leaves them.
PROBE_PREFIX = ".sndr-probe-"
#: Ledgers and journals are a few KiB; a state file this large was not written by sndr.
MAX_STATE_BYTES = 64 * 2**20

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)

_LEDGER_KEYS = frozenset({"format", "patch_set_digest", "patches", "vllm_version", "files", "results", "counts",
                          "left_out", "checksum"})
_FILE_KEYS = frozenset({"pristine_sha256", "patched_sha256", "patches", "created"})


def read_only_entry(entry: Any) -> bool:
    """A ledger file entry for a file the set read and wrote nothing to (``patches`` empty, pristine and
    "patched" the same bytes, not created): its verdicts there (a merged marker present, an optional anchor
    absent, a runtime target's binding) rest on those bytes, so every reader that hashes the ledger's
    files notices the file changing. Revert never writes it; apply plans it again from its bytes as they
    are; verify and the hook report it (``read_changed``). The one definition: ``LedgerFile.read_only``
    and the dict readers (hook, status) call this."""
    get = entry.get if isinstance(entry, dict) else lambda k: getattr(entry, k)
    return not get("patches") and not get("created") and get("pristine_sha256") == get("patched_sha256")
_LEFT_OUT_KEYS = frozenset({"id", "reason", "code", "by", "on_failure"})
_LEFT_OUT_BY = ("on_failure", "keep_going", "requires")
_ON_FAILURE = ("fail", "skip")


def canonical_json(obj: Any) -> str:
    """The JSON a checksum or digest is taken over (sorted keys, no spaces, UTF-8)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def relpath_problem(path: str) -> str | None:
    """Why ``path`` is not a plain normalised relative path inside a tree, or None when it is."""
    if not path:
        return "path must not be empty"
    if "\\" in path or "\x00" in path:
        return f"path {path!r} must use '/' separators and no NUL"
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        return f"path {path!r} is absolute; paths are relative to the tree root (e.g. 'vllm/...')"
    if any(p in ("..", ".", "") for p in path.split("/")):
        return f"path {path!r} contains '..', '.' or an empty segment; it must stay inside the tree"
    if posixpath.normpath(path) != path:
        return f"path {path!r} is not normalised"
    return None


def ledger_identity(root: str | os.PathLike[str]) -> list[int] | None:
    """``[st_dev, st_ino, st_mtime_ns]`` of the tree's ledger file (None: none there). A commit writes the
    ledger anew and renames it into place, so this changes with every commit, even one that writes the same
    bytes (a revert, then a re-apply of the same set)."""
    try:
        st = os.stat(state_path(root, LEDGER), follow_symlinks=False)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_mtime_ns]


def proc_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None where
    there is no such file (not Linux, no /proc, the process gone). With the pid it names one process: a pid
    that a new process reuses (vLLM is pid 1 in every container) has another start."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            raw = f.read()
        return int(raw[raw.rindex(b")") + 2:].split()[19])  # fields after "(comm)": state is 3, starttime 22
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0); a process of another user exists too."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it exists, owned by someone else
    return True


def find_probes(root: str | os.PathLike[str], rels: Iterable[str]) -> list[tuple[str, int | None]]:
    """Writability probes (``.sndr-probe-<pid>``) in the tree root, its state directory and every
    directory holding one of ``rels``: (path, pid; None when the name carries no pid), directories in
    sorted order. What a Ctrl-C or a kill during apply's probe leaves; apply sweeps those whose
    process is gone, the ``--verify`` fast path hands any to the full verifier."""
    top = os.fspath(root)
    dirs = {top, os.path.join(top, STATE_DIR)}
    for rel in rels:
        d = posixpath.dirname(rel)
        while d:
            dirs.add(os.path.join(top, d))
            d = posixpath.dirname(d)
    out: list[tuple[str, int | None]] = []
    for d in sorted(dirs, key=lambda p: p.split(os.sep)):
        try:
            names = [e.name for e in os.scandir(d) if e.name.startswith(PROBE_PREFIX)]
        except OSError:
            continue
        for name in names:
            tail = name[len(PROBE_PREFIX):]
            out.append((os.path.join(d, name), int(tail) if tail.isascii() and tail.isdigit() else None))
    return out


class StateProblem(Exception):
    """A state file or ``.sndr`` itself sndr cannot trust or read: ``code`` (an errors.CODES key), message, path."""

    def __init__(self, code: str, message: str, path: str):
        super().__init__(f"{path}: {message}")
        self.code, self.message, self.path = code, message, path


def state_path(root: str | os.PathLike[str], name: str | None = None) -> str:
    """``<root>/.sndr`` or ``<root>/.sndr/<name>`` (for messages and existence checks only: open through fds)."""
    base = os.path.join(os.fspath(root), STATE_DIR)
    return base if name is None else os.path.join(base, name)


def open_state_dir(root: str | os.PathLike[str]) -> int | None:
    """fd of ``<root>/.sndr`` opened ``O_DIRECTORY | O_NOFOLLOW``; None when it does not exist.

    Raises :class:`StateProblem`: ``symlink_refused`` (a symlink), ``state_unsafe`` (not a directory,
    or it cannot be opened)."""
    path = state_path(root)
    try:
        return os.open(path, _DIR | _NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise StateProblem("symlink_refused", "sndr's state directory is a symlink; sndr never reads or writes "
                               "its state through a link", path) from None
        if exc.errno == errno.ENOTDIR:
            raise StateProblem("state_unsafe", "sndr's state directory is not a directory", path) from None
        raise StateProblem("state_unsafe", f"cannot open sndr's state directory: {exc.strerror}", path) from None


def read_state_file(sfd: int, name: str, path: str, max_bytes: int = MAX_STATE_BYTES) -> bytes | None:
    """Bytes of ``.sndr/<name>`` through the directory's fd ``sfd`` (no symlink, regular file only, never a
    blocking open, at most ``max_bytes``); None when it does not exist. ``path`` names it in problems.

    Raises :class:`StateProblem`: ``symlink_refused``, ``file_too_large`` or ``state_unsafe``."""
    try:
        return fsio.read_regular(name, max_bytes, f"sndr state file {name}", dir_fd=sfd, follow_symlinks=False)
    except fsio.FileProblem as exc:
        if exc.code == "not_found":
            return None
        code = exc.code if exc.code in ("symlink_refused", "file_too_large") else "state_unsafe"
        raise StateProblem(code, exc.message, path) from None


class LedgerState:
    """What a tree's ledger is: ``absent``, ``ok`` (``ledger`` holds it) or ``corrupt`` (``code``, ``why``, ``key``)."""

    __slots__ = ("kind", "path", "ledger", "code", "why", "key")

    def __init__(self, kind: Literal["absent", "ok", "corrupt"], path: str, ledger: dict[str, Any] | None = None,
                 code: str | None = None, why: str = "", key: str | None = None):
        self.kind, self.path, self.ledger, self.code, self.why, self.key = kind, path, ledger, code, why, key

    def __repr__(self) -> str:
        return f"LedgerState({self.kind!r}, code={self.code!r}, why={self.why!r})"

    def line(self) -> str:
        """One line naming the ledger, why it is unusable and the code."""
        return f"{self.path}: {self.why} ({self.code})"


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _shape_problem(led: Any) -> tuple[str, str | None] | None:
    """(why, key) when ``led`` is not exactly what sndr writes (every key, strict types), else None."""
    if not isinstance(led, dict):
        return "it is not a JSON object", None
    keys = set(led)
    if keys != _LEDGER_KEYS:
        extra, missing = sorted(keys - _LEDGER_KEYS), sorted(_LEDGER_KEYS - keys)
        return ("unexpected keys " + ", ".join(extra) if extra else "missing keys " + ", ".join(missing)), None
    if type(led["format"]) is not int or led["format"] != 1:
        return "format must be 1", "format"
    for k in ("patch_set_digest", "vllm_version", "checksum"):
        if not isinstance(led[k], str):
            return f"{k} must be a string", k
    if not _is_str_list(led["patches"]):
        return "patches must be a list of strings", "patches"
    if not isinstance(led["results"], dict) or not all(isinstance(v, str) for v in led["results"].values()):
        return "results must map patch ids to strings", "results"
    if not isinstance(led["counts"], dict) or not all(type(v) is int for v in led["counts"].values()):
        return "counts must map verdicts to integers", "counts"
    if not isinstance(led["files"], dict):
        return "files must be an object", "files"
    for rel, e in led["files"].items():
        why = relpath_problem(rel)
        if why is not None:
            return why, "files"
        if not (isinstance(e, dict) and set(e) == _FILE_KEYS and isinstance(e["pristine_sha256"], str)
                and isinstance(e["patched_sha256"], str) and _is_str_list(e["patches"])
                and isinstance(e["created"], bool)):
            return f"the entry of {rel} is not {{pristine_sha256, patched_sha256, patches, created}}", f"files.{rel}"
    if not isinstance(led["left_out"], dict):
        return "left_out must be an object", "left_out"
    for pid, e in led["left_out"].items():
        if not (isinstance(e, dict) and set(e) == _LEFT_OUT_KEYS
                and all(isinstance(e[k], str) for k in ("id", "reason", "code"))
                and e["by"] in _LEFT_OUT_BY and e["on_failure"] in _ON_FAILURE):
            return f"the left_out entry of {pid} is malformed", f"left_out.{pid}"
    return None


def check_ledger(raw: bytes, path: str) -> LedgerState:
    """Classify a ledger's bytes: ``ok``, or ``corrupt`` with ``ledger_corrupt`` (not JSON, not the shape
    sndr writes, or a checksum that does not match: edited by hand or damaged)."""
    def corrupt(why: str, key: str | None = None) -> LedgerState:
        return LedgerState("corrupt", path, code="ledger_corrupt", why=why, key=key)

    try:
        led = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return corrupt(f"ledger is not JSON ({exc})")
    shape = _shape_problem(led)
    if shape is not None:
        return corrupt(f"ledger is not an sndr ledger: {shape[0]}", shape[1])
    body = {k: v for k, v in led.items() if k != "checksum"}
    try:
        want = hashlib.sha256(canonical_json(body).encode()).hexdigest()
    except (UnicodeEncodeError, RecursionError, ValueError):  # a lone surrogate, a depth bomb
        return corrupt("ledger holds text that is not valid Unicode")
    if not led["checksum"] or want != led["checksum"]:
        return corrupt("ledger was edited by hand or damaged (its checksum does not match)", "checksum")
    return LedgerState("ok", path, ledger=led)


def read_ledger_at(sfd: int, root: str | os.PathLike[str]) -> LedgerState:
    """:func:`read_ledger` through an already open (and, by the caller, locked) ``.sndr`` fd."""
    path = state_path(root, LEDGER)
    try:
        raw = read_state_file(sfd, LEDGER, path)
    except StateProblem as exc:
        return LedgerState("corrupt", path, code=exc.code, why=exc.message)
    if raw is None:
        return LedgerState("absent", path)
    return check_ledger(raw, path)


def read_ledger(root: str | os.PathLike[str]) -> LedgerState:
    """The ledger of the tree at ``root``, classified (see the module docstring)."""
    try:
        sfd = open_state_dir(root)
    except StateProblem as exc:
        return LedgerState("corrupt", state_path(root, LEDGER), code=exc.code, why=exc.message)
    if sfd is None:
        return LedgerState("absent", state_path(root, LEDGER))
    try:
        return read_ledger_at(sfd, root)
    finally:
        os.close(sfd)
