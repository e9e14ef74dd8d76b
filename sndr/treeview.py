"""The read-only view of a vLLM source tree (:class:`Tree`), its directory form and its pristine reading.

Everything downstream (classify, plan, preflight, manifest) codes against
:class:`Tree`, so the kind of source never leaks past :mod:`sndr.tree`. Two
properties hold for every view:

* ``files()`` lists the ``.py`` files under ``vllm/`` as sorted posix paths;
* ``digest`` hashes exactly those paths and contents, so the same source gives
  the same digest whether it is read from a directory, a zip or a git object
  store. That is what lets a pin be named by content.

Nothing here imports vLLM: versions are read from metadata or parsed
statically. This module holds the interface, the helpers every source shares,
:class:`DirTree` (a directory: a checkout, site-packages, a cached release) and
:class:`PristineView` (a patched tree read as upstream shipped it). The other
sources each have their own module (see :mod:`sndr.tree`).
"""

from __future__ import annotations

import abc
import ast
import hashlib
import os
import re
import subprocess
from collections.abc import Callable, Collection
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Self

from packaging.version import InvalidVersion, Version

from .errors import SndrError, bad_input
from .treespec import PKG as _PKG

if TYPE_CHECKING:
    from .model import Ledger

__all__ = ["DirTree", "PristineView", "Tree", "check_rel", "describe_version", "is_source", "metadata_version",
           "run_git", "static_version", "tree_digest"]


# ----------------------------------------------------------------------------- helpers


def check_rel(rel: str) -> str:
    """Reject paths that could escape the tree; views only serve what is inside it."""
    if (
        not rel
        or rel.startswith("/")
        or "\\" in rel
        or "\x00" in rel
        or any(part in ("", ".", "..") for part in rel.split("/"))
    ):
        raise bad_input("bad_path", f"{rel!r} is not a relative posix path inside the tree", file=rel)
    return rel


def is_source(rel: str) -> bool:
    return rel.startswith(_PKG + "/") and rel.endswith(".py")


def tree_digest(pairs) -> str:
    """Digest of ``(relpath, content)`` pairs given in sorted path order.

    Each file contributes ``relpath NUL sha256hex(content) LF``. Hashing the
    per-file hashes (rather than the concatenated bytes) keeps it unambiguous
    and lets a caller that already knows file hashes reuse them.
    """
    outer = hashlib.sha256()
    for rel, data in pairs:
        outer.update(f"{rel}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    return outer.hexdigest()


def metadata_version(text: str | None) -> str | None:
    """The ``Version:`` header of a METADATA/PKG-INFO text (headers end at the first blank line)."""
    if not text:
        return None
    for line in text.splitlines():
        if not line.strip():
            break
        if line.lower().startswith("version:"):
            return line.split(":", 1)[1].strip() or None
    return None


def static_version(source: str | None) -> str | None:
    """A literal ``__version__``/``version`` assigned at module level, else None.

    Only top-level assignments count: vLLM's ``version.py`` sets a ``"dev"``
    fallback inside ``try/except``, which must not win over ``_version.py``.
    """
    if not source:
        return None
    try:
        module = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in module.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if names & {"__version__", "version"} and isinstance(value, ast.Constant) and isinstance(value.value, str):
            try:
                Version(value.value)
            except InvalidVersion:
                continue
            return value.value
    return None


def describe_version(describe: str) -> str | None:
    """Turn ``git describe --tags --long`` output into a PEP 440 version.

    An exact tag gives the tag; otherwise mimic setuptools-scm's default
    (next micro, ``.devN+gSHA``), which is what a build of that revision
    would report and what ``vllm = ...`` specifiers are compared against.
    """
    m = re.match(r"^v?(?P<tag>.+)-(?P<n>\d+)-g(?P<sha>[0-9a-f]+)$", describe.strip())
    if not m:
        return None
    try:
        tag = Version(m["tag"])
    except InvalidVersion:
        return None
    n = int(m["n"])
    if n == 0:
        return str(tag)
    local = f"+g{m['sha']}"
    if tag.is_devrelease:
        return f"{tag.base_version}.dev{n}{local}"
    if tag.is_prerelease:
        return f"{tag}.dev{n}{local}"
    major, minor, micro = (list(tag.release) + [0, 0, 0])[:3]
    return f"{major}.{minor}.{micro + 1}.dev{n}{local}"


def run_git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True)
    except FileNotFoundError:
        raise bad_input("git_not_found", "git is not installed; a git tree needs the git command") from None
    if check and proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        raise bad_input("git_failed", f"git {' '.join(args)} failed in {repo}: {msg[-1] if msg else proc.returncode}")
    return proc



