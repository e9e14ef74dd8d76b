"""Making a plan real on disk: lock, journal, atomic replace, fsync, ledger, recovery.

Layout of the state directory, ``<root>/.sndr/`` (``root`` contains ``vllm/``)::

    lock           fcntl lock: exclusive for writers, shared for verify
    ledger.json    per touched file: pristine sha256, patched sha256, patches
    journal.json   present only while a commit is in flight
    objects/<sha>  content-addressed copies of pristine and before-commit bytes

Protocol of :func:`commit` (check everything, then touch anything):
probe writability -> re-check the before-hashes -> store before-bytes as
objects -> write the journal -> per file: temp write + fsync + ``os.replace``
-> fsync dirs -> drop stale ``.pyc`` -> write the ledger -> remove the journal.
A crash anywhere leaves the journal behind, and :func:`recover` (run by the
next writer or verifier) restores every file to its before-bytes: the tree is
then exactly as it was before the interrupted commit, never in between.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from . import env as envmod
from .errors import EXIT_BAD_INPUT, Problem, SndrError
from .model import Ledger

STATE_DIR = ".sndr"
# The largest vLLM 0.33.0 .py file is under 1 MiB; anything near this limit is not source.
MAX_TARGET_BYTES = 16 * 2**20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fault(point: str) -> None:
    """Test-only crash injection: SIGKILL ourselves at the named commit step.

    ``SNDR_TEST_FAULT=<point>`` is read by the reliability harness only; with
    the variable unset this is one dict lookup.
    """
    if os.environ.get(envmod.FAULT) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_tmp(path: Path, data: bytes, mode: int | None = None) -> Path:
    """Write ``data`` to the temp file beside ``path`` (not yet fsynced)."""
    tmp = path.with_name(f".{path.name}.sndr-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if mode is not None:
        os.chmod(tmp, mode)
    return tmp


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_files(paths: list[Path], dirs: bool = False) -> None:
    """fsync many files at once. Concurrent fsyncs share journal commits on
    ext4/xfs, so a 16-file commit costs a few flushes instead of sixteen."""
    fn = _fsync_dir if dirs else _fsync_path
    if len(paths) <= 1:
        for p in paths:
            fn(p)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
        list(pool.map(fn, paths))


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to a temp file beside ``path``, fsync it, then ``os.replace``."""
    tmp = _write_tmp(path, data, mode)
    _fsync_path(tmp)
    os.replace(tmp, path)


