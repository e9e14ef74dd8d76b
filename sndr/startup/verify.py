"""``python -m sndr apply --verify [--tree DIR]``: the warm fast path (no pydantic, no planner).

A whole ``--verify`` process used to cost ~400 ms, nearly all of it importing
pydantic through :mod:`sndr.model`, against ~4 ms of checking. When the tree is
in the ordinary state this path answers from what the startup hook already
keeps warm:

* the tree: ``--tree DIR``, or without ``--tree`` the vLLM this interpreter
  would import, found with :func:`importlib.machinery.PathFinder.find_spec`
  (which locates a top-level package without importing it) and taken only when
  it is the root an earlier full verify found with :func:`sndr.tree.find_installed_root`
  for the same interpreter and ``sys.path`` (the deploy recipe and operators call
  ``apply --verify`` without ``--tree``);
* the tree's vLLM version, memoised under :func:`resolve.tree_identity` by an
  earlier full verify (the very ``open_tree(root).version`` it computed);
* the resolved patch set: :func:`resolve.resolve_set`'s memo, under the same
  fingerprint every vLLM process uses (patch files, ``SNDR_ENABLE_*``, profile,
  packs, sndr's own code), read without loading it;
* the ledger, checked as the hook checks it: its checksum (so a hand edit is
  caught as the full reader catches it), its digest against the resolved one,
  every file's sha256 against ``patched_sha256``, under the shared lock.

It prints the full report's first and last lines (``sndr verify: TREE (vllm V)``
... ``ok  enabled set DIGEST``) and exits 0. Anything else falls back to the
full verifier, which prints the detailed report: a cold memo, no ledger, a
pending journal, probe files, ``left_out`` patches, any mismatch, and every
option other than ``--tree DIR``, ``--patches DIR`` and ``-q`` (``--json``,
``-v``, ``--only``, ``--profile``; :mod:`sndr.commands.apply` decides, on the one
parser's arguments). After a fallback the memos are primed, so the next verify
is fast. The fast path never says ok where the full verifier would not:
``tests/startup/test_verify_fast.py`` runs both on the same trees.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Mapping

from .. import state as statemod
from .common import read_bytes, sha256
from .hookcache import HookCache, open_cache
from .resolve import code_stamp, memo_key, patches_dir, resolve_set, tree_identity

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _root(spec: str) -> str | None:
    """A plain directory holding ``vllm/`` (:func:`sndr.treespec.plain_dir`: ``sndr.tree.directory``'s rule), else None."""
    from ..treespec import plain_dir  # stdlib only

    return plain_dir(spec)


def _search_path() -> list[str]:
    """``sys.path`` as :func:`sndr.tree.find_installed_root`'s child interpreter sees it: without the entry of
    the script or the current directory (the child runs in a neutral directory), so neither shadows vLLM."""
    return list(sys.path if sys.flags.safe_path else sys.path[1:])


def _installed_key() -> str:
    # The interpreter, the path it searches and the finders on sys.meta_path (an editable install's or a .pth's
    # finder can serve vllm from elsewhere): any change is a new key, so the full verifier finds the root again.
    finders = [f"{type(f).__module__}.{type(f).__qualname__}" for f in sys.meta_path]
    return "installed-" + sha256(repr((sys.executable, _search_path(), finders, code_stamp())).encode())


def _find_installed() -> str | None:
    """The directory holding the ``vllm/`` this interpreter would import, located without importing it."""
    from importlib.machinery import PathFinder

    try:
        spec = PathFinder.find_spec("vllm", _search_path())
    except (ImportError, ValueError, OSError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    from pathlib import Path  # str(Path(...).parent): the spelling the full report prints

    return str(Path(list(spec.submodule_search_locations)[0]).parent)


def _installed_root(cache: HookCache) -> str | None:
    """No ``--tree``: the installed vLLM's root, when it is the one the last full verify found; else None."""
    found = _find_installed()
    memo = cache.load_memo(_installed_key())
    return found if found is not None and memo is not None and memo.get("root") == found else None


def _version_key(root: str) -> str:
    # The tree's identity and sndr's own code (the stamp names the tree views the version is read with): an
    # upgrade of sndr never reuses a version an older rule computed.
    return "treever-" + sha256(repr((tree_identity(root), code_stamp())).encode())


def _set_key(root: str, version: str, environ: Mapping[str, str], cache: HookCache, pdir: str) -> str:
    # resolve_set's key, exactly (the memo every vLLM process reads and writes).
    return memo_key("set-", pdir, tree_identity(root) + "\0" + version, environ, cache)[0]


def check(tree: str | None, patches: str | None, environ: Mapping[str, str]) -> tuple[str, str, str] | None:
    """(root, version, digest) when the tree verifies on the warm path; None: ask the full verifier."""
    cache = open_cache(environ)
    if cache is None:
        return None
    root = _root(tree) if tree is not None else _installed_root(cache)
    if root is None:
        return None
    memo = cache.load_memo(_version_key(root))
    version = memo.get("version") if memo is not None else None
    if not isinstance(version, str) or not version:
        return None
    pdir = os.path.abspath(patches) if patches else patches_dir(environ)
    resolved = cache.load_memo(_set_key(root, version, environ, cache, pdir))
    if resolved is None or resolved.get("format") != 1 or not isinstance(resolved.get("digest"), str):
        return None
    if resolved.get("unknown_enable"):
        return None  # an SNDR_ENABLE_* naming no patch: the full verifier says so
    try:
        sfd = statemod.open_state_dir(root)
    except statemod.StateProblem:
        return None  # the full verifier names it
    if sfd is None:
        return None
    try:
        try:  # the shared lock of sndr.commit.TreeRoot.lock: a verify never reads a commit half-way
            lfd = os.open(statemod.LOCK, os.O_RDWR | _NOFOLLOW | _CLOEXEC, dir_fd=sfd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EROFS, errno.EACCES, errno.EPERM):
                return None
            lfd = None
        import fcntl

        if lfd is not None:
            fcntl.flock(lfd, fcntl.LOCK_SH)
        try:
            try:
                if statemod.read_state_file(sfd, statemod.JOURNAL, statemod.state_path(root, statemod.JOURNAL)) \
                        is not None:
                    return None  # an interrupted commit: the full verifier rolls it back
            except statemod.StateProblem:
                return None  # the full verifier names it
            found = statemod.read_ledger_at(sfd, root)  # the one reader: a bad ledger is the full verifier's to name
            led = found.ledger
            if led is None or led["left_out"] or led["vllm_version"] != version \
                    or led["patch_set_digest"] != resolved["digest"]:
                return None
            for rel, entry in led["files"].items():
                data = read_bytes(os.path.join(root, rel))
                if data is None or sha256(data) != entry["patched_sha256"]:
                    return None
            if not _stored_copies_whole(sfd, led["files"]):
                return None  # the full verifier names the missing or damaged copy (object_missing, ...)
            if statemod.find_probes(root, led["files"]):
                return None
        finally:
            if lfd is not None:
                fcntl.flock(lfd, fcntl.LOCK_UN)
                os.close(lfd)
    finally:
        os.close(sfd)
    return root, version, resolved["digest"]


def prime(tree: str | None, patches: str | None, environ: Mapping[str, str]) -> None:
    """After a full verify: memoise the tree's version and the resolved set (what the fast path reads), and
    without ``--tree`` the installed root :func:`sndr.tree.find_installed_root` found."""
    cache = open_cache(environ)
    if cache is None:
        return
    from ..errors import SndrError
    from ..tree import find_installed_root, open_tree

    try:
        if tree is None:
            root: str | None = str(find_installed_root())
            if root != _find_installed():
                return  # this interpreter's own lookup disagrees: the fast path cannot name the tree
            cache.store_memo(_installed_key(), {"root": root})
        else:
            root = _root(tree)
        if root is None:
            return
        version = open_tree(root).version
        cache.store_memo(_version_key(root), {"version": version})
        pdir = os.path.abspath(patches) if patches else patches_dir(environ)
        resolve_set(version, tree_identity(root), environ, cache, pdir)
    except SndrError:
        pass  # the full verifier has already reported what is wrong with this tree or set


def _stored_copies_whole(sfd: int, files: Mapping[str, Mapping[str, object]]) -> bool:
    """Every pristine copy in ``.sndr/objects`` the ledger's files need (what revert puts back; a created file
    needs none) is there, a regular file, with its hash: the full verifier's ``object_missing`` /
    ``object_corrupt`` check (``sndr.apply._stored_copy_problems``), so this path never says ok where it
    would not."""
    from ..fsio import FileProblem, read_regular

    try:
        ofd = os.open(statemod.OBJECTS, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=sfd)
    except OSError:
        return not any(not e["created"] for e in files.values())
    try:
        for entry in files.values():
            if entry["created"]:
                continue
            sha = str(entry["pristine_sha256"])
            try:
                if sha256(read_regular(sha, None, "stored copy", dir_fd=ofd, follow_symlinks=False)) != sha:
                    return False
            except (FileProblem, ValueError):
                return False
    finally:
        os.close(ofd)
    return True


def answer(tree: str | None, patches: str | None, quiet: bool, environ: Mapping[str, str] | None = None) -> int | None:
    """The warm answer (exit 0, the full report's head and verdict lines) when there is one; None: run the full
    verifier, then :func:`prime`."""
    environ = os.environ if environ is None else environ
    found = check(tree, patches, environ)
    if found is None:
        return None
    root, version, digest = found
    if not quiet:
        sys.stdout.write(f"sndr verify: {root} (vllm {version})\nok  enabled set {digest[:12]}\n")
    return 0
