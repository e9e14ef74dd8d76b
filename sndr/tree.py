"""Trees: what ``--tree`` names, opened as a read-only view, or as the directory a writing command uses.

Users point sndr at the installed vLLM of a container, a checkout, a wheel, a
git revision, or just a version they have not installed (``vllm==0.33.0``).
A spec is parsed once, by :func:`sndr.treespec.parse`; this module turns it
into one of the types below.

**The tree types, and why each remains:**

* :class:`~sndr.treeview.Tree`: the read-only interface everything downstream
  (classify, plan, preflight, manifest) codes against, so the kind of source never
  leaks past here. Its sources, one module each:

  - :class:`~sndr.treeview.DirTree`: a directory holding ``vllm/`` (a checkout,
    site-packages; ``installed[:PYTHON]`` and ``vllm==X`` also open as one,
    located by :mod:`sndr.tree_installed` and :mod:`sndr.tree_release`);
  - :class:`~sndr.tree_wheel.WheelTree`: a wheel, read in place;
  - :class:`~sndr.tree_git.GitTree`: a revision of a checkout, read from the object store.

* :class:`~sndr.treeview.PristineView`: a patched tree read as upstream shipped
  it (through the ledger's pristine copies); the one such reader, for apply's dry
  run, ``sndr list`` and the preflight.
* :class:`sndr.commit.TreeRoot`: the one *writable* tree, a directory plus its
  ``.sndr/`` state. It is a :class:`~sndr.treeview.Tree` too, but its reads are
  the writer's (no symlink followed, every first read recorded for the commit's
  before-check); its vLLM version is read through a plain
  :class:`~sndr.treeview.DirTree` of the same directory (``TreeRoot.view``).

A writing command (apply, verify, revert) goes spec -> :func:`directory` (a
path, or the reason it cannot write there) -> ``TreeRoot``; a reading command
goes spec -> :func:`open_tree` -> a view. The preflight's ``Snapshot`` is a memo
over a view, and its ``TreeInfo`` a report record, not tree types.

**Adding a tree source** is one module ``sndr/tree_<name>.py`` with its
:class:`~sndr.treeview.Tree` subclass (or a locator that returns a ``DirTree``)
and an ``open_<name>(spec)``; its spec form goes in :func:`sndr.treespec.parse`
and its opener in :func:`open_tree` (CONTRIBUTING.md, "Adding a tree source").
"""

from __future__ import annotations

from pathlib import Path

from packaging.version import InvalidVersion, Version

from .errors import Problem, SndrError, bad_input
from .fsio import not_a_dir
from .tree_git import GitTree, open_checkout_rev, open_git
from .tree_installed import find_installed_root, open_installed
from .tree_release import fetch_version, open_release
from .tree_wheel import WheelTree
from .treespec import PKG, SPEC_FORMS, parse, vllm_root
from .treeview import DirTree, PristineView, Tree, tree_digest

__all__ = [
    "Tree",
    "DirTree",
    "WheelTree",
    "GitTree",
    "PristineView",
    "default_root",
    "directory",
    "open_tree",
    "find_installed_root",
    "fetch_version",
    "tree_digest",
]


# ----------------------------------------------------------------------------- reading: any form


def _open_path(spec: str, path: Path) -> Tree:
    kind = not_a_dir(path)
    if kind is not None:
        if path.suffix == ".whl" and path.is_file():
            return WheelTree(path, spec=spec)
        raise bad_input("bad_tree_spec", f"{path} is {kind}, not a directory that contains {PKG}/ or a .whl file",
                        file=str(path), hint=f"a tree is {SPEC_FORMS}")
    root = vllm_root(path)
    if root is None:
        raise bad_input("no_vllm", f"{path} does not contain a {PKG}/ package", file=str(path),
                        hint="point at the directory that contains vllm/ (site-packages or a checkout)")
    return DirTree(path.resolve() if root == path else path.resolve().parent, spec=spec)


