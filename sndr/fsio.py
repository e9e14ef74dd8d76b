"""The one home of sndr's file primitives: atomic writes and strict reads.

Stdlib only, and cheap to import: the startup path (every vLLM process) uses
it as well as the CLIs. Every rule about how sndr puts bytes on disk or reads a
text file lives here, so the hook and the CLI can never disagree about it.

* :func:`create_temp` makes the temp file of an atomic write. The name is
  random and the file is opened ``O_CREAT | O_EXCL | O_NOFOLLOW``: a symlink or
  file planted at a predictable temp name is never followed or truncated.
* :func:`atomic_write` is temp + write + (fsync) + ``os.replace`` + (fsync of
  the directory). ``durable=False`` skips both fsyncs for caches, whose entries
  are verified when read and may vanish in a crash.
* :func:`read_regular` reads a regular file with a size bound; FIFOs, devices
  and directories are refused without blocking.
* :func:`read_text_strict` decodes UTF-8 strictly and names the line of the
  first bad byte.
* :class:`PrivateDir` is a directory that only this uid (or root) can change,
  reached by a walk from ``/`` with ``O_DIRECTORY | O_NOFOLLOW`` and held open
  by fd: every later access is relative to that fd, so swapping a directory on
  the path after the check changes nothing. Its entries can be sealed with an
  HMAC under a per-directory secret (mode 0600), so a cache entry is trusted
  only when this uid wrote it for exactly this name.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

__all__ = ["FileProblem", "PrivateDir", "TEMP_MARK", "UnsafeDirError", "atomic_write", "create_temp", "fsync_dir",
           "read_regular", "read_text_strict", "is_temp_name"]

#: Every temp file sndr creates carries this mark in its name (``.<name>.sndr-tmp-<random>``),
#: so a stale one is recognisable and can be swept under the lock.
TEMP_MARK = ".sndr-tmp-"

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class FileProblem(Exception):
    """A file could not be read or written as sndr requires.

    ``code`` is a registered problem code (see :mod:`sndr.errors`), ``path`` the
    file and ``line`` the 1-based line for decoding errors. Callers that report
    to users turn it into an :class:`sndr.errors.SndrError`; the startup path
    logs it.
    """

    def __init__(self, code: str, message: str, path: str, line: int | None = None):
        super().__init__(f"{path}: {message}")
        self.code, self.message, self.path, self.line = code, message, str(path), line


def is_temp_name(name: str) -> bool:
    return TEMP_MARK in name


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, as messages name it: "a directory", "a regular file", "a FIFO",
    "a character device", "a block device", "a socket", "a symlink" (the one naming of every kind)."""
    return ("a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a symlink" if stat.S_ISLNK(mode) else f"a file of mode {oct(stat.S_IFMT(mode))}")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_temp(path: str | os.PathLike[str], mode: int = 0o644, dir_fd: int | None = None) -> tuple[int, str]:
    """Create the temp file for an atomic replace of ``path``; returns ``(fd, temp_path)``.

    The temp file sits beside ``path`` (same filesystem, so the rename is
    atomic), has a random name, and is created exclusively without following
    symlinks. With ``dir_fd``, ``path`` is a name relative to that directory.
    """
    path = os.fspath(path)
    head, name = os.path.split(path)
    for _ in range(16):
        tmp = os.path.join(head, f".{name}{TEMP_MARK}{os.urandom(6).hex()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "could not create a unique temp file", path)


def atomic_write(path: str | os.PathLike[str], data: bytes, mode: int | None = None, *, durable: bool = True,
                 dir_fd: int | None = None) -> None:
    """Replace ``path`` with ``data`` so that readers see the old bytes or the new, never a mix.

    ``mode`` defaults to the mode of the file being replaced (0644 for a new
    file). ``durable`` fsyncs the data before the rename and the directory after
    it. A failure removes the temp file and leaves ``path`` as it was.
    """
    path = os.fspath(path)
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            mode = 0o644
    fd, tmp = create_temp(path, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)  # the umask applied at create time
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    if durable:
        if dir_fd is not None:
            os.fsync(dir_fd)
        else:
            fsync_dir(os.path.dirname(os.path.abspath(path)) or ".")


def read_regular(path: str | os.PathLike[str], max_bytes: int | None = None, what: str = "file", *,
                 dir_fd: int | None = None, follow_symlinks: bool = True) -> bytes:
    """The bytes of a regular file, refusing FIFOs, devices and directories without blocking.

    Raises :class:`FileProblem` with code ``not_found``, ``not_regular``,
    ``file_too_large``, ``symlink_refused`` (with ``follow_symlinks=False``) or
    ``unreadable``. With ``dir_fd``, ``path`` is relative to that directory.
    """
    path = os.fspath(path)
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow_symlinks else _NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise FileProblem("not_found", f"{what} does not exist", path) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise FileProblem("symlink_refused", f"{what} is a symlink, which sndr does not follow", path) from None
        if exc.errno == errno.ENOTDIR:
            raise FileProblem("not_found", f"{what} does not exist (a parent is not a directory)", path) from None
        raise FileProblem("unreadable", f"cannot read {what}: {exc.strerror}", path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (FIFO, socket or device)"
            raise FileProblem("not_regular", f"{what} is {kind}", path)
        if max_bytes is not None and st.st_size > max_bytes:
            raise FileProblem("file_too_large", f"{what} is {st.st_size} bytes, over the {max_bytes}-byte limit", path)
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise FileProblem("unreadable", f"cannot read {what}: {exc.strerror}", path) from None
    finally:
        os.close(fd)


def decode_strict(raw: bytes, path: str | os.PathLike[str], what: str = "file") -> str:
    """``raw`` as strict UTF-8; a bad byte raises ``not_utf8`` with its line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise FileProblem("not_utf8", f"{what} is not UTF-8 (byte {exc.start})", os.fspath(path), line) from None


def read_text_strict(path: str | os.PathLike[str], max_bytes: int | None = None, what: str = "file") -> str:
    """A regular file's text as strict UTF-8 (see :func:`read_regular` and :func:`decode_strict`)."""
    return decode_strict(read_regular(path, max_bytes, what), path, what)


# ----------------------------------------------------------------------------- private directories


class UnsafeDirError(FileProblem):
    """A directory that another user could change (or a symlink on its path): refused, never trusted."""

    def __init__(self, path: str, why: str):
        self.why = why
        super().__init__("state_unsafe", f"refusing it: {why}", path)
        self.args = (f"refusing {path}: {why}",)

    def __str__(self) -> str:
        return f"refusing {self.path}: {self.why}"


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC


def _check_ancestor(st: os.stat_result, path: str, uid: int) -> None:
    """sshd's ``StrictModes`` rule for a directory on the way: owned by root or us, and nobody
    else can rename its entries (not group/world-writable, unless sticky like ``/tmp``)."""
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirError(path, "it is not a directory")
    if st.st_uid not in (0, uid):
        raise UnsafeDirError(path, f"it is owned by uid {st.st_uid}, who could swap the entries under it "
                                   f"(every directory on the path must be owned by root or uid {uid})")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        kind = "world-writable without the sticky bit" if st.st_mode & 0o002 else "writable by group or others"
        raise UnsafeDirError(path, f"it is {kind} (mode {oct(st.st_mode & 0o7777)}): another user could swap "
                                   f"the entries under it")


def not_a_dir(path: Path) -> str | None:
    """What ``path`` is when it is there and is not a directory, as the messages name it ("a FIFO", "a character
    device", "a socket", "a regular file"; through a symlink, said: "a symlink to fifo, which is a FIFO"); None
    for a directory, a missing path or one that cannot be examined (the callers' own checks name those).
    ``stat`` only: a FIFO or device is never opened."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISDIR(mode):
        return None
    kind = kind_of(mode)
    try:
        return f"a symlink to {os.readlink(path)}, which is {kind}" if path.is_symlink() else kind
    except OSError:
        return kind


def _kind(name: str, dir_fd: int) -> str:
    try:
        return "a symlink" if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode) \
            else "not a directory"
    except OSError:
        return "not a directory"


class PrivateDir:
    """A directory only this uid can change, held open by fd (see the module docstring).

    :meth:`open` walks ``path`` (made absolute, its parent resolved first, so a
    symlinked ``~/.cache`` works; the directory itself must not be a symlink)
    from ``/`` with ``O_NOFOLLOW``:
    every ancestor must be owned by root or this uid and not writable by others
    unless sticky; the directory itself (created 0700 when missing) must be
    owned by this uid and not writable by group or others (group/other read
    bits are dropped quietly). A component swapped for a symlink between the
    resolve and the walk is refused, never followed.
    """

    SECRET = ".secret"

    def __init__(self, fd: int, path: str, readonly: bool = False):
        self.fd = fd
        self.path = path
        #: A read-only view (:meth:`open` with ``readonly=True``): it creates no directory, secret or entry
        #: and changes no mode; :meth:`write` raises ``EROFS`` and a sealed entry reads None without a secret.
        self.readonly = readonly
        self._secret: bytes | None = None

    # -- opening -------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], what: str = "cache", create: bool = True, *,
             readonly: bool = False) -> PrivateDir:
        """``readonly``: the same checks, but nothing is created (a missing directory raises
        ``FileNotFoundError``) and no mode is tightened: what a dry run may do."""
        create = create and not readonly
        path = os.path.abspath(os.fspath(path))
        # Symlinks above the directory are resolved (the resolved path is then checked
        # strictly); the directory itself must not be one.
        path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        uid = os.geteuid()
        parts = [p for p in path.split(os.sep) if p]
        fd = os.open("/", _DIR_FLAGS)
        here = "/"
        try:
            _check_ancestor(os.fstat(fd), here, uid)
            for i, name in enumerate(parts):
                last = i == len(parts) - 1
                here = os.path.join(here, name)
                try:
                    nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(name, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                    nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise UnsafeDirError(here, f"the {what} directory or a directory on its path is "
                                                   f"{_kind(name, fd)}") from None
                    raise
                os.close(fd)
                fd = nfd
                st = os.fstat(fd)
                if not last:
                    _check_ancestor(st, here, uid)
            if parts:
                cls._check_own(fd, st, path, uid, what, readonly)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path, readonly)

    @staticmethod
    def _check_own(fd: int, st: os.stat_result, path: str, uid: int, what: str, readonly: bool = False) -> None:
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeDirError(path, f"the {what} directory is not a directory")
        if st.st_uid != uid:
            raise UnsafeDirError(path, f"the {what} directory is owned by uid {st.st_uid}, not by this process "
                                       f"(uid {uid})")
        if st.st_mode & 0o022:
            raise UnsafeDirError(path, f"the {what} directory is writable by group or others "
                                       f"(mode {oct(st.st_mode & 0o777)}); chmod 700 it or remove it")
        if st.st_mode & 0o077 and not readonly:
            os.fchmod(fd, 0o700)  # ours and not writable by others: tighten quietly

    def sub(self, name: str, what: str = "cache") -> PrivateDir:
        """The child directory ``name`` (created 0700), with the same checks, through our fd."""
        full = os.path.join(self.path, name)
        if not self.readonly:  # a read-only view creates nothing: a missing child raises FileNotFoundError
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
            except FileExistsError:
                pass
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeDirError(full, f"the {what} directory is {_kind(name, self.fd)}") from None
            raise
        try:
            self._check_own(fd, os.fstat(fd), full, os.geteuid(), what, self.readonly)
        except BaseException:
            os.close(fd)
            raise
        return PrivateDir(fd, full, self.readonly)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:  # noqa: D105 - caches live as long as the process; be tidy in tests
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # -- entries ---------------------------------------------------------------

    def read(self, name: str, max_bytes: int | None = None) -> bytes | None:
        """The bytes of regular file ``name``, or None when it is missing, a symlink or not regular."""
        try:
            return read_regular(name, max_bytes, dir_fd=self.fd, follow_symlinks=False)
        except FileProblem:
            return None

    def write(self, name: str, data: bytes, mode: int = 0o600, durable: bool = False) -> None:
        if self.readonly:
            raise OSError(errno.EROFS, "a read-only view of the cache writes nothing", os.path.join(self.path, name))
        atomic_write(name, data, mode, durable=durable, dir_fd=self.fd)

    def exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            return True
        except OSError:
            return False

    # -- sealed entries ----------------------------------------------------------

    def secret(self) -> bytes:
        """32 random bytes in ``.secret`` (0600, ours), created on first use; the HMAC key of this dir."""
        if self._secret is not None:
            return self._secret
        for _ in range(3):
            try:
                fd = os.open(self.SECRET, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK, dir_fd=self.fd)
            except FileNotFoundError:
                fd = None
            if fd is not None:
                try:
                    st = os.fstat(fd)
                    data = os.read(fd, 64)
                finally:
                    os.close(fd)
                if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077
                        or len(data) != 32):
                    raise UnsafeDirError(os.path.join(self.path, self.SECRET),
                                         "the cache secret is not a 32-byte file of mode 0600 owned by this uid")
                self._secret = data
                return data
            if self.readonly:  # nothing was sealed here yet; a read-only view makes no secret
                raise FileNotFoundError(errno.ENOENT, "no cache secret (a read-only view creates none)",
                                        os.path.join(self.path, self.SECRET))
            # Write it under a temp name, then link: readers never see a short secret.
            tfd, tmp = create_temp(self.SECRET, 0o600, dir_fd=self.fd)
            try:
                with os.fdopen(tfd, "wb") as fh:
                    fh.write(os.urandom(32))
                    fh.flush()
                    os.fsync(fh.fileno())
                try:
                    os.link(tmp, self.SECRET, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
                except FileExistsError:
                    pass  # another process won the race: read theirs
            finally:
                try:
                    os.unlink(tmp, dir_fd=self.fd)
                except OSError:
                    pass
        raise UnsafeDirError(os.path.join(self.path, self.SECRET), "the cache secret could not be created")

    def _mac(self, kind: str, name: str, payload: bytes) -> bytes:
        import hmac

        return hmac.new(self.secret(), b"%s\0%s\0" % (kind.encode(), name.encode()) + payload, "sha256").digest()

    def seal(self, kind: str, name: str, payload: bytes) -> bytes:
        """``payload`` prefixed with its HMAC over (kind, name, payload)."""
        return self._mac(kind, name, payload) + payload

    def unseal(self, kind: str, name: str, blob: bytes | None) -> bytes | None:
        """The payload of a sealed blob, or None when the MAC does not match (forged, moved, damaged)."""
        import hmac

        if blob is None or len(blob) < 32:
            return None
        if self.readonly and self._secret is None and not self.exists(self.SECRET):
            return None  # no secret: nothing here was sealed by this uid, and a read-only view creates none
        payload = blob[32:]
        return payload if hmac.compare_digest(blob[:32], self._mac(kind, name, payload)) else None

    def put_sealed(self, kind: str, name: str, payload: bytes) -> None:
        self.write(name, self.seal(kind, name, payload))

    def get_sealed(self, kind: str, name: str, max_bytes: int | None = None) -> bytes | None:
        return self.unseal(kind, name, self.read(name, max_bytes))


def python_tag() -> str:
    """``py311`` style: caches of derived facts are per Python version."""
    return f"py{sys.version_info[0]}{sys.version_info[1]}"
