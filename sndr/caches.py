"""sndr's disk caches: the one trust rule for the cache root, and the planner's caches.

**The cache-root rule** (one decision for every cache): ``<cache root>``
(:func:`sndr.env.cache_root`, symlinks resolved) is opened as a
:class:`sndr.fsio.PrivateDir`: walked from ``/`` with ``O_NOFOLLOW``, every
directory on the way owned by root or this uid and not writable by others
unless sticky (sshd's ``StrictModes``), the root itself owned by this uid and
not group/other-writable. A cache directory under it (``hook``, ``cubin``,
``plan-<python>``, ``trees``, ``preflight``, ...) is reached through the
root's held fd with the same check. If the root fails, **every** cache under it
is refused: compiled code, cubins, plan memos, fetched trees, preflight
indexes. :func:`open_dir` is the API (None when refused, said once on stderr);
:func:`require_dir` raises instead, for a command that cannot work without
the cache (``--tree vllm==X``). Entries that run as code are further sealed
with the directory's 0600 secret (:meth:`sndr.fsio.PrivateDir.put_sealed`), so
one is used only when this uid wrote it under exactly this name.

The planner's caches: the core (:mod:`sndr.plan`, :mod:`sndr.locate`) never
looks for a cache directory: a plan reads only what its reader returns and
writes nothing, whatever the environment says. A command that wants the
speed-up calls :func:`enable` once, with its environment; it opens
``<cache root>/plan-<python>`` with :func:`open_dir` and injects it. An unsafe
or unwritable cache directory turns the caches off and says so once; the plan
is the same either way.

**A dry run writes nothing** (under the cache root either): ``enable(readonly=True)``
injects a read-only view (:class:`sndr.fsio.PrivateDir` with ``readonly``): entries
already there are read (under the same seal), nothing is created or written, no
mode is tightened, and a cache that does not exist yet is simply not used.

Two caches share the plan directory:

* ``ok-<sha256>``: "this exact patched text compiled under this Python";
* ``scopes-<sha256>.json``: the def/class spans of a source text (report labels).
"""

from __future__ import annotations

import os
from pathlib import Path

from . import env, fsio
from .stderr import say

__all__ = ["dir_path", "disable", "enable", "open_dir", "open_plan_cache", "require_dir", "root_path"]

def root_path(root: str | os.PathLike[str] | None = None, environ=None) -> str:
    """The cache root as an absolute path with symlinks resolved (the path the rule checks)."""
    return os.path.realpath(os.fspath(root) if root is not None else env.cache_root(environ))


def require_dir(name: str, what: str, *, root: str | os.PathLike[str] | None = None,
                environ=None, readonly: bool = False) -> fsio.PrivateDir:
    """``<cache root>/<name>`` (``name`` may be ``a/b``) under the cache-root rule, created 0700 when missing.

    Raises :class:`sndr.fsio.UnsafeDirError` when the root (so every cache under
    it) or the directory is refused, ``OSError`` when it cannot be created.
    ``readonly``: a read-only view that creates and changes nothing (``FileNotFoundError`` when missing).
    """
    base = fsio.PrivateDir.open(root_path(root, environ), "cache root", readonly=readonly)
    d = base
    try:
        for part in [p for p in name.split("/") if p]:
            nxt = d.sub(part, what)
            if d is not base:
                d.close()
            d = nxt
    except BaseException:
        if d is not base:
            d.close()
        base.close()
        raise
    if d is not base:
        base.close()
    return d


def open_dir(name: str, what: str, *, root: str | os.PathLike[str] | None = None, environ=None,
             without: str = "continuing without it", readonly: bool = False) -> fsio.PrivateDir | None:
    """:func:`require_dir`, or None (said once on stderr, ``without`` saying what that costs) when refused.
    ``readonly``: a read-only view, or None (quietly) where the directory does not exist yet."""
    try:
        return require_dir(name, what, root=root, environ=environ, readonly=readonly)
    except fsio.UnsafeDirError as exc:
        say(f"{exc}; the {what} is disabled ({without})", once_key=f"unsafe:{what}:{exc.path}")
    except OSError as exc:
        if readonly and isinstance(exc, FileNotFoundError):
            return None  # nothing cached yet, and a read-only view creates nothing
        say(f"cannot use the {what} under {root_path(root, environ)} ({exc.strerror or exc}); {without}",
            once_key=f"oserror:{what}:{name}")
    return None


def dir_path(name: str, what: str, *, root: str | os.PathLike[str] | None = None, environ=None,
             without: str = "continuing without it") -> Path | None:
    """The checked path of :func:`open_dir` (its fd closed), for a cache that is read by path: safe,
    since every directory on it is owned by root or this uid and nobody else can rename entries there."""
    d = open_dir(name, what, root=root, environ=environ, without=without)
    if d is None:
        return None
    d.close()
    return Path(d.path)


def open_plan_cache(environ=None, *, readonly: bool = False) -> fsio.PrivateDir | None:
    """The planner's cache directory under the cache root, or None (said on stderr) when unsafe;
    ``readonly``: a read-only view of it, or None where it does not exist yet."""
    return open_dir(env.plan_cache_name(fsio.python_tag()), "plan cache", environ=environ,
                    without="plans are the same, only slower", readonly=readonly)


def enable(environ=None, *, readonly: bool = False) -> fsio.PrivateDir | None:
    """Inject the plan cache (or None) into the core; returns it. ``readonly`` (a dry run): the entries
    already there are read, nothing is written under the cache root."""
    from . import locate, plan

    cache = open_plan_cache(environ, readonly=readonly)
    plan.use_compile_memo(cache)
    locate.use_disk_cache(cache)
    return cache


def disable() -> None:
    from . import locate, plan

    plan.use_compile_memo(None)
    locate.use_disk_cache(None)