def open_tree(spec: str | Path | Tree) -> Tree:
    """Open a tree from what a user typed; every bad spec is a SndrError with exit code 2."""
    if isinstance(spec, Tree):
        return spec
    if isinstance(spec, Path):
        if not spec.exists():
            raise bad_input("tree_not_found", f"{spec} does not exist", file=str(spec), hint=f"a tree is {SPEC_FORMS}")
        return _open_path(str(spec), spec)
    parsed = parse(str(spec))
    text = parsed.text
    if not text:
        raise bad_input("bad_tree_spec", "empty tree spec", hint=f"a tree is {SPEC_FORMS}")
    if parsed.kind == "installed":
        return open_installed(parsed)
    if parsed.kind == "version":
        return open_release(parsed)
    if parsed.kind == "git":
        return open_git(parsed)
    path = Path(text).expanduser()
    if path.exists():
        return _open_path(text, path)
    rev = open_checkout_rev(text)
    if rev is not None:
        return rev
    hint = f"a tree is {SPEC_FORMS}"
    try:
        Version(text)
        hint = f"did you mean vllm=={text}?"
    except InvalidVersion:
        pass
    raise bad_input("tree_not_found", f"{text} does not exist", file=text, hint=hint)


# ----------------------------------------------------------------------------- writing: a directory, or why not


_NEEDS_DIR = ("apply writes into the tree, so --tree needs the directory that contains vllm/ (or installed[:PYTHON]); "
              "wheels and git: trees are read-only views: classify them with `python -m sndr list --tree T` or "
              "`python -m sndr preflight`")


def directory(spec: str, *, dry_run: bool) -> Path:
    """``--tree`` of apply, verify or revert -> the directory that contains ``vllm/``, or the reason it is not one.

    Takes a directory (``vllm/`` itself means its parent), ``installed[:PYTHON]`` and, for a dry-run,
    ``vllm==X`` (sndr's read-only cached copy); a wheel or a ``git:`` tree is refused with words saying
    why, and a missing path says it does not exist. The ``--verify`` fast path takes the plain-directory
    case only (:func:`sndr.treespec.plain_dir`, the same rule).
    """
    parsed = parse(spec)
    text = parsed.text
    if parsed.kind == "installed":
        return find_installed_root(parsed.arg or None)  # the directory holding vllm/
    if parsed.kind == "version":
        if not dry_run:
            raise SndrError(Problem("bad_tree_spec", f"{text!r} names sndr's read-only cached copy of a release; "
                                    "apply, verify and revert write to or check an installed tree", key="--tree",
                                    hint=f"simulate on it with --dry-run --tree {text}, or pass the directory "
                                         "that contains vllm/"))
        root = open_release(parsed).root
        assert root is not None, "a cached release is a directory"
        return root
    path = Path(text).expanduser()
    kind = not_a_dir(path) if parsed.kind == "path" else None
    if parsed.kind == "git" or (path.suffix == ".whl" and (kind is None or path.is_file())):
        raise SndrError(Problem("bad_tree_spec", f"{text!r} is not a directory", key="--tree", hint=_NEEDS_DIR))
    if not path.exists():
        raise SndrError(Problem("tree_not_found", f"{text} does not exist", file=text, key="--tree",
                                hint="pass the directory that contains vllm/ (site-packages or a checkout)"))
    if kind is not None:  # a regular file, a FIFO, a device, a socket: said as what it is
        raise SndrError(Problem("bad_tree_spec", f"{text} is {kind}, not a directory", file=text, key="--tree",
                                hint=_NEEDS_DIR if path.is_file() else
                                "pass the directory that contains vllm/ (site-packages or a checkout)"))
    return vllm_root(path) or path  # without vllm/, TreeRoot names it (not_a_tree)


def default_root(pin_version: str) -> tuple[Path, bool]:
    """No ``--tree``: where ``import vllm`` would find vLLM (without importing it); else the cached tree of
    ``pin_version``. Returns (root, is_fallback); the fallback is only ever used for a dry-run."""
    try:
        return find_installed_root(), False
    except SndrError as exc:
        if not any(p.code == "vllm_not_found" for p in exc.problems):
            raise
    return fetch_version(pin_version), True
