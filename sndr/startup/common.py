"""What every startup module shares: a loud log line, an exception in one line, a file's bytes and sha256.

Standard library only (imported at interpreter start by the ``.pth`` boot, through
:mod:`sndr.startup.importer`); :mod:`sndr.fsio` is imported when a file is first read.
"""

from __future__ import annotations

from ..stderr import say as log  # the one stderr warning line (stdlib only)

__all__ = ["describe", "log", "read_bytes", "sha256"]


def sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def read_bytes(path: str) -> bytes | None:
    """A regular file's bytes, or None when it is missing or cannot be one: a FIFO, device or directory
    (refused without blocking: :func:`sndr.fsio.read_regular`), a symlink loop, a name too long, a NUL."""
    from .. import fsio  # the rule's one home (stdlib only); imported when first needed

    try:
        return fsio.read_regular(path)
    except (fsio.FileProblem, ValueError):
        return None


def describe(exc: BaseException) -> str:
    """An exception in one line: a :class:`sndr.errors.SndrError` as it renders, else ``Type: message``."""
    render = getattr(exc, "render", None)
    if callable(render):
        try:
            return render().replace("\n", "; ")
        except Exception:  # noqa: BLE001
            pass
    return f"{type(exc).__name__}: {exc}"
