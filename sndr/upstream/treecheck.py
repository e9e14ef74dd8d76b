"""Is the tree ``sync plan`` judges on the pin? (issue 30: a bare clone, or the target's tree, gave a
silently wrong queue.)

The queue judges every upstream commit against the pin's tree plus the local
patches. :func:`check_tree` refuses a tree that is evidently something else
and warns where it cannot be told for sure; the version of the pin comes from
``--from`` (``v0.32.0``, or a release tag on that commit), else from the pin
record (``_pin.toml``).
"""

from __future__ import annotations

from ..errors import SndrError, bad_input
from .gitio import Git
from .judge import tree_reader

__all__ = ["check_tree"]


def _upstream_reader(tree):
    """A path -> text reader of what upstream shipped in ``tree``: a tree sndr patched (the pin plus the
    local patches, as the queue wants it) is read through its ledger's pristine copies
    (:meth:`sndr.commit.TreeRoot.pristine`), so that local backports of range commits, whose patched
    bytes equal ``--to``'s, do not make the pin look like the target. A ledger that cannot be read
    leaves the tree read as it is (the comparison only warns)."""
    import os

    from ..state import LEDGER, state_path

    root = getattr(tree, "root", None)
    if root is not None and os.path.isfile(state_path(root, LEDGER)):
        from ..commit import TreeRoot

        troot = TreeRoot(root)
        try:
            ledger = troot.read_ledger()
        except SndrError:
            ledger = None
        if ledger is not None:
            return tree_reader(troot.pristine(ledger, base=tree))
    return tree_reader(tree)


def _version_of_ref(git: Git, ref: str, sha: str) -> str | None:
    """The vLLM version a ref names: ``v0.32.0`` itself, else a release tag on that exact commit."""
    import re

    from packaging.version import InvalidVersion, Version

    names = [ref]
    proc = git.run("tag", "--points-at", sha, "--list", "v[0-9]*", check=False)
    names += proc.stdout.decode().split() if proc.returncode == 0 else []
    for name in names:
        m = re.fullmatch(r"(?:vllm==|v)?(\d+\.\d+(?:\.\d+)*(?:(?:rc|a|b|\.post|\.dev)\d+)?)", name.strip())
        if m:
            try:
                return str(Version(m.group(1)))
            except InvalidVersion:
                continue
    return None


def _same_version(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a).public == Version(b).public
    except InvalidVersion:
        return a.strip() == b.strip()


def check_tree(git: Git, base: str, tip: str, from_ref: str, to_ref: str, tree, files: list[str],
               pin_version: str | None = None, pin_digest: str | None = None, work_tree: bool = False) -> list[str]:
    """Refuse a tree that is not the pin; return warnings where it cannot be told for sure.

    - its vLLM version against the pin's (``--from``'s version or release tag,
      else the pin record's): another version is refused (``tree_not_pin``);
    - none of the mirrored files ``--from`` has is in the tree: refused
      (``tree_empty``; a bare clone's or a wrong directory's symptom);
    - its version unknown: its digest against the pin record's gives a warning;
    - its mirrored files, as upstream shipped them (a tree sndr patched is read
      through its ledger's pristine copies), against both ends of the range: a
      tree that holds ``--to``'s content is the target's, a warning;
    - ``work_tree`` (the repository's own checkout): its HEAD instead of its
      version (local patches may be committed on top of the pin): a HEAD that
      contains ``--to`` is refused, one that does not contain ``--from`` warned about.
    """
    spec = getattr(tree, "spec", None) or str(tree)
    out: list[str] = []
    if work_tree:
        head = git.resolve("HEAD", "HEAD")
        if tip != base and git.is_ancestor(tip, head):
            raise bad_input("tree_not_pin", f"the work tree of {git.repo} is checked out at {head[:10]}, which "
                            f"contains --to {to_ref}: it is the target, not the pin", key="tree",
                            hint=f"check out the pin ({from_ref}) with the local patches, or pass --tree")
        if not git.is_ancestor(base, head):
            out.append(f"the work tree of {git.repo} is checked out at {head[:10]}, which does not contain --from "
                       f"{from_ref}: check that it is the pin (or pass --tree)")
    want = _version_of_ref(git, from_ref, base) or pin_version
    src = f"--from {from_ref}" if _version_of_ref(git, from_ref, base) else "the pin record"
    try:
        have: str | None = None if work_tree else tree.version
    except (SndrError, AttributeError, OSError):
        have = None
    if want and have and not _same_version(want, have):
        raise bad_input("tree_not_pin", f"the tree {spec} is vLLM {have}, but the pin ({src}) is {want}: every "
                        "commit is judged against the pin's tree plus the local patches", key="tree",
                        hint=f"pass the pin's tree: --tree vllm=={want} (or the installed, patched pin)")
    read = tree_reader(tree)
    at_pin = set(git.text("ls-tree", "-r", "--name-only", base).splitlines())
    present = [f for f in files if f in at_pin]
    if present and all(read(f) is None for f in present):
        raise bad_input("tree_empty", f"none of the {len(present)} mirrored file(s) that --from {from_ref} has is "
                        f"in the tree {spec} (e.g. {present[0]}): every commit would read as a conflict",
                        key="tree", hint="pass --tree with the pin's tree (a directory holding vllm/, vllm==X, a "
                        "wheel or the installed tree)")
    if have is None and pin_digest and not work_tree:
        try:
            digest = tree.digest
        except (SndrError, AttributeError, OSError):
            digest = None
        if digest and digest != pin_digest:
            out.append(f"cannot tell the vLLM version of the tree {spec}, and its digest {digest[:12]} is not the "
                       f"pin record's {pin_digest[:12]}: check that --tree is the pin (a patched tree differs too)")
    like_to = like_from = 0
    changed = set(git.text("diff", "--name-only", "--no-renames", base, tip).splitlines())
    upstream = _upstream_reader(tree)
    for f in present:
        if f not in changed or (text := upstream(f)) is None:
            continue
        pre, post = git.blob(base, f), git.blob(tip, f)
        data = text.encode("utf-8", errors="surrogateescape")
        like_to += data == post
        like_from += data == pre
    if like_to and like_to >= like_from:
        out.append(f"the tree {spec} looks like --to {to_ref}, not the pin: {like_to} mirrored file(s) hold "
                   f"--to's content and {like_from} --from's" + (f" (vLLM {have})" if have else "")
                   + "; pass the pin's tree with --tree")
    return out
