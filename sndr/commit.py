"""Making a plan real on disk: lock, journal, atomic replace, fsync, ledger, recovery.

Layout of the state directory, ``<root>/.sndr/`` (``root`` contains ``vllm/``)::

    lock              fcntl lock: exclusive for writers, shared for verify
    ledger.json       per touched file: pristine sha256, patched sha256, patches
    journal.json      present only while a commit is in flight
    created-dirs.json directories sndr created for ``create`` files (removed again on revert)
    objects/<sha>     content-addressed copies of pristine bytes (what revert puts back), of the
                      patched bytes apply writes (``apply --force``'s merge base), of before-commit
                      bytes, and of every ledger written (``sndr salvage-ledger`` finds the last one
                      that matches the tree); nothing removes them

Protocol of :func:`commit` (check everything, then touch anything):
probe writability -> re-check the before-hashes -> store before-bytes as
objects -> write the journal -> per file: temp write + fsync -> per file: swap
the temp file in with ``renameat2(RENAME_EXCHANGE)`` (what was at the path comes
out under the temp name; fallback: hard link of the old inode + ``rename``) and
drop its stale ``.pyc`` -> compare every file taken off a path with the one
planned from (inode and bytes, under a read lease) -> fsync dirs -> write the
ledger -> final check: every path holds sndr's new inode with the planned bytes
-> remove the journal. A crash anywhere leaves the journal behind, and
:func:`recover` (run by the next writer or verifier) restores every file to its
before-bytes: the tree is then exactly as it was before the interrupted commit,
never in between.

Hostile trees (issue 23):

* ``.sndr`` and everything in it are opened through the state directory's fd
  with ``O_NOFOLLOW``: a symlinked ``.sndr``, or a symlink inside it, is refused
  (``symlink_refused``), never followed.
* Temp files have random names and are created ``O_CREAT | O_EXCL | O_NOFOLLOW``
  (:func:`sndr.fsio.create_temp`): a planted symlink or file is never written through.
* A target that is a symlink, or reached through a symlinked directory inside
  the tree, is refused (``symlink_refused``); sndr does not patch the file a
  link points at, because revert could not restore the link structurally.
* A foreign write that lands on a target during the commit window is never
  lost silently, whether it writes in place or renames a new file over the
  path (issue 33): what the swap takes off the path is compared with the file
  planned from; on a mismatch it goes back in place, the rest of the set is
  rolled back, and the commit stops with ``foreign_write_lost`` (exit 1) naming
  the file. A file renamed over the path after the swap fails the final check
  and stays in place (same error). See "the replace window" below.
* Recovery resolves every journal path like the commit: plain relative paths inside the
  tree, no symlink on the way, ``mkdirs``/``rmdirs`` only parents of their own file and made
  or removed through held directory fds (:func:`_tree_dir`); a journal over
  ``MAX_JOURNAL_FILES``/``MAX_JOURNAL_BYTES`` is ``journal_too_large`` (issue 33).
* Owner, group and mode of every replaced file are carried over to the new inode.
* Every ``OSError`` (ENOSPC, EIO, ...) becomes one ``os_error`` problem naming the
  file (exit 2), after the set was rolled back.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import signal
import stat
import time
from collections.abc import Collection
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TypedDict

from pydantic import ValidationError

from . import env as envmod
from . import fsio
from . import state as statemod
from .errors import EXIT_BAD_INPUT, EXIT_FINDINGS, Problem, SndrError
from .model import Ledger
from .state import CREATED_DIRS, JOURNAL, LEDGER, LOCK, MAX_STATE_BYTES, OBJECTS, STATE_DIR
from .treeview import DirTree, PristineView, Tree

# The largest vLLM 0.33.0 .py file is under 1 MiB; anything near this limit is not source.
MAX_TARGET_BYTES = 16 * 2**20
# A journal has one entry per file of a commit; vLLM 0.33.0 has under 3,000 files. A larger journal
# was not written by sndr, and reading it would cost minutes of CPU before anything else runs.
MAX_JOURNAL_FILES = 4096
MAX_JOURNAL_BYTES = 4 * 2**20

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
_SHA = re.compile(r"[0-9a-f]{64}\Z")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fault(point: str) -> None:
    """Test-only crash injection: SIGKILL ourselves at the named commit step.

    ``SNDR_TEST_FAULT=<point>`` is read by the reliability harness only; with
    the variable unset this is one dict lookup.
    """
    if os.environ.get(envmod.FAULT) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def os_error(exc: OSError, path=None, doing: str = "") -> SndrError:
    """One problem naming the file and the OS error (ENOSPC, EIO, ...): exit 2."""
    name = exc.filename if exc.filename is not None else path
    code = errno.errorcode.get(exc.errno or 0, "")
    what = f"{doing}: " if doing else ""
    return SndrError(Problem("os_error", f"{what}{exc.strerror or exc}" + (f" ({code})" if code else ""),
                             file=str(name) if name is not None else None,
                             hint="free space or fix the device, then re-run; the tree was left as it was"),
                     EXIT_BAD_INPUT)


def _named(exc: OSError, path) -> OSError:
    """``exc`` naming ``path`` when it names no file itself (fsync, write and fchmod name none)."""
    if exc.filename is None:
        return OSError(exc.errno, exc.strerror, str(path))
    return exc


def _fsync_dir(path: Path) -> None:
    try:
        fsio.fsync_dir(path)
    except OSError as exc:
        raise _named(exc, path) from None


def _fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _named(exc, path) from None


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


def _write_tmp(path: Path, data: bytes, like: os.stat_result | None = None, dir_fd: int | None = None) -> Path:
    """Write ``data`` to a new random temp file beside ``path`` (not yet fsynced).

    ``like``: the file being replaced; its owner, group and mode are carried over.
    """
    try:
        fd, tmp = fsio.create_temp(path, 0o644 if like is None else stat.S_IMODE(like.st_mode), dir_fd=dir_fd)
    except OSError as exc:
        raise _named(exc, path) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if like is not None:
                if (like.st_uid, like.st_gid) != (os.geteuid(), os.getegid()):
                    with contextlib.suppress(PermissionError):  # only root may give a file away
                        os.fchown(fh.fileno(), like.st_uid, like.st_gid)
                os.fchmod(fh.fileno(), stat.S_IMODE(like.st_mode))  # after chown, which clears setuid bits
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        if isinstance(exc, OSError):
            raise _named(exc, path) from None
        raise
    return Path(tmp)


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Durable atomic replace of ``path`` (:func:`sndr.fsio.atomic_write`)."""
    fsio.atomic_write(path, data, mode)


def _sweep_temps(directory: Path, name: str) -> None:
    """Remove temp files (and kept inodes) of ``name`` left by an interrupted commit; under the lock."""
    prefix = f".{name}{fsio.TEMP_MARK}"
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        if entry.startswith(prefix):
            with contextlib.suppress(OSError):
                os.unlink(directory / entry)  # unlink never follows a symlink


