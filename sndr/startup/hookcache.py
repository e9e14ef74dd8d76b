"""The owner-checked cache behind a warm start (``<cache root>/hook``) and the safe-directory helpers.

:class:`HookCache` holds compiled code, patched sources and memos, every entry
sealed by an HMAC under a per-cache secret; :func:`open_cache` opens the
process's one (or refuses it loudly). :func:`secure_dir`, :func:`open_private`
and :func:`atomic_write` are :mod:`sndr.fsio`'s rules under the names the
startup modules (the hook, the attestation records) use.
"""

from __future__ import annotations

import sys

from .common import log, sha256


def _fsio():
    from .. import fsio  # the rule's one home (stdlib only); imported when first needed

    return fsio


def open_private(path: str, what: str = "cache"):
    """:class:`sndr.fsio.PrivateDir` of ``path``: walked from ``/`` without following symlinks, every
    ancestor owned by root or this uid and not writable by others, held open by fd."""
    return _fsio().PrivateDir.open(path, what)


def secure_dir(path: str, what: str = "cache") -> str:
    """Create ``path`` with mode 0700 (if missing) and check nobody else can change it or its path.

    A poisoned code cache would run in every vLLM process, and a forged
    attestation would hide an unpatched worker, so both are refused, loudly,
    when the directory is owned by another uid or writable by group/others, or
    when any directory on its path is owned by another uid than root or ours, or
    writable by others without the sticky bit (sshd's ``StrictModes`` rule).
    Returns the resolved path; callers that then read or write inside it use
    :func:`open_private` and its fd instead of the path.
    """
    d = open_private(path, what)
    try:
        return d.path
    finally:
        d.close()


def atomic_write(path: str, data: bytes, mode: int = 0o600) -> None:
    """Random ``O_EXCL | O_NOFOLLOW`` temp file + ``os.replace`` (:func:`sndr.fsio.atomic_write`)."""
    _fsio().atomic_write(path, data, mode, durable=False)


def default_cache_root(environ=None) -> str:
    from .. import env

    return str(env.cache_root(environ))


# ----------------------------------------------------------------------------- the cache


def py_tag() -> str:
    from importlib.util import MAGIC_NUMBER

    return f"{sys.implementation.cache_tag}-{MAGIC_NUMBER.hex()}"


class HookCache:
    """Compiled code, patched sources and memos under ``<cache root>/hook``.

    Layout (every entry sealed: an HMAC-SHA256 under ``hook/.secret``, a 0600
    file created on first use, over the entry's kind, its name and its bytes)::

        code/<key>           hmac(32) + MAGIC + marshal(code); key = sha256(source sha, digest, Python, filename)
        src/<sha256>.py      hmac(32) + patched source, whose sha256 is its name
        memo/<name>.json     hmac(32) + resolved patch sets, memory plans, bindings, pack discovery

    The directories are reached by a walk from ``/`` that refuses symlinks and
    any directory another uid could change (the cache-root rule,
    :func:`sndr.caches.require_dir`, over :class:`sndr.fsio.PrivateDir`), and
    every read and write goes through their held fds. So an entry is used only
    when this uid wrote it, for exactly this name: a code object is only ever
    the one compiled from the patched source whose sha256 this process computed.
    """

    def __init__(self, root: str):
        from .. import env
        from ..caches import require_dir  # the cache-root rule (one decision for every cache)

        hook = require_dir(env.CACHE_HOOK, "code cache", root=root)
        self._hook = hook
        self._code = hook.sub("code", "code cache")
        self._src = hook.sub("src", "code cache")
        self._memo = hook.sub("memo", "code cache")
        self.root = hook.path
        self.code_dir = self._code.path
        self.src_dir = self._src.path
        self.memo_dir = self._memo.path
        # One secret for the whole cache, read through the hook dir's fd.
        secret = hook.secret()
        for d in (self._code, self._src, self._memo):
            d._secret = secret

    # -- compiled code -----------------------------------------------------

    @staticmethod
    def code_key(source_sha256: str, digest: str, filename: str) -> str:
        """sha256 over the exact patched source's hash, the patch-set digest, the Python and the filename."""
        return sha256("\0".join(("code", py_tag(), source_sha256, digest, filename)).encode())

    def load_code(self, key: str):
        import marshal
        from importlib.util import MAGIC_NUMBER

        data = self._code.get_sealed("code", key)
        if data is None or data[:len(MAGIC_NUMBER)] != MAGIC_NUMBER:
            return None  # missing, forged, moved, damaged or another Python: recompile, never trust
        try:
            return marshal.loads(data[len(MAGIC_NUMBER):])
        except (EOFError, ValueError, TypeError):
            return None

    def store_code(self, key: str, code) -> None:
        import marshal
        from importlib.util import MAGIC_NUMBER

        try:
            self._code.put_sealed("code", key, MAGIC_NUMBER + marshal.dumps(code))
        except OSError as exc:
            log(f"cannot write the code cache ({exc}); continuing without it", once_key="code-write")

    # -- patched sources ---------------------------------------------------

    def load_source(self, sha: str) -> str | None:
        data = self._src.get_sealed("src", sha + ".py")
        if data is None or sha256(data) != sha:
            return None
        return data.decode("utf-8")

    def store_source(self, text: str) -> str:
        data = text.encode("utf-8")
        sha = sha256(data)
        if self.load_source(sha) is None:
            try:
                self._src.put_sealed("src", sha + ".py", data)
            except OSError as exc:
                log(f"cannot write the source cache ({exc}); continuing without it", once_key="src-write")
        return sha

    # -- memos -------------------------------------------------------------

    def load_memo(self, name: str):
        import json

        data = self._memo.get_sealed("memo", name + ".json")
        if data is None:
            return None
        try:
            obj = json.loads(data)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("key") != name:
            return None
        return obj

    def store_memo(self, name: str, obj: dict) -> None:
        import json

        obj = dict(obj, key=name)
        try:
            self._memo.put_sealed("memo", name + ".json", json.dumps(obj, sort_keys=True).encode())
        except OSError as exc:
            log(f"cannot write the memo cache ({exc}); continuing without it", once_key="memo-write")


_CACHES: dict[str, HookCache | None] = {}


def open_cache(environ=None) -> HookCache | None:
    """The process's cache, or None (refused loudly) when it is unsafe or cannot be created."""
    root = default_cache_root(environ)
    if root in _CACHES:
        return _CACHES[root]
    cache = None
    try:
        cache = HookCache(root)
    except _fsio().UnsafeDirError as exc:
        log(f"{exc}. The code cache is disabled; sndr compiles in memory instead", once_key="unsafe:" + root)
    except OSError as exc:
        log(f"cannot create the cache under {root} ({exc.strerror}); continuing without it", once_key="nocache:" + root)
    _CACHES[root] = cache
    return cache