# ----------------------------------------------------------------------------- base


class Tree(abc.ABC):
    """A read-only view of a source tree whose root contains ``vllm/``."""

    kind: str = ""
    spec: str = ""
    root: Path | None = None

    @abc.abstractmethod
    def files(self) -> list[str]:
        """Sorted posix relpaths of every ``.py`` file under ``vllm/``."""

    @abc.abstractmethod
    def read_bytes(self, rel: str) -> bytes | None:
        """Content of any file in the tree, or None when it is missing."""

    def exists(self, rel: str) -> bool:
        return self.read_bytes(rel) is not None

    def read_text(self, rel: str) -> str | None:
        """Strict UTF-8 text: a patch engine must never guess an encoding and rewrite bytes."""
        data = self.read_bytes(rel)
        return None if data is None else self.decode(data, rel)

    def decode(self, data: bytes, rel: str) -> str:
        """``data`` of ``rel`` as strict UTF-8, or ``not_utf8`` naming the file and the line."""
        from . import fsio  # the strict-decode rule's one home

        try:
            return fsio.decode_strict(data, rel, "file")
        except fsio.FileProblem as exc:
            raise bad_input(exc.code, f"not valid UTF-8: {exc.message}", file=rel, line=exc.line) from None

    def metadata(self) -> str | None:
        """Text of the distribution's METADATA when the view has one, else None."""
        return None

    def _fallback_version(self) -> str | None:
        """Last resort for sources without metadata or ``_version.py`` (checkouts)."""
        return None

    @cached_property
    def version(self) -> str:
        """vLLM version: METADATA first, then ``version.py``/``_version.py``, then git describe."""
        found = metadata_version(self.metadata())
        for rel in (f"{_PKG}/version.py", f"{_PKG}/_version.py"):
            if found:
                break
            try:
                found = static_version(self.read_text(rel))
            except SndrError:
                found = None
        found = found or self._fallback_version()
        if not found:
            raise bad_input(
                "version_unknown",
                f"cannot tell the vLLM version of {self.spec}: no dist-info METADATA and no literal "
                f"__version__ in vllm/version.py or vllm/_version.py",
                file=self.spec,
                hint="build or install the tree (setuptools-scm writes vllm/_version.py), or read a tagged git revision",
            )
        return found

    @cached_property
    def digest(self) -> str:
        """sha256 over sorted (relpath, sha256(content)) of ``files()``; see :func:`tree_digest`."""
        return tree_digest(self._iter_contents())

    def _iter_contents(self):
        for rel in self.files():
            data = self.read_bytes(rel)
            if data is not None:
                yield rel, data

    def close(self) -> None:  # noqa: B027 - a default no-op: only views that hold handles override it
        """Release handles (zip file, git process). Views stay usable for cached values."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind}:{self.spec}>"


# ----------------------------------------------------------------------------- directory


class DirTree(Tree):
    """A directory that contains ``vllm/``: a checkout, site-packages, or a cached version.

    ``files()`` is not cached: commit writes into directory trees, and a
    listing taken before a created file would be wrong after it.
    """

    root: Path  # a directory view always has one

    def __init__(self, root: Path, spec: str | None = None, kind: str = "dir", metadata: str | None = None):
        self.root = Path(root)
        self.spec = str(spec if spec is not None else root)
        self.kind = kind
        self._metadata = metadata

    def _walk(self) -> list[tuple[str, str]]:
        """(relpath, abspath) of every .py under vllm/, sorted by relpath.

        ``os.scandir`` with an explicit stack is several times faster than
        ``Path.rglob`` and lets us skip ``__pycache__`` and directory symlinks
        (which could loop) cheaply.
        """
        out: list[tuple[str, str]] = []
        base = os.path.join(str(self.root), _PKG)
        stack = [(base, _PKG)]
        while stack:
            path, rel = stack.pop()
            try:
                entries = list(os.scandir(path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                sub = f"{rel}/{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append((entry.path, sub))
                elif entry.name.endswith(".py") and entry.is_file():
                    out.append((sub, entry.path))
        out.sort()
        return out

    def files(self) -> list[str]:
        return [rel for rel, _ in self._walk()]

    def _path(self, rel: str) -> Path:
        return self.root / check_rel(rel)

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            with open(self._path(rel), "rb") as fh:
                return fh.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise bad_input("unreadable", f"cannot read: {exc.strerror}", file=rel) from None

    def exists(self, rel: str) -> bool:
        return self._path(rel).is_file()

    def _iter_contents(self):
        # Open by the walked absolute path: skips re-validating and re-joining
        # ~3,000 paths, which keeps the digest at the read-and-hash floor.
        for rel, path in self._walk():
            try:
                with open(path, "rb") as fh:
                    yield rel, fh.read()
            except (FileNotFoundError, IsADirectoryError):
                continue

    def installer_hashes(self) -> dict[str, str]:
        """sha256 (hex) of every file as the installer wrote it, from vLLM's dist-info RECORD ({} without one)."""
        import base64

        out: dict[str, str] = {}
        for record in sorted(self.root.glob(f"{_PKG}-*.dist-info/RECORD")):
            try:
                lines = record.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                parts = line.rsplit(",", 2)
                if len(parts) == 3 and parts[1].startswith("sha256="):
                    raw = parts[1][len("sha256="):]
                    try:
                        out[parts[0]] = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
                    except ValueError:
                        continue
        return out

    def _dist_infos(self) -> list[Path]:
        return sorted(self.root.glob(f"{_PKG}-*.dist-info")) + sorted(self.root.glob(f"{_PKG}*.egg-info"))

    def metadata(self) -> str | None:
        if self._metadata is not None:
            return self._metadata
        texts = []
        for info in self._dist_infos():
            for name in ("METADATA", "PKG-INFO"):
                p = info / name
                if p.is_file():
                    texts.append(p.read_text(encoding="utf-8", errors="replace"))
                    break
        if len(texts) <= 1:
            return texts[0] if texts else None
        return self._pick_metadata(texts)

    def _pick_metadata(self, texts: list[str]) -> str:
        """Several vllm dist-infos (a botched upgrade): trust the one the source agrees with."""
        static = None
        for rel in (f"{_PKG}/version.py", f"{_PKG}/_version.py"):
            data = self.read_bytes(rel)
            static = static or static_version(data.decode("utf-8", "replace") if data else None)
        for text in texts:
            if static and metadata_version(text) == static:
                return text

        def key(text: str):
            try:
                return Version(metadata_version(text) or "0")
            except InvalidVersion:
                return Version("0")

        return max(texts, key=key)

    def _fallback_version(self) -> str | None:
        if not (self.root / ".git").exists():
            return None
        proc = run_git(self.root, "describe", "--tags", "--long", "--match", "v[0-9]*", "HEAD", check=False)
        return describe_version(proc.stdout.decode()) if proc.returncode == 0 else None