class TreeRoot(Tree):
    """The one writable tree: a directory holding ``vllm/``, its safe paths, the state directory, the lock.

    A :class:`sndr.treeview.Tree` whose reads are the writer's (no symlink
    followed, every first read recorded for the commit's before-check); the vLLM
    version, the file list and the metadata are read through :attr:`view`, a
    plain :class:`sndr.treeview.DirTree` of the same directory.
    """

    root: Path  # a writable tree is always a directory

    def __init__(self, root: Path | str):
        self._state_fd: int | None = None  # first: __del__ runs even when the checks below raise
        self._objects_fd: int | None = None
        self.root = Path(root)
        self.spec, self.kind = str(self.root), "dir"
        if not (self.root / "vllm").is_dir():
            raise SndrError(Problem("not_a_tree", "directory does not contain a vllm/ package", file=str(self.root),
                                    hint="pass the site-packages directory or the checkout root that contains vllm/"))
        self.real_root = Path(os.path.realpath(self.root))
        self.state = self.root / STATE_DIR
        self.objects = self.state / OBJECTS
        self.ledger_path = self.state / LEDGER
        self.journal_path = self.state / JOURNAL
        # sha256 (None: missing) of the first bytes this TreeRoot read of each target: what every
        # decision was made on. commit() refuses a write whose before-bytes differ from it, so a
        # foreign write that lands between two reads of one command is never overwritten.
        self._observed: dict[str, str | None] = {}
        self._check_state()

    def __del__(self):
        for fd in (self._objects_fd, self._state_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    # -- the state directory, through its fd -----------------------------------

    def _check_state(self) -> None:
        try:
            st = os.lstat(self.state)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise os_error(exc, self.state) from None
        if stat.S_ISLNK(st.st_mode):
            raise SndrError(Problem("symlink_refused", f"sndr's state directory is a symlink (to "
                                    f"{os.readlink(self.state)}); sndr never writes its state through a link",
                                    file=str(self.state), hint="remove the link; .sndr must be a plain directory "
                                                               "inside the tree"))
        if not stat.S_ISDIR(st.st_mode):
            raise SndrError(Problem("state_unsafe", "sndr's state directory is not a directory", file=str(self.state),
                                    hint="move it away; .sndr must be a plain directory inside the tree"))

    def _open_dir(self, parent_fd: int | None, name: str, path: Path, create: bool) -> int | None:
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=parent_fd)
            return os.open(name, _DIR | _NOFOLLOW, dir_fd=parent_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                if os.path.islink(path):
                    raise SndrError(Problem("symlink_refused", "a symlink inside sndr's state directory; sndr "
                                            "never follows one there", file=str(path),
                                            hint="remove the link")) from None
                raise SndrError(Problem("state_unsafe", f"is not a directory ({exc.strerror})", file=str(path),
                                        hint="move it away; sndr recreates it")) from None
            raise

    def state_fd(self, create: bool = False) -> int | None:
        """fd of ``.sndr`` (opened without following a symlink), or None when it does not exist."""
        if self._state_fd is None:
            self._check_state()
            self._state_fd = self._open_dir(None, str(self.state), self.state, create)
        return self._state_fd

    def open_state_fd(self) -> int:
        """fd of ``.sndr`` where it must exist: a state file in it was just read or written (the fd is cached)."""
        sfd = self.state_fd()
        assert sfd is not None, "sndr's state directory is not open"
        return sfd

    def objects_fd(self, create: bool = False) -> int | None:
        if self._objects_fd is None:
            sfd = self.state_fd(create)
            if sfd is None:
                return None
            self._objects_fd = self._open_dir(sfd, OBJECTS, self.objects, create)
        return self._objects_fd

    def read_state(self, name: str, max_bytes: int = MAX_STATE_BYTES) -> bytes | None:
        """Bytes of ``.sndr/<name>`` (no symlink, regular file only), or None when it does not exist."""
        sfd = self.state_fd()
        if sfd is None:
            return None
        try:
            return statemod.read_state_file(sfd, name, str(self.state / name), max_bytes)
        except statemod.StateProblem as exc:
            raise SndrError(Problem(exc.code, exc.message, file=exc.path)) from None

    def write_state(self, name: str, data: bytes) -> None:
        try:
            fsio.atomic_write(name, data, 0o644, dir_fd=self.state_fd(create=True))
        except OSError as exc:  # its names are relative to .sndr's fd, or none at all
            raise OSError(exc.errno, exc.strerror, str(self.state / name)) from None

    def unlink_state(self, name: str) -> None:
        sfd = self.state_fd()
        if sfd is not None:
            try:
                os.unlink(name, dir_fd=sfd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(self.state / name)) from None

    def fsync_state(self) -> None:
        try:
            os.fsync(self.open_state_fd())
        except OSError as exc:
            raise _named(exc, self.state) from None

    # -- paths -------------------------------------------------------------

    def path(self, rel: str) -> Path:
        """Absolute path of ``rel``; refuses anything outside the root, and any symlink on the way.

        ``path_escape`` when it resolves outside the tree (through a symlink or
        ``..``); ``symlink_refused`` when the target or a directory on its way
        inside the tree is a symlink; ``state_unsafe`` for sndr's own state.
        """
        p = self.root / rel
        real = os.path.realpath(p)
        if real != str(self.real_root) and not real.startswith(str(self.real_root) + os.sep):
            hint = "sndr never writes outside the tree root"
            top = self.root / Path(rel).parts[0] if Path(rel).parts else None
            if top is not None and top.is_symlink():  # the package itself is a link (a symlink farm, a store path)
                target = os.path.realpath(top)
                hint += (f"; {top} is a symlink to {target}: pass --tree {os.path.dirname(target)}"
                         if os.path.basename(target) == top.name else
                         f"; {top} is a symlink to {target}: patch a real copy of the package (cp -rL)")
            raise SndrError(Problem("path_escape", f"resolves outside the tree (to {real}) through a symlink or '..'",
                                    file=rel, hint=hint))
        parts = Path(rel).parts
        if parts and parts[0] == STATE_DIR:
            raise SndrError(Problem("state_unsafe", "is inside sndr's own state directory", file=rel,
                                    hint="patches may not target .sndr/"))
        here = self.root
        for part in parts:
            here = here / part
            try:
                st = os.lstat(here)
            except (FileNotFoundError, NotADirectoryError):
                break
            except OSError as exc:
                raise os_error(exc, rel) from None
            if stat.S_ISLNK(st.st_mode):
                link = here.relative_to(self.root)
                raise SndrError(Problem("symlink_refused", f"{'is' if str(link) == rel else f'goes through {link}, which is'} "
                                        f"a symlink inside the tree (to {os.readlink(here)}); sndr patches regular "
                                        f"files only, never through a link", file=rel,
                                        hint="point the patch at the real file (the link's target)"))
        return p

    def read_bytes(self, rel: str) -> bytes | None:
        """The bytes of target ``rel``, or None when it does not exist. Never blocks, never follows a link."""
        data = self._read_bytes(rel)
        if rel not in self._observed:
            self._observed[rel] = sha256_bytes(data) if data is not None else None
        return data

    def take_reads(self) -> dict[str, str | None]:
        """Hand over (and forget) what this TreeRoot has read so far: a writer that just took the
        lock starts its own record, and keeps the lock-free one only if it plans on it."""
        reads, self._observed = self._observed, {}
        return reads

    def keep_reads(self, reads: dict[str, str | None]) -> bool:
        """Plan on ``reads`` (from :meth:`take_reads`) only if every file still holds those bytes:
        then they count as the first reads again, and True; else False, and they stay forgotten."""
        for rel, sha in reads.items():
            data = self._read_bytes(rel)
            if (sha256_bytes(data) if data is not None else None) != sha:
                return False
        self._observed.update(reads)
        return True

    def observed(self, rel: str, data: bytes | None) -> None:
        """Record that sndr itself made ``rel`` hold ``data`` (a commit or a rollback wrote it)."""
        self._observed[rel] = sha256_bytes(data) if data is not None else None

    def _read_bytes(self, rel: str) -> bytes | None:
        p = self.path(rel)
        try:
            return fsio.read_regular(p, MAX_TARGET_BYTES, "target", follow_symlinks=False)
        except fsio.FileProblem as exc:
            if exc.code == "not_found":
                return None
            if exc.code == "file_too_large":
                size = os.stat(p).st_size
                raise SndrError(Problem("file_too_large", f"target is {size / 2**20:.0f} MiB; sndr patches source "
                                        f"files up to {MAX_TARGET_BYTES // 2**20} MiB", file=rel,
                                        hint="a vLLM source file this large is not source; check the patch's path")) \
                    from None
            if exc.code == "not_regular":
                if p.is_dir():
                    raise SndrError(Problem("not_a_file", "target is a directory, not a file", file=rel)) from None
                raise SndrError(Problem("not_regular", "target is not a regular file (FIFO, socket or device); "
                                        "sndr refuses it without opening it for reading", file=rel)) from None
            raise SndrError(Problem(exc.code, exc.message, file=rel)) from None

    def decode(self, data: bytes, rel: str) -> str:
        return decode(data, rel)

    # -- the read-only side: one plain view of the same directory --------------

    @cached_property
    def view(self) -> DirTree:
        """The directory as a plain view: where the vLLM version is read (the digest and the listing too)."""
        return DirTree(self.root)

    @cached_property
    def version(self) -> str:
        return self.view.version

    def files(self) -> list[str]:
        return self.view.files()

    def metadata(self) -> str | None:
        return self.view.metadata()

    def reinstalled(self, rels: list[str]) -> list[str]:
        """Of ``rels``, those holding exactly the bytes vLLM's installer recorded (its dist-info RECORD):
        a reinstall of another build."""
        if not rels:
            return []
        record = self.view.installer_hashes()
        out = []
        for rel in rels:
            now = self.read_bytes(rel)
            if now is not None and record.get(rel) == sha256_bytes(now):
                out.append(rel)
        return out

    def pristine(self, ledger: Ledger | None, *, base: Tree | None = None,
                 only: Collection[str] | None = None) -> PristineView:
        """This tree read as upstream shipped it, through ``ledger`` and the stored copies
        (:class:`sndr.treeview.PristineView`); ``base`` reads the other files (default: this TreeRoot)."""
        return PristineView(self if base is None else base, ledger, self.get_object, only=only)

    # -- objects -----------------------------------------------------------

    def put_object(self, data: bytes) -> str:
        return self.put_objects([data])[0]

    def put_objects(self, blobs: list[bytes]) -> list[str]:
        """Store blobs content-addressed; durable (fsynced) before this returns."""
        shas = [sha256_bytes(b) for b in blobs]
        try:
            self._put_objects(shas, blobs)
        except OSError as exc:
            raise os_error(exc, self.objects, "cannot store copies in .sndr/objects") from None
        return shas

    def _put_objects(self, shas: list[str], blobs: list[bytes]) -> None:
        staged: list[tuple[int, str, str]] = []
        seen: set[str] = set()
        ofd = None
        try:
            for sha, data in zip(shas, blobs):
                if sha in seen:
                    continue
                seen.add(sha)
                ofd = self.objects_fd(create=True)
                try:
                    if stat.S_ISREG(os.stat(sha, dir_fd=ofd, follow_symlinks=False).st_mode):
                        continue
                except FileNotFoundError:
                    pass
                fd, tmp = fsio.create_temp(sha, 0o644, dir_fd=ofd)
                staged.append((fd, tmp, sha))
                with open(fd, "wb", closefd=False) as fh:
                    fh.write(data)
            if staged:
                _fsync_all([fd for fd, _, _ in staged])
                for _, tmp, sha in staged:
                    os.replace(tmp, sha, src_dir_fd=ofd, dst_dir_fd=ofd)
                assert ofd is not None  # staged entries exist only once objects_fd(create=True) gave an fd
                os.fsync(ofd)
        except BaseException:
            for _, tmp, _ in staged:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=ofd)
            raise
        finally:
            for fd, _, _ in staged:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def get_object(self, sha: str) -> bytes:
        damaged = "the .sndr state was damaged; reinstall vLLM to get a pristine tree"
        missing = SndrError(Problem("object_missing", f"stored copy {sha[:12]} is missing",
                                    file=str(self.objects / sha), hint=damaged))
        ofd = self.objects_fd()
        if ofd is None or not _SHA.match(sha or ""):
            raise missing
        try:
            data = fsio.read_regular(sha, None, "stored copy", dir_fd=ofd, follow_symlinks=False)
        except fsio.FileProblem as exc:
            if exc.code == "not_found":
                raise missing from None
            raise SndrError(Problem("state_unsafe" if exc.code != "symlink_refused" else exc.code, exc.message,
                                    file=str(self.objects / sha))) from None
        if sha256_bytes(data) != sha:
            raise SndrError(Problem("object_corrupt", f"stored copy {sha[:12]} does not match its hash",
                                    file=str(self.objects / sha), hint=damaged))
        return data

    # -- ledger ------------------------------------------------------------

    def read_ledger(self) -> Ledger | None:
        """The ledger, read and classified by :func:`sndr.state.check_ledger` (the reader the startup hook,
        ``sndr status`` and the ``--verify`` fast path use), as a model; ``ledger_corrupt`` when it is not
        JSON, not the shape sndr writes or its checksum does not match. The state file itself is read
        through ``.sndr``'s fd (:meth:`read_state`: symlink_refused, state_unsafe, file_too_large)."""
        raw = self.read_state(LEDGER)
        return None if raw is None else self.ledger_from(raw)

    def ledger_from(self, raw: bytes) -> Ledger:
        """The ledger file's bytes ``raw`` as :meth:`read_ledger` reads them (its checks, codes and hint), for
        a caller that also needs the bytes themselves."""
        hint = (f"run `python -m sndr salvage-ledger {self.root}` to put back the last ledger sndr "
                f"wrote that matches the tree (kept in .sndr/objects), then --verify or --revert; if it finds "
                f"none, reinstall vLLM and delete .sndr/")
        found = statemod.check_ledger(raw, str(self.ledger_path))
        if found.ledger is None:
            raise SndrError(Problem(found.code or "ledger_corrupt", found.why, file=found.path, key=found.key,
                                    hint=hint))
        try:  # the shape check above is stricter than the model: this never fails on what it accepted
            ledger = Ledger.model_validate(found.ledger)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise SndrError(Problem("ledger_corrupt", f"ledger is corrupt or was edited by hand: {first.get('msg')}",
                                    file=str(self.ledger_path), key=".".join(map(str, first.get("loc", ()))) or None,
                                    hint=hint)) from None
        return ledger

    def created_dirs(self) -> list[str]:
        raw = self.read_state(CREATED_DIRS)
        try:
            dirs = json.loads(raw) if raw is not None else []
        except ValueError:
            return []
        return [d for d in dirs if isinstance(d, str)] if isinstance(dirs, list) else []

    # -- lock --------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, shared: bool = False):
        """fcntl lock on ``.sndr/lock``: exclusive for writers, shared for readers.

        Shared locks matter: a verify racing a revert must see the tree
        before or after the revert, never in between.
        """
        if shared and self.state_fd() is None:
            yield False  # readers never create state; see run_verify for the re-check
            return
        try:
            sfd = self.state_fd(create=True)
            fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o644, dir_fd=sfd)
        except SndrError:
            raise
        except OSError as exc:
            if shared and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                yield False  # read-only tree: nobody can be writing it
                return
            if exc.errno == errno.ELOOP:
                raise SndrError(Problem("symlink_refused", "the lock file is a symlink", file=str(self.state / LOCK),
                                        hint="remove the link")) from None
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise read_only_error(self.state, exc) from None
            raise os_error(exc, self.state / LOCK) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            if not shared:
                _fault("after_lock")
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _fsync_all(fds: list[int]) -> None:
    if len(fds) <= 1:
        for fd in fds:
            os.fsync(fd)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(fds))) as pool:
        list(pool.map(os.fsync, fds))


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