class TreeRoot:
    """The on-disk side of one tree: safe paths, the state directory, the lock."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        if not (self.root / "vllm").is_dir():
            raise SndrError(Problem("not_a_tree", "directory does not contain a vllm/ package", file=str(self.root),
                                    hint="pass the site-packages directory or the checkout root that contains vllm/"))
        self.real_root = Path(os.path.realpath(self.root))
        self.state = self.root / STATE_DIR
        self.objects = self.state / "objects"
        self.ledger_path = self.state / "ledger.json"
        self.journal_path = self.state / "journal.json"

    # -- paths -------------------------------------------------------------

    def path(self, rel: str) -> Path:
        """Absolute path of ``rel``; refuses anything that resolves outside the root."""
        p = self.root / rel
        real = os.path.realpath(p)
        if real != str(self.real_root) and not real.startswith(str(self.real_root) + os.sep):
            raise SndrError(Problem("path_escape", f"resolves outside the tree (to {real}) through a symlink or '..'",
                                    file=rel, hint="sndr never writes outside the tree root"))
        return p

    def read_bytes(self, rel: str) -> bytes | None:
        p = self.path(rel)
        try:
            size = p.stat().st_size
            if size > MAX_TARGET_BYTES and p.is_file():
                raise SndrError(Problem("file_too_large", f"target is {size / 2**20:.0f} MiB; sndr patches source files "
                                        f"up to {MAX_TARGET_BYTES // 2**20} MiB", file=rel,
                                        hint="a vLLM source file this large is not source; check the patch's path"))
            return p.read_bytes()
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise SndrError(Problem("not_a_file", "target is a directory, not a file", file=rel)) from None
        except OSError as exc:
            raise SndrError(Problem("unreadable", f"cannot read: {exc.strerror}", file=rel)) from None

    def read_text(self, rel: str) -> str | None:
        data = self.read_bytes(rel)
        return None if data is None else decode(data, rel)

    # -- objects -----------------------------------------------------------

    def put_object(self, data: bytes) -> str:
        return self.put_objects([data])[0]

    def put_objects(self, blobs: list[bytes]) -> list[str]:
        """Store blobs content-addressed; durable (fsynced) before this returns."""
        shas = [sha256_bytes(b) for b in blobs]
        staged: list[tuple[Path, Path]] = []
        seen: set[str] = set()
        for sha, data in zip(shas, blobs):
            target = self.objects / sha
            if sha in seen or target.exists():
                continue
            seen.add(sha)
            self.objects.mkdir(parents=True, exist_ok=True)
            staged.append((_write_tmp(target, data), target))
        if staged:
            _fsync_files([tmp for tmp, _ in staged])
            for tmp, target in staged:
                os.replace(tmp, target)
            _fsync_dir(self.objects)
        return shas

    def get_object(self, sha: str) -> bytes:
        try:
            data = (self.objects / sha).read_bytes()
        except OSError:
            raise SndrError(Problem("object_missing", f"stored copy {sha[:12]} is missing",
                                    file=str(self.objects / sha),
                                    hint="the .sndr state was damaged; reinstall vLLM to get a pristine tree")) from None
        if sha256_bytes(data) != sha:
            raise SndrError(Problem("object_corrupt", f"stored copy {sha[:12]} does not match its hash",
                                    file=str(self.objects / sha)))
        return data

    # -- ledger ------------------------------------------------------------

    def read_ledger(self) -> Ledger | None:
        try:
            raw = self.ledger_path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            ledger = Ledger.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise SndrError(Problem("ledger_corrupt", f"ledger is corrupt or was edited by hand: {first.get('msg')}",
                                    file=str(self.ledger_path), key=".".join(map(str, first.get("loc", ()))) or None,
                                    hint="run --revert --force to restore pristine files from .sndr/objects, "
                                         "or reinstall vLLM and delete .sndr/")) from None
        if ledger.checksum != ledger.compute_checksum():
            raise SndrError(Problem("ledger_corrupt", "ledger was edited by hand (its checksum does not match)",
                                    file=str(self.ledger_path),
                                    hint="restore it, or run --revert --force to return to pristine from .sndr/objects"))
        return ledger

    def pristine_bytes(self, rel: str, ledger: Ledger | None) -> bytes | None:
        if ledger is not None and rel in ledger.files:
            entry = ledger.files[rel]
            return None if entry.created else self.get_object(entry.pristine_sha256)
        return self.read_bytes(rel)

    # -- lock --------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, shared: bool = False):
        """fcntl lock on ``.sndr/lock``: exclusive for writers, shared for readers.

        Shared locks matter: a verify racing a revert must see the tree
        before or after the revert, never in between.
        """
        if shared and not self.state.exists():
            yield False  # readers never create state; see run_verify for the re-check
            return
        try:
            self.state.mkdir(exist_ok=True)
            fd = os.open(self.state / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if shared and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                yield False  # read-only tree: nobody can be writing it
                return
            raise read_only_error(self.state, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            if not shared:
                _fault("after_lock")
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def decode(data: bytes, rel: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SndrError(Problem("not_utf8", f"file is not valid UTF-8 (byte {exc.start})", file=rel, line=line,
                                hint="sndr patches UTF-8 source only")) from None


def read_only_error(path: Path, exc: OSError) -> SndrError:
    return SndrError(Problem("read_only", f"cannot write: {exc.strerror}", file=str(path),
                             hint="the tree is read-only; use the in-memory hook (python -m sndr hook install)"),
                     EXIT_BAD_INPUT)


# ----------------------------------------------------------------------------- commit


@dataclass
class FileWrite:
    rel: str
    before: bytes | None  # None: the file does not exist now
    after: bytes | None  # None: delete the file (revert of a created file)


def probe_writable(tree: TreeRoot, writes: list[FileWrite]) -> None:
    """Refuse before touching anything, naming the first unwritable path.

    Opens files for writing and creates a probe in each directory instead of
    ``os.access``, which ignores root's override and read-only mounts.
    """
    # Before first contact the state dir does not exist yet: probe its parent
    # instead of creating it, so a refusal leaves no trace.
    dirs: list[Path] = [tree.state if tree.state.exists() else tree.root]
    for w in writes:
        p = tree.path(w.rel)
        if p.is_dir():
            raise SndrError(Problem("not_a_file", "target is a directory, not a file", file=w.rel))
        if w.before is not None:
            try:
                with open(p, "r+b"):
                    pass
            except OSError as exc:
                raise read_only_error(p, exc) from None
        d = p.parent
        while not d.exists():  # a created file may need new directories
            d = d.parent
        if d not in dirs:
            dirs.append(d)
    for d in dirs:
        probe = d / f".sndr-probe-{os.getpid()}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise read_only_error(d, exc) from None


def commit(tree: TreeRoot, writes: list[FileWrite], ledger: Ledger | None, digest: str) -> None:
    """Make ``writes`` and the new ``ledger`` (None: remove it) real, atomically as a set.

    The caller holds the exclusive lock and has run :func:`recover`.
    """
    for w in writes:  # the world may have moved since the plan was read
        now = tree.read_bytes(w.rel)
        if now != w.before:
            raise SndrError(Problem("changed_during_apply", "file changed or vanished between plan and commit",
                                    file=w.rel, hint="re-run; nothing was written"))
    probe_writable(tree, writes)
    old_ledger = tree.ledger_path.read_bytes() if tree.ledger_path.exists() else None
    befores = tree.put_objects([w.before for w in writes if w.before is not None]
                               + ([old_ledger] if old_ledger is not None else []))
    it = iter(befores)
    entries = [{"path": w.rel,
                "before": next(it) if w.before is not None else None,
                "after": sha256_bytes(w.after) if w.after is not None else None} for w in writes]
    journal = {"format": 1, "digest": digest, "files": entries,
               "ledger_before": next(it) if old_ledger is not None else None}
    atomic_write(tree.journal_path, json.dumps(journal, indent=1).encode())
    _fsync_dir(tree.state)
    _fault("after_journal")
    try:
        # Stage every temp file, make them durable together, then swap them in.
        staged: list[tuple[int, Path, Path | None]] = []
        for i, w in enumerate(writes):
            p = tree.path(w.rel)
            tmp = None
            if w.after is not None:
                p.parent.mkdir(parents=True, exist_ok=True)
                mode = p.stat().st_mode & 0o7777 if p.exists() else None
                tmp = _write_tmp(p, w.after, mode)
                _fault(f"after_tmp:{i}")
            staged.append((i, p, tmp))
        _fsync_files([tmp for _, _, tmp in staged if tmp is not None])
        touched_dirs: set[Path] = set()
        for i, p, tmp in staged:
            if tmp is None:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            else:
                os.replace(tmp, p)
            _fault(f"after_replace:{i}")
            touched_dirs.add(p.parent)
            drop_pyc(p)
        _fsync_files(sorted(touched_dirs), dirs=True)
        _fault("before_ledger")
        if ledger is None:
            with contextlib.suppress(FileNotFoundError):
                tree.ledger_path.unlink()
        else:
            atomic_write(tree.ledger_path, ledger.model_dump_json(indent=1).encode())
        _fsync_dir(tree.state)
        _fault("after_ledger")
    except BaseException:
        recover(tree)
        raise
    tree.journal_path.unlink()
    _fsync_dir(tree.state)
    _fault("after_commit")


def drop_pyc(path: Path) -> None:
    """Remove stale bytecode of ``path`` so no process runs the old code."""
    cache = path.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(path.stem + ".*.pyc"):
            with contextlib.suppress(OSError):
                pyc.unlink()


def recover(tree: TreeRoot) -> list[str]:
    """Roll an interrupted commit back from its journal. Returns the files restored.

    Every journaled file must currently hold either its before-bytes or its
    after-bytes; anything else means the journal does not describe this tree
    (copied from elsewhere, or a different patch set), and we refuse rather
    than guess, leaving every byte as it is.
    """
    try:
        raw = tree.journal_path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        journal = json.loads(raw)
        files = journal["files"]
        assert isinstance(files, list)
    except (ValueError, KeyError, AssertionError, TypeError):
        raise SndrError(Problem("journal_corrupt", "journal of an interrupted commit is unreadable",
                                file=str(tree.journal_path),
                                hint="inspect it; the before-bytes are in .sndr/objects")) from None
    plan: list[tuple[str, bytes | None]] = []
    for e in files:
        rel, before, after = e.get("path"), e.get("before"), e.get("after")
        now = tree.read_bytes(rel)
        now_sha = sha256_bytes(now) if now is not None else None
        if now_sha not in (before, after):
            raise SndrError(Problem("journal_mismatch",
                                    "journal does not match the tree: the file holds neither its before- nor its after-bytes",
                                    file=rel, hint=f"the journal at {tree.journal_path} belongs to another tree or patch set; "
                                                   "remove it only after checking the tree by hand"))
        want = tree.get_object(before) if before is not None else None
        plan.append((rel, want))
    restored = []
    for rel, want in plan:
        p = tree.path(rel)
        tmp = p.with_name(f".{p.name}.sndr-tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        now = tree.read_bytes(rel)
        if now == want:
            continue
        if want is None:
            p.unlink()
        else:
            mode = p.stat().st_mode & 0o7777 if p.exists() else None
            atomic_write(p, want, mode=mode)
        drop_pyc(p)
        _fsync_dir(p.parent)
        restored.append(rel)
    lb = journal.get("ledger_before")
    if lb is None:
        with contextlib.suppress(FileNotFoundError):
            tree.ledger_path.unlink()
    else:
        atomic_write(tree.ledger_path, tree.get_object(lb))
    _fsync_dir(tree.state)
    tree.journal_path.unlink()
    _fsync_dir(tree.state)
    return restored