# ----------------------------------------------------------------------------- pristine


class PristineView(Tree):
    """A tree sndr patched, read as upstream shipped it: the one "read a patched tree as pristine".

    A file the ledger records is read from its pristine copy in ``.sndr/objects``
    (``get_object``: sha256 -> bytes, :meth:`sndr.commit.TreeRoot.get_object`), a
    file sndr created is absent (and not listed), every other file is read from
    ``base`` as it is. ``only`` narrows the ledger files read as pristine (``sndr
    list`` passes those that still hold sndr's bytes; default: all of them).
    Decoding is ``base``'s, so apply's dry run reads exactly what apply reads.
    Used by apply (dry run, verify's counts, the writes' after-bytes), ``sndr
    list`` and the preflight's snapshots; made by :meth:`sndr.commit.TreeRoot.pristine`.
    """

    kind = "pristine"

    def __init__(self, base: Tree, ledger: Ledger | None, get_object: Callable[[str], bytes],
                 only: Collection[str] | None = None):
        self.base = base
        self.ledger = ledger
        self.spec = base.spec
        self.root = None  # no directory holds these bytes as they read here
        self._get = get_object
        entries = ledger.files if ledger is not None else {}
        self._entries = {rel: e for rel, e in entries.items() if only is None or rel in only}

    def files(self) -> list[str]:
        return [rel for rel in self.base.files() if not (rel in self._entries and self._entries[rel].created)]

    def read_bytes(self, rel: str) -> bytes | None:
        entry = self._entries.get(rel)
        if entry is None:
            return self.base.read_bytes(rel)
        return None if entry.created else self._get(entry.pristine_sha256)

    def decode(self, data: bytes, rel: str) -> str:
        return self.base.decode(data, rel)

    def metadata(self) -> str | None:
        return self.base.metadata()

    @cached_property
    def version(self) -> str:
        return self.base.version