class _JournalEntry(TypedDict, total=False):
    """One file of ``journal.json``, as :func:`_commit` writes it (``mkdirs``/``rmdirs`` only where they apply)."""

    path: str
    before: str | None
    after: str | None
    mkdirs: list[str]
    rmdirs: list[str]


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
    dirs: list[Path] = [tree.state if tree.state_fd() is not None else tree.root]
    for w in writes:
        p = tree.path(w.rel)
        if p.is_dir():
            raise SndrError(Problem("not_a_file", "target is a directory, not a file", file=w.rel))
        if w.before is not None:
            try:
                fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
                os.close(fd)
            except OSError as exc:
                raise read_only_error(p, exc) from None
        d = p.parent
        while not d.exists():  # a created file may need new directories
            d = d.parent
        if d not in dirs:
            dirs.append(d)
    for d in dirs:
        try:
            fd, probe = fsio.create_temp(d / ".sndr-probe", 0o600)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise read_only_error(d, exc) from None


def _missing_dirs(tree: TreeRoot, rel: str) -> list[str]:
    """The parent directories of ``rel`` that do not exist yet, top-down (relative to the root)."""
    out = []
    d = Path(rel).parent
    while str(d) not in ("", ".") and not (tree.root / d).exists():
        out.append(str(d))
        d = d.parent
    return out[::-1]


