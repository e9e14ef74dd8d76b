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
"""

from __future__ import annotations

import errno
import os
import secrets
import stat

__all__ = ["FileProblem", "TEMP_MARK", "atomic_write", "create_temp", "fsync_dir", "read_regular",
           "read_text_strict", "is_temp_name"]

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


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_temp(path: str | os.PathLike, mode: int = 0o644, dir_fd: int | None = None) -> tuple[int, str]:
    """Create the temp file for an atomic replace of ``path``; returns ``(fd, temp_path)``.

    The temp file sits beside ``path`` (same filesystem, so the rename is
    atomic), has a random name, and is created exclusively without following
    symlinks. With ``dir_fd``, ``path`` is a name relative to that directory.
    """
    path = os.fspath(path)
    head, name = os.path.split(path)
    for _ in range(16):
        tmp = os.path.join(head, f".{name}{TEMP_MARK}{secrets.token_hex(6)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "could not create a unique temp file", path)


def atomic_write(path: str | os.PathLike, data: bytes, mode: int | None = None, *, durable: bool = True,
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


def read_regular(path: str | os.PathLike, max_bytes: int | None = None, what: str = "file") -> bytes:
    """The bytes of a regular file, refusing FIFOs, devices and directories without blocking.

    Raises :class:`FileProblem` with code ``not_found``, ``not_regular``,
    ``file_too_large`` or ``unreadable``.
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)
    except FileNotFoundError:
        raise FileProblem("not_found", f"{what} does not exist", path) from None
    except OSError as exc:
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


def decode_strict(raw: bytes, path: str | os.PathLike, what: str = "file") -> str:
    """``raw`` as strict UTF-8; a bad byte raises ``not_utf8`` with its line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise FileProblem("not_utf8", f"{what} is not UTF-8 (byte {exc.start})", os.fspath(path), line) from None


def read_text_strict(path: str | os.PathLike, max_bytes: int | None = None, what: str = "file") -> str:
    """A regular file's text as strict UTF-8 (see :func:`read_regular` and :func:`decode_strict`)."""
    return decode_strict(read_regular(path, max_bytes, what), path, what)