def _keep_old_inode(p: Path) -> Path | None:
    """Hard-link the file at ``p`` under a random temp name: its bytes survive the replace."""
    for _ in range(16):
        keep = p.with_name(f".{p.name}{fsio.TEMP_MARK}{os.urandom(6).hex()}")
        try:
            os.link(p, keep, follow_symlinks=False)
            return keep
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
                return None  # no hard links here: fall back to a re-read just before the replace
            raise
    return None


# -- the replace window ------------------------------------------------------------------
#
# sndr cannot lock out a writer that ignores its lock. Per replaced file the window is
#   stage temp T -> swap T in (what was at the path, X, comes out under T's name) -> compare X
#   -> (ledger) -> final check that the path still holds T with the planned bytes.
# X is compared by inode (the one sndr planned from) and by content, read under a read lease
# (F_SETLEASE: no process holds X open for writing any more, so no later write can land in it).
# renameat2(RENAME_EXCHANGE) makes the swap atomic: a file renamed over the path at any moment
# before the swap comes out as X; one renamed over it after the swap fails the final check.
# Without RENAME_EXCHANGE (not Linux, or a filesystem without it) X is kept by a hard link, the
# path's inode is checked once more, and T goes in with rename(): a rename by another process
# between that check and the rename() call is the one window that remains there. Without
# leases (NFS), a writer that still holds X open and writes after the compare is the other.

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_renameat2_fn: list = []  # [fn or None], resolved on first use


def _renameat2():
    if not _renameat2_fn:
        fn = None
        if os.uname().sysname == "Linux":
            import ctypes

            try:
                fn = ctypes.CDLL(None, use_errno=True).renameat2
                fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):  # glibc < 2.28, musl without it
                fn = None
        _renameat2_fn.append(fn)
    return _renameat2_fn[0]


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directory entries ``a`` and ``b`` atomically; False where the system cannot."""
    fn = _renameat2()
    if fn is None:
        return False
    import ctypes

    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # this filesystem has no RENAME_EXCHANGE
    raise OSError(err, os.strerror(err), str(b))


def _ident(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what is at ``path`` (never following a link), or None when nothing is."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_dev, st.st_ino


_LEASE_TRIES = 100  # 1 ms apart: a writer that appends and closes is done long before


def _read_settled(path: Path) -> bytes | None:
    """The bytes of the inode at ``path`` once no process holds it open for writing, else None.

    A read lease (``F_SETLEASE``/``F_RDLCK``) is granted only while nobody has the inode open
    for writing; taken on an inode no longer at its path, it proves no later write can land in
    it, so the bytes read are final. None also for a link, a directory, a FIFO or a file over
    ``MAX_TARGET_BYTES``. Where leases
    are not available (not Linux, NFS, no CAP_LEASE on another user's file) the bytes are read as
    they are: a writer that still holds the old file open is then the documented remaining limit.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    leased = False
    sigio = getattr(signal, "SIGIO", None)
    prev_sigio = None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        setlease = getattr(fcntl, "F_SETLEASE", None)
        if setlease is not None and sigio is not None:
            # Someone opening the inode for writing while the lease is held breaks it with SIGIO,
            # whose default action ends the process: ignored for the few syscalls the lease lasts.
            try:
                prev_sigio = signal.signal(sigio, signal.SIG_IGN)
            except ValueError:  # not the main thread: no lease
                setlease = None
        if setlease is not None:
            for _ in range(_LEASE_TRIES):
                try:
                    fcntl.fcntl(fd, setlease, fcntl.F_RDLCK)
                    leased = True
                    break
                except OSError as exc:
                    if exc.errno != errno.EAGAIN:
                        break  # leases unsupported here
                time.sleep(0.001)
            else:
                return None  # a writer still holds it open: its bytes are not final
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_TARGET_BYTES:
                return None  # larger than any file sndr writes: not the one it planned from
            chunks.append(chunk)
    finally:
        if leased:
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.close(fd)
        if prev_sigio is not None and sigio is not None:
            signal.signal(sigio, prev_sigio)


def _window(point: str, path: Path | None) -> None:
    """Test seam, a no-op: the reliability tests land a foreign write at each step of the window.

    Points: ``staged`` (temp written, before the swap), ``kept`` (fallback only: hard link of the
    old file made, before ``rename``), ``swapped``, ``compared`` (every displaced file compared,
    before the final check) and ``checked`` (final check passed: the commit is done); in recovery,
    ``restore`` (the before-bytes staged, before the swap).
    """


def _aside_name(p: Path) -> Path:
    return p.with_name(f".{p.name}.sndr-foreign-{os.urandom(4).hex()}")


def _temp_name(p: Path) -> Path:
    return p.with_name(f".{p.name}{fsio.TEMP_MARK}{os.urandom(6).hex()}")


@dataclass
class _Slot:
    """One file of a commit in the replace window."""

    i: int
    w: FileWrite
    p: Path
    tmp: Path | None = None  # sndr's new file, before the swap
    old: tuple[int, int] | None = None  # identity of the file sndr planned from
    new: tuple[int, int] | None = None  # identity of sndr's new file
    displaced: Path | None = None  # what sndr took off the path (the old file, or whatever was there)


class _Where:
    """The path the transaction is working on: an OSError that names no file is reported with it."""

    def __init__(self, path: Path | str | None = None):
        self.path = path


def commit(tree: TreeRoot, writes: list[FileWrite], ledger: Ledger | None, digest: str) -> None:
    """Make ``writes`` and the new ``ledger`` (None: remove it) real, atomically as a set.

    The caller holds the exclusive lock and has run :func:`recover`. Every
    ``OSError`` becomes an ``os_error`` problem after the set was rolled back.
    """
    if len(writes) > MAX_JOURNAL_FILES:
        raise SndrError(Problem("journal_too_large", f"this commit would change {len(writes)} files; sndr's journal "
                                f"holds at most {MAX_JOURNAL_FILES}", file=str(tree.root),
                                hint="split the patch set; nothing was written"))
    where = _Where(tree.root)
    try:
        _commit(tree, writes, ledger, digest, where)
    except OSError as exc:
        raise os_error(exc, where.path) from None


def _commit(tree: TreeRoot, writes: list[FileWrite], ledger: Ledger | None, digest: str, where: _Where) -> None:
    for w in writes:  # the world may have moved since the plan was read
        now = tree.read_bytes(w.rel)
        first = tree._observed.get(w.rel)
        if now != w.before or first != (sha256_bytes(w.before) if w.before is not None else None):
            raise SndrError(Problem("changed_during_apply", "file changed or vanished between plan and commit",
                                    file=w.rel, hint="re-run; nothing was written"))
    probe_writable(tree, writes)
    old_ledger = tree.read_state(LEDGER)
    new_ledger = ledger.model_dump_json(indent=1).encode() if ledger is not None else None
    created = tree.created_dirs()
    befores = tree.put_objects([w.before for w in writes if w.before is not None]
                               + ([old_ledger] if old_ledger is not None else [])
                               + ([new_ledger] if new_ledger is not None else []))
    it = iter(befores)
    entries: list[_JournalEntry] = []
    for w in writes:
        entry: _JournalEntry = {"path": w.rel, "before": next(it) if w.before is not None else None,
                                "after": sha256_bytes(w.after) if w.after is not None else None}
        if w.after is not None and w.before is None:
            entry["mkdirs"] = _missing_dirs(tree, w.rel)
        if w.after is None:  # a created file goes: so do the directories sndr created for it
            entry["rmdirs"] = [d for d in sorted(created, key=len, reverse=True)
                               if w.rel.startswith(d.rstrip("/") + "/")]
        entries.append(entry)
    journal = {"format": 1, "digest": digest, "files": entries,
               "ledger_before": next(it) if old_ledger is not None else None,
               "created_dirs_before": created}
    slots: list[_Slot] = []
    try:
        # Inside the try: a journal that went in but could not be made durable is rolled back too.
        where.path = tree.journal_path
        tree.write_state(JOURNAL, json.dumps(journal, indent=1).encode())
        _fault("after_journal")
        # Stage every temp file, make them durable together, then swap them in.
        for i, (w, entry) in enumerate(zip(writes, entries)):
            s = _Slot(i, w, tree.path(w.rel))
            slots.append(s)
            where.path = s.p
            like = os.lstat(s.p) if w.before is not None else None
            s.old = (like.st_dev, like.st_ino) if like is not None else None
            if w.after is not None:
                for d in entry.get("mkdirs", []):
                    where.path = tree.root / d
                    _tree_dir(tree, d, "mkdir")
                where.path = s.p
                s.tmp = _write_tmp(s.p, w.after, like)
                s.new = _ident(s.tmp)
                _fault(f"after_tmp:{i}")
        where.path = tree.root
        _fsync_files([s.tmp for s in slots if s.tmp is not None])
        touched_dirs: set[Path] = set()
        for s in slots:
            _swap(tree, s, where)
            _fault(f"after_replace:{s.i}")
            touched_dirs.add(s.p.parent)
            drop_pyc(s.p)
        # What came off each path is the file sndr planned from, holding exactly the bytes it
        # planned from, or another process's write landed before the swap: put it back, roll back.
        lost = [s for s in slots if _lost(s)]
        if lost:
            raise _ForeignWrite([_Foreign(s.w.rel, s.p, s.w.after, s.displaced) for s in lost])
        for s in slots:
            if s.displaced is not None:
                with contextlib.suppress(OSError):
                    os.unlink(s.displaced)
                s.displaced = None
        removed_dirs = []
        for entry in entries:
            for d in entry.get("rmdirs", []):
                where.path = tree.root / d
                if _tree_dir(tree, d, "rmdir"):
                    removed_dirs.append(d)
        touched_dirs |= {(tree.root / d).parent for d in removed_dirs}
        touched_dirs = {d for d in touched_dirs if d.is_dir()}
        where.path = tree.root
        _fsync_files(sorted(touched_dirs), dirs=True)
        now_created = [d for d in created if d not in removed_dirs]
        now_created += [d for e in entries for d in e.get("mkdirs", []) if d not in now_created]
        where.path = tree.state / CREATED_DIRS
        if now_created != created:
            tree.write_state(CREATED_DIRS, json.dumps(sorted(now_created)).encode())
        _fault("before_ledger")
        where.path = tree.ledger_path
        if new_ledger is None:
            tree.unlink_state(LEDGER)
        else:
            tree.write_state(LEDGER, new_ledger)
        tree.fsync_state()
        _fault("after_ledger")
        # The final check, as late as the journal still allows a rollback: every path holds
        # sndr's new file with the planned bytes (or nothing, for a removed file).
        _window("compared", None)
        moved = [s for s in slots if not _holds(s)]
        if moved:
            raise _ForeignWrite([_Foreign(s.w.rel, s.p, s.w.after, kind="left") for s in moved])
        _window("checked", None)
    except _ForeignWrite as fw:
        where.path = tree.journal_path
        # Raised mid-swap: files swapped before it were not compared yet; they are now.
        listed = {f.rel for f in fw.files}
        fw.files += [_Foreign(s.w.rel, s.p, s.w.after, s.displaced) for s in slots
                     if s.w.rel not in listed and _lost(s)]
        _undo_foreign(tree, fw)
        err = fw.error()
        try:
            _rollback(tree)
        except SndrError as again:  # the rollback met another foreign write: name it too
            err.problems.extend(again.problems)
        raise err from None
    except BaseException as exc:
        kept = _keep_foreign_aside(slots)
        try:
            _rollback(tree)
        except (OSError, SndrError) as again:
            if isinstance(exc, OSError):
                raise os_error(exc, where.path, doing="the commit failed and so did its rollback; the journal stays "
                                                      "and the next apply, verify or revert finishes the rollback "
                                                      f"({again}){kept}") from None
            raise
        if kept and isinstance(exc, OSError):
            raise os_error(exc, where.path, doing=f"the commit failed and was rolled back{kept}") from None
        raise
    for w in writes:
        tree.observed(w.rel, w.after)
    where.path = tree.journal_path
    tree.unlink_state(JOURNAL)
    try:
        tree.fsync_state()
    except OSError:
        # The set is complete and the ledger durable; only the journal's removal may not be.
        # If it comes back after a crash, the next command rolls the set back, consistently.
        pass
    _fault("after_commit")


def _swap(tree: TreeRoot, s: _Slot, where: _Where) -> None:
    """Put sndr's new file at ``s.p`` (or remove it); what was there comes out as ``s.displaced``."""
    w, p = s.w, s.p
    where.path = p
    _window("staged", p)
    if w.before is None:
        # A created file appears only where nothing is: link() never replaces
        # a file someone else put there meanwhile.
        assert s.tmp is not None
        try:
            os.link(s.tmp, p, follow_symlinks=False)
        except FileExistsError:
            os.unlink(s.tmp)
            raise _ForeignWrite([_Foreign(w.rel, p, w.after, kind="created")]) from None
        os.unlink(s.tmp)
    elif s.tmp is None:
        # A removed file goes by rename() to a temp name: whatever was at the path comes out.
        away = _temp_name(p)
        try:
            os.rename(p, away)
        except FileNotFoundError:
            return  # someone else removed it first: what sndr wanted, and no bytes of theirs to keep
        s.displaced = away
    elif _exchange(s.tmp, p):
        s.displaced, s.tmp = s.tmp, None
    else:
        keep = _keep_old_inode(p)
        if keep is None and tree._read_bytes(w.rel) != w.before:
            raise _ForeignWrite([_Foreign(w.rel, p, w.after, kind="left")])
        s.displaced = keep
        _window("kept", p)
        if _ident(p) != s.old:  # a file renamed over the path since the plan's read: it stays
            fw = _ForeignWrite([_Foreign(w.rel, p, w.after, kind="left")])
            if keep is not None and _read_settled(keep) != w.before:  # and the old one was written to
                fw.aside[w.rel] = _aside_name(p)
                os.rename(keep, fw.aside[w.rel])
            raise fw
        os.replace(s.tmp, p)
        s.tmp = None
    _window("swapped", p)


def _holds(s: _Slot) -> bool:
    """Does the path still hold what sndr put there (the same inode, the planned bytes)?"""
    if s.w.after is None:
        return _ident(s.p) is None
    if _ident(s.p) != s.new:
        return False
    try:
        return fsio.read_regular(s.p, MAX_TARGET_BYTES, "target", follow_symlinks=False) == s.w.after
    except fsio.FileProblem:
        return False


def _lost(s: _Slot) -> bool:
    """Is what sndr's swap took off the path other than the file it planned from (inode, bytes)?"""
    return s.displaced is not None and (_ident(s.displaced) != s.old or _read_settled(s.displaced) != s.w.before)


def _keep_foreign_aside(slots: list[_Slot]) -> str:
    """On an OS error mid-commit: a displaced file that is not sndr's before-bytes is another
    process's; move it out of the sweep of temp names before the rollback. Returns the words that
    name them for the error ("" when there are none)."""
    kept = []
    for s in slots:
        if s.displaced is not None and _read_settled(s.displaced) != s.w.before:
            aside = _aside_name(s.p)
            with contextlib.suppress(OSError):
                os.rename(s.displaced, aside)
                kept.append(f"{s.w.rel} as {aside.name}")
            s.displaced = None
    return f"; another process wrote during the commit: its version of {', '.join(kept)} is kept beside it" \
        if kept else ""


def _read_kept(keep: Path) -> bytes | None:
    try:
        return fsio.read_regular(keep, None, "kept inode", follow_symlinks=False)
    except fsio.FileProblem:
        return None


@dataclass
class _Foreign:
    """One file another process wrote during the commit.

    ``kind``: ``displaced`` (what sndr's swap took off the path is not the file it planned from:
    it goes back), ``left`` (the path holds another process's file, not sndr's new one nor the one
    planned from: it stays), ``created`` (another process created a file sndr was creating).
    """

    rel: str
    path: Path
    after: bytes | None
    displaced: Path | None = None
    kind: str = "displaced"


class _ForeignWrite(Exception):
    """Foreign writes detected during the commit; ``aside``: rel -> another version kept beside it."""

    def __init__(self, files: list[_Foreign]):
        super().__init__(", ".join(f.rel for f in files))
        self.files = files
        self.aside: dict[str, Path] = {}

    def error(self) -> SndrError:
        problems = []
        for f in self.files:
            if f.kind == "created":
                msg = "another process created this file while sndr was creating it; its file was kept"
            elif f.kind == "left":
                msg = ("another process replaced or wrote this file during sndr's commit, after sndr had read it; "
                       "its file was left in place and the rest of the set was rolled back")
            else:
                msg = ("another process wrote to this file, or renamed another file over it, while sndr was "
                       "replacing it; its file was put back in place (with the foreign change) and the whole set "
                       "was rolled back")
            if f.rel in self.aside:
                msg += (f"; another version of it, not sndr's, is kept as {self.aside[f.rel].name} beside it "
                        f"(merge it by hand)")
            problems.append(Problem("changed_during_apply" if f.kind == "created" else "foreign_write_lost", msg,
                                    file=f.rel, hint="find the writer that ignores sndr's lock, then re-run"))
        return SndrError(problems, EXIT_FINDINGS)


def _put_back(displaced: Path, path: Path) -> bool:
    """Move ``displaced`` back to ``path`` where nothing is; False when something is there now."""
    try:
        os.link(displaced, path, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError:  # a directory, or no hard links on this filesystem
        if os.path.lexists(path):
            return False
        os.rename(displaced, path)
        return True
    os.unlink(displaced)
    return True


def _undo_foreign(tree: TreeRoot, fw: _ForeignWrite) -> None:
    """Put each displaced file (holding the foreign bytes) back, and drop those files from the journal.

    What comes off the path in exchange is sndr's new file, or, if yet another process renamed a
    file over the path meanwhile, that file: it is kept beside the file and named in the error;
    sndr's own copy goes.
    """
    for f in fw.files:
        displaced, path, after = f.displaced, f.path, f.after
        if displaced is not None:
            back: Path | None = None  # what came off the path as the displaced file went back
            if after is None or not os.path.lexists(path):
                if not _put_back(displaced, path):
                    back = displaced  # someone put a file there meanwhile: it stays, this one goes aside
            elif _exchange(displaced, path):
                back = displaced
            else:
                back = _aside_name(path)
                try:
                    os.link(path, back, follow_symlinks=False)
                except OSError:
                    back = None
                os.replace(displaced, path)
            drop_pyc(path)
            if back is not None:
                if after is not None and _read_settled(back) == after:
                    os.unlink(back)  # sndr's own new copy, untouched
                else:
                    if back == displaced:  # still under a temp name, which the sweep below would take
                        aside = _aside_name(path)
                        os.rename(back, aside)
                        back = aside
                    fw.aside[f.rel] = back
        _sweep_temps(path.parent, path.name)  # our staged temp file, if it never went in
    rels = {f.rel for f in fw.files}
    raw = tree.read_state(JOURNAL)
    assert raw is not None  # written at the start of this commit, under the lock
    journal = json.loads(raw)
    journal["files"] = [e for e in journal["files"] if e.get("path") not in rels]
    tree.write_state(JOURNAL, json.dumps(journal, indent=1).encode())


def _rollback(tree: TreeRoot) -> None:
    recover(tree)


def drop_pyc(path: Path) -> None:
    """Remove stale bytecode of ``path`` so no process runs the old code."""
    cache = path.parent / "__pycache__"
    if cache.is_dir() and not cache.is_symlink():
        for pyc in cache.glob(path.stem + ".*.pyc"):
            with contextlib.suppress(OSError):
                pyc.unlink()


def _plain_rel(rel: str) -> bool:
    """A relative path of plain names: not absolute, no ``.``/``..``, no NUL, no empty part."""
    parts = rel.split("/")
    return bool(rel) and "\0" not in rel and not rel.startswith("/") and all(x not in ("", ".", "..") for x in parts)


def _journal_entries(tree: TreeRoot, journal) -> list[dict]:
    """The journal's entries, checked: anything sndr would not have written is ``journal_corrupt``.

    Directories in ``mkdirs``/``rmdirs`` must be parents of the entry's own path: sndr only ever
    creates or removes the directories of a file it creates or removes.
    """
    bad = SndrError(Problem("journal_corrupt", "journal of an interrupted commit is unreadable or malformed",
                            file=str(tree.journal_path),
                            hint="inspect it; the before-bytes are in .sndr/objects"))
    if not isinstance(journal, dict) or not isinstance(journal.get("files"), list):
        raise bad
    if len(journal["files"]) > MAX_JOURNAL_FILES:
        raise _journal_too_large(tree, f"it names {len(journal['files'])} files")
    lb = journal.get("ledger_before")
    if lb is not None and not (isinstance(lb, str) and _SHA.match(lb)):
        raise bad
    out = []
    seen: set[str] = set()
    for e in journal["files"]:
        if not isinstance(e, dict) or not isinstance(e.get("path"), str) or not _plain_rel(e["path"]):
            raise bad
        if e["path"] in seen:  # sndr journals each file once
            raise bad
        seen.add(e["path"])
        for k in ("before", "after"):
            v = e.get(k)
            if v is not None and not (isinstance(v, str) and _SHA.match(v)):
                raise bad
        parents = {str(d) for d in Path(e["path"]).parents if str(d) != "."}
        for k in ("mkdirs", "rmdirs"):
            v = e.get(k, [])
            if not isinstance(v, list) or not all(isinstance(d, str) and _plain_rel(d) for d in v):
                raise bad
            for d in v:
                if d not in parents:
                    raise SndrError(Problem("journal_corrupt", f"the journal's {k} names {d}, which is not a parent "
                                            f"directory of its file {e['path']}; sndr never writes that",
                                            file=str(tree.journal_path), hint="the journal was not written by sndr; "
                                            "move it aside and check the tree by hand (nothing was changed)"))
        out.append(e)
    return out


def _journal_too_large(tree: TreeRoot, why: str) -> SndrError:
    return SndrError(Problem(
        "journal_too_large", f"the journal of an interrupted commit is too large to be sndr's ({why}; sndr writes at "
        f"most {MAX_JOURNAL_FILES} files, {MAX_JOURNAL_BYTES // 2**20} MiB)", file=str(tree.journal_path),
        hint=f"move it out of .sndr/ and inspect it; then run `python -m sndr salvage-ledger {tree.root}` "
             f"and --verify to see what the tree holds"))


def _tree_dir(tree: TreeRoot, rel: str, op: str, named: str | None = None) -> bool:
    """``mkdir`` or ``rmdir`` the directory ``rel`` of the tree through held directory fds.

    Every directory on the way is opened ``O_DIRECTORY | O_NOFOLLOW`` from the root's fd, so a
    symlink planted anywhere on the way is refused (``symlink_refused``, naming ``named`` or
    ``rel``), never followed out of the tree. Returns False for an ``rmdir`` that leaves the
    directory in place (something else lives in it now); True when done or already so.
    """
    parts = rel.split("/")
    if not _plain_rel(rel):
        raise SndrError(Problem("path_escape", f"directory {rel!r} is not a plain path inside the tree",
                                file=named or rel))

    def refused(upto: str) -> SndrError:
        where = f"the journal names {rel}, which" if named else "it"
        return SndrError(Problem("symlink_refused", f"{where} goes through {upto}, a symlink or a file inside the "
                                 f"tree; sndr never follows one", file=named or rel,
                                 hint="remove the link; nothing outside the tree was created or removed"))

    fd = os.open(tree.root, _DIR)
    try:
        for n, part in enumerate(parts[:-1]):
            try:
                nfd = os.open(part, _DIR | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if op == "rmdir":
                    return True  # its parent is gone, so is it
                raise
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise refused("/".join(parts[:n + 1])) from None
                raise
            os.close(fd)
            fd = nfd
        name = parts[-1]
        if op == "mkdir":
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
            except FileExistsError:
                if not stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise refused(rel) from None
            return True
        try:
            os.rmdir(name, dir_fd=fd)  # unlinkat(AT_REMOVEDIR): never follows a final link
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EBUSY):
                return False  # not empty, or not a directory (a link): it stays
            raise
        return True
    finally:
        os.close(fd)


def recover(tree: TreeRoot) -> list[str]:
    """Roll an interrupted commit back from its journal. Returns the files restored.

    Every journaled file must currently hold either its before-bytes or its
    after-bytes; anything else means the journal does not describe this tree
    (copied from elsewhere, or a different patch set), and we refuse rather
    than guess, leaving every byte as it is. Every path is resolved like the
    commit's: inside the tree, no symlink on the way (directories through
    held fds). A file another process replaces while it is being restored is
    put back and named (``foreign_write_lost``, exit 1) after the rest is done.
    """
    where = _Where(tree.journal_path)
    try:
        return _recover(tree, where)
    except OSError as exc:
        raise os_error(exc, where.path, doing="cannot roll back the interrupted commit (the journal stays; re-run "
                                              "once the disk is fixed)") from None


def _recover(tree: TreeRoot, where: _Where) -> list[str]:
    try:
        raw = tree.read_state(JOURNAL, MAX_JOURNAL_BYTES)
    except SndrError as exc:
        if exc.problems[0].code == "file_too_large":
            raise _journal_too_large(tree, exc.problems[0].message) from None
        raise
    if raw is None:
        return []
    try:
        journal = json.loads(raw)
    except (ValueError, RecursionError):
        journal = None
    files = _journal_entries(tree, journal)
    plan: list[tuple[str, bytes | None, bytes | None, dict]] = []
    for e in files:
        rel, before, after = e["path"], e.get("before"), e.get("after")
        try:
            now = tree.read_bytes(rel)
        except SndrError as exc:
            pr = exc.problems[0]
            if pr.code in ("symlink_refused", "path_escape", "state_unsafe"):
                raise SndrError(Problem(pr.code, f"the journal names {rel}, which {pr.message}",
                                        file=str(tree.journal_path), hint="the journal was not written by sndr for "
                                        "this tree; move it aside and check the tree by hand")) from None
            raise
        now_sha = sha256_bytes(now) if now is not None else None
        if now_sha not in (before, after):
            raise SndrError(Problem("journal_mismatch",
                                    "journal does not match the tree: the file holds neither its before- nor its after-bytes",
                                    file=rel, hint=f"the journal at {tree.journal_path} belongs to another tree or patch set; "
                                                   "remove it only after checking the tree by hand"))
        want = tree.get_object(before) if before is not None else None
        plan.append((rel, now, want, e))
    restored = []
    foreign: list[Problem] = []
    for rel, now, want, e in plan:
        p = tree.path(rel)
        where.path = p
        _sweep_temps(p.parent, p.name)
        if now != want:
            if want is not None:
                for d in e.get("rmdirs", [])[::-1]:  # the revert removed them: back they come
                    _tree_dir(tree, d, "mkdir", named=str(tree.journal_path))
            kept = _restore(p, now, want)
            if kept is not False:
                foreign.append(Problem("foreign_write_lost", "another process replaced this file while sndr was "
                                       "rolling back an interrupted commit; its file was put back"
                                       + (f", and another version of it is kept as {kept.name} beside it"
                                          if isinstance(kept, Path) else ""),
                                       file=rel, hint="find the writer that ignores sndr's lock, then re-run"))
                continue
            drop_pyc(p)
            restored.append(rel)
        tree.observed(rel, want)
        if want is None:
            for d in e.get("mkdirs", [])[::-1]:  # directories this commit created, now empty again
                _tree_dir(tree, d, "rmdir", named=str(tree.journal_path))
        if p.parent.is_dir():
            _fsync_dir(p.parent)
    where.path = tree.journal_path
    cd = journal.get("created_dirs_before")
    if isinstance(cd, list):
        if cd != tree.created_dirs():
            tree.write_state(CREATED_DIRS, json.dumps(sorted(d for d in cd if isinstance(d, str))).encode())
    lb = journal.get("ledger_before")
    if lb is None:
        tree.unlink_state(LEDGER)
    else:
        tree.write_state(LEDGER, tree.get_object(lb))
    tree.fsync_state()
    tree.unlink_state(JOURNAL)
    tree.fsync_state()
    if foreign:
        raise SndrError(foreign, EXIT_FINDINGS)
    return restored


def _restore(p: Path, now: bytes | None, want: bytes | None):
    """Put ``want`` (None: nothing) at ``p``, which held ``now``. Returns False when done; else another
    process's file was found at ``p`` and put back: None, or the aside path of yet another version."""
    if want is None:
        _window("restore", p)
        away = _temp_name(p)
        try:
            os.rename(p, away)
        except FileNotFoundError:
            return False
        if _read_settled(away) == now:
            os.unlink(away)
            return False
        if _put_back(away, p):
            return None
        aside = _aside_name(p)
        os.rename(away, aside)
        return aside
    like = os.lstat(p) if now is not None else None
    tmp = _write_tmp(p, want, like)
    _fsync_path(tmp)
    _window("restore", p)
    if now is None:
        try:
            os.link(tmp, p, follow_symlinks=False)
        except FileExistsError:
            os.unlink(tmp)
            return None  # another process created it meanwhile: it stays
        os.unlink(tmp)
        return False
    if not _exchange(tmp, p):  # no RENAME_EXCHANGE here: the fallback of _swap, and its window
        keep = _keep_old_inode(p)
        if (keep is not None and _ident(keep) != _ident(p)) or (keep is None and _read_kept(p) != now):
            for t in (keep, tmp):  # renamed over since the read: another process's file stays
                if t is not None:
                    os.unlink(t)
            return None
        os.replace(tmp, p)
        if keep is None or _read_settled(keep) == now:
            if keep is not None:
                os.unlink(keep)
            return False
        copy = _aside_name(p)
        back: Path | None = copy
        try:
            os.link(p, copy, follow_symlinks=False)
        except OSError:
            back = None
        os.replace(keep, p)  # another process wrote to the old file: it goes back
        if back is not None and _read_settled(back) == want:
            os.unlink(back)
            return None
        return back
    if _read_settled(tmp) == now:
        os.unlink(tmp)  # the file sndr read, with the bytes it read
        return False
    _exchange(tmp, p)  # another process's file: back it goes
    if _read_settled(tmp) == want:
        os.unlink(tmp)
        return None
    aside = _aside_name(p)
    os.rename(tmp, aside)
    return aside


# ----------------------------------------------------------------------------- ledger salvage


@dataclass(frozen=True)
class Salvage:
    """What :func:`salvage_ledger` did: the ledger it put back (``sha``), or the reason code why none
    (``problem``: ``nothing_to_salvage`` or ``no_ledger_matches``, with their exit status in CODES), and every
    stored ledger it examined that does not describe the tree (``rejected``: sha256, the first file that differs)."""

    sha: str | None
    problem: Problem | None = None
    rejected: tuple[tuple[str, str], ...] = ()


def salvage_ledger(root: Path | str) -> Salvage:
    """Put back the last ledger sndr wrote that matches the tree, or say why none was.

    Every ledger sndr writes is also kept in ``.sndr/objects``. A candidate
    must be what :func:`sndr.state.check_ledger` accepts (shape and checksum: what every ledger
    reader accepts), and describe the tree as it is: every
    file it names holds its patched bytes. Of several, the one naming the most
    files wins (a later set over an earlier subset). Runs under the lock; a tree with no ``.sndr/`` (sndr
    never wrote there) has nothing to put back and is left as it is (the lock would create the directory).
    When none matches, the tree's own ledger, read under the same lock, decides the reason: none (a reverted
    tree) or one that reads (nothing to repair) is ``nothing_to_salvage``; one that does not read is
    ``no_ledger_matches`` (the state cannot be repaired from what sndr kept).
    """
    tree = TreeRoot(root)
    if tree.state_fd() is None:
        return Salvage(None, Problem(
            "nothing_to_salvage", f"nothing to salvage in {tree.root}: it has no {STATE_DIR}/ (sndr never applied "
            "there, so no ledger is kept to put back); the tree is untouched"))
    with tree.lock():
        recover(tree)
        ofd = tree.objects_fd()
        best: tuple[int, str, bytes] | None = None
        rejected: list[tuple[str, str]] = []
        for name in sorted(os.listdir(ofd)) if ofd is not None else []:
            if not _SHA.match(name):
                continue
            try:
                st = os.stat(name, dir_fd=ofd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_STATE_BYTES:
                    continue
                with open(os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=ofd), "rb") as fh:
                    head = fh.read(2)
                    if not head.startswith(b"{"):
                        continue
                    raw = head + fh.read()
            except OSError:
                continue
            candidate = statemod.check_ledger(raw, name).ledger  # what every reader accepts, no more
            files = candidate["files"] if candidate is not None else None
            if not files:
                continue
            differs = None
            for rel, entry in files.items():
                try:
                    now = tree.read_bytes(rel)
                except SndrError:
                    differs = rel
                    break
                if now is None or sha256_bytes(now) != entry["patched_sha256"]:
                    differs = rel
                    break
            if differs is not None:
                rejected.append((name, differs))
            elif best is None or len(files) > best[0]:
                best = (len(files), name, raw)
        if best is None:
            return Salvage(None, _no_match(tree, statemod.read_ledger_at(tree.open_state_fd(), tree.root), rejected),
                           tuple(rejected))
        tree.write_state(LEDGER, best[2])
        tree.fsync_state()
        return Salvage(best[1], None, tuple(rejected))


def _no_match(tree: TreeRoot, own: statemod.LedgerState, rejected: list[tuple[str, str]]) -> Problem:
    """Why no stored ledger was put back, by the tree's own ledger (``own``, read under the salvage's lock)."""
    kept = (f"none of the {len(rejected)} ledger{'s' if len(rejected) != 1 else ''} sndr kept in "
            f"{STATE_DIR}/objects matches its files ("
            + "; ".join(f"{sha[:12]}: {rel} differs" for sha, rel in rejected[:10])
            + (f"; and {len(rejected) - 10} more" if len(rejected) > 10 else "") + ")"
            if rejected else f"sndr kept no ledger in {STATE_DIR}/objects")
    if own.kind == "absent":  # reverted (or an apply that never committed)
        return Problem("nothing_to_salvage", f"nothing to salvage in {tree.root}: it has no ledger, and {kept} (a "
                       "reverted tree reads like this); no ledger was put back",
                       hint=f"`python -m sndr apply --dry-run --tree {tree.root}` shows its state")
    if own.kind == "ok":
        return Problem("nothing_to_salvage", f"nothing to salvage in {tree.root}: its ledger reads (there is nothing "
                       f"to repair), and {kept}: a file changed since apply; no ledger was put back",
                       hint=f"`python -m sndr apply --verify --tree {tree.root}` names the files")
    return Problem("no_ledger_matches", f"no stored ledger matches the files of {tree.root}: its ledger does not "
                   f"read ({own.line()}), and {kept}; no ledger was put back",
                   hint=f"reinstall vLLM and delete {tree.root / STATE_DIR}/ to start from a pristine tree")


# ----------------------------------------------------------------------------- stored copies nothing reads any more


@dataclass(frozen=True)
class Garbage:
    """What :func:`collect_garbage` found in ``.sndr/objects``: the copies still read (``kept``, sha256s) and the
    others (``removed``: sha256, bytes; with ``dry_run`` the ones that would go)."""

    kept: tuple[tuple[str, str], ...]  # (sha256, what it is: "ledger", "pristine <file>", "patched <file>")
    removed: tuple[tuple[str, int], ...]


def live_objects(ledger_raw: bytes | None, ledger: Ledger | None) -> dict[str, str]:
    """The stored copies a tree with this ledger, and no pending journal, can still read, each with what it is:
    the ledger's own copy (what salvage-ledger puts back), and each file's pristine copy (revert, the pristine
    view of --verify, manifest and dry-run, a merge's upstream side) and patched copy (apply --force's merge
    base). Every other object was a journal's before-bytes or an earlier ledger's copy or file, which only a
    journal or that earlier ledger named."""
    live = {sha256_bytes(ledger_raw): "ledger"} if ledger_raw is not None else {}
    for rel, entry in sorted(ledger.files.items()) if ledger is not None else ():
        live.setdefault(entry.pristine_sha256, f"pristine {rel}")
        live.setdefault(entry.patched_sha256, f"patched {rel}")
    return live


def collect_garbage(root: Path | str, *, dry_run: bool = False) -> Garbage:
    """Remove from ``.sndr/objects`` every stored copy that :func:`live_objects` does not name (files whose
    names are not sha256s, e.g. a crashed writer's temporary, are left alone).

    Under the writer lock, after :func:`recover` (an interrupted commit is rolled back first, as every writer
    does); a ledger no reader accepts stops it (``ledger_corrupt`` and friends: salvage-ledger first, which
    needs the stored ledgers). ``dry_run``: pure (no lock, no recovery, nothing removed); a pending journal
    then stops it (``journal_pending``), since what the journal names depends on how it resolves."""
    tree = TreeRoot(root)
    if tree.state_fd() is None:
        return Garbage((), ())
    with contextlib.ExitStack() as stack:
        if not dry_run:
            stack.enter_context(tree.lock())
            recover(tree)
        elif tree.read_state(JOURNAL, MAX_JOURNAL_BYTES) is not None:
            raise SndrError(Problem("journal_pending", "an interrupted commit's journal is pending; what it names "
                                    "depends on how it resolves", file=str(tree.journal_path),
                                    hint="run gc without --dry-run (it rolls the commit back first), or "
                                         "`python -m sndr apply --verify` to see the tree's state"), EXIT_FINDINGS)
        raw = tree.read_state(LEDGER)
        live = live_objects(raw, tree.ledger_from(raw) if raw is not None else None)  # a corrupt one raises
        ofd = tree.objects_fd()
        if ofd is None:
            return Garbage((), ())
        kept: list[tuple[str, str]] = []
        removed: list[tuple[str, int]] = []
        for name in sorted(os.listdir(ofd)):
            if not _SHA.match(name):
                continue
            if name in live:
                kept.append((name, live[name]))
                continue
            try:
                st = os.stat(name, dir_fd=ofd, follow_symlinks=False)
                if not dry_run:
                    os.unlink(name, dir_fd=ofd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise os_error(exc, tree.objects / name, "cannot remove a stored copy") from None
            removed.append((name, st.st_size))
        if removed and not dry_run:
            try:
                os.fsync(ofd)
            except OSError as exc:
                raise os_error(exc, tree.objects, "cannot make the removals durable") from None
        return Garbage(tuple(kept), tuple(removed))


if __name__ == "__main__":  # `python -m sndr.commit --salvage-ledger TREE`, the old spelling: say where it went
    import sys

    print("sndr: `python -m sndr.commit` is no longer a command; the ledger salvage is "
          "`python -m sndr salvage-ledger TREE`", file=sys.stderr)
    sys.exit(2)
