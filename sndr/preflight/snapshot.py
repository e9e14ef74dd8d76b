"""Reading trees for the preflight: one pristine snapshot per tree, shared by the plan and the suggestions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import Problem, SndrError
from ..state import LEDGER, STATE_DIR
from .models import TreeInfo

if TYPE_CHECKING:
    from ..model import Ledger
    from ..treeview import Tree

# ============================================================================ reading trees


class Snapshot:
    """Pristine texts of one tree, read once and shared by the plan, suggestions and config drift.

    A memo over one view: the tree itself, or, when it carries an sndr ledger
    (an installed, patched vLLM), its :class:`sndr.treeview.PristineView`
    (:meth:`sndr.commit.TreeRoot.pristine`), so the preflight always compares
    upstream to upstream.
    """

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.spec = str(getattr(tree, "spec", "") or tree)
        self.kind = str(getattr(tree, "kind", "") or "")
        self.view: Tree = tree
        self._ledger: Ledger | None = None
        root = getattr(tree, "root", None)
        if root is not None and (Path(root) / STATE_DIR / LEDGER).is_file():
            from ..commit import TreeRoot

            troot = TreeRoot(root)
            self._ledger = troot.read_ledger()
            if self._ledger is not None:
                self.view = troot.pristine(self._ledger, base=tree)
        self._bytes: dict[str, bytes | None] = {}
        self._text: dict[str, str | None] = {}
        self._files: list[str] | None = None
        self._digest: str | None = None

    @property
    def has_ledger(self) -> bool:
        return self._ledger is not None

    @property
    def version(self) -> str:
        return self.tree.version

    def metadata(self) -> str | None:
        return self.tree.metadata()

    def files(self) -> list[str]:
        if self._files is None:
            self._files = self.view.files()  # a pristine view leaves out the files sndr created
        return list(self._files)

    def read_bytes(self, rel: str) -> bytes | None:
        if rel not in self._bytes:
            self._bytes[rel] = self.view.read_bytes(rel)
        return self._bytes[rel]

    def load_all(self) -> None:
        """Read every source file once (the read-and-hash floor; the digest and the suggestions need them all)."""
        if self.view is self.tree and hasattr(self.tree, "_iter_contents"):
            # The view's own bulk reader: for directories it opens the walked
            # absolute paths directly, several times faster than per-file lookups.
            wanted = set(self.files())
            for rel, data in self.tree._iter_contents():
                if rel in wanted:
                    self._bytes.setdefault(rel, data)
        for rel in self.files():
            self.read_bytes(rel)

    def read_text(self, rel: str) -> str | None:
        """Strict UTF-8, like every tree view: a patch engine never guesses an encoding."""
        if rel not in self._text:
            data = self.read_bytes(rel)
            self._text[rel] = None if data is None else self.view.decode(data, rel)
        return self._text[rel]

    def text_or_none(self, rel: str) -> str | None:
        try:
            return self.read_text(rel)
        except SndrError:
            return None

    @property
    def digest(self) -> str:
        if self._digest is None:
            from ..treeview import tree_digest

            self._digest = tree_digest((rel, self._bytes[rel]) for rel in self.files()
                                       if self.read_bytes(rel) is not None)
        return self._digest

    def info(self) -> TreeInfo:
        return TreeInfo(spec=self.spec, kind=self.kind, version=self.version, tree_digest=self.digest,
                        files=len(self.files()), ledger=self.has_ledger)


def changed_files(pin: Snapshot, cand: Snapshot) -> tuple[list[str], list[str]]:
    """(candidate files that are new or differ from the pin, pin files gone from the candidate)."""
    pin_files = set(pin.files())
    cand_files = cand.files()
    changed = [r for r in cand_files if r not in pin_files or pin.read_bytes(r) != cand.read_bytes(r)]
    gone = sorted(pin_files - set(cand_files))
    return changed, gone


def same_release(pin: Snapshot, cand: Snapshot) -> list[Problem]:
    """Pin and candidate that are one release: the same tree (``same_tree``, raised: exit 2) or the same version
    with other bytes (``same_version``, returned: the report's warnings, said on stderr).

    The same tree, compared with itself, finds every patch still applying: a green preflight that proves nothing
    about a bump (a CI job whose candidate fell back to the pin reads "Bump clear"), so it stops before planning.
    Two builds of one version are a real comparison, but not a bump: the patches' ``vllm`` ranges read alike on
    both, so no gate can change.
    """
    if not _same_version(pin.version, cand.version):
        return []
    both = f"the pin ({pin.spec}) and the candidate ({cand.spec}) are both vLLM {cand.version}"
    if pin.digest == cand.digest:
        raise SndrError(Problem(
            "same_tree", f"{both} with the same files (tree digest {cand.digest[:12]}, {len(cand.files())} files): "
            "a tree compared with itself finds every patch still applying, which says nothing about a bump",
            key="--candidate", hint="pass the vLLM you are moving to as --candidate; to check the patch set on this "
            f"one tree, run `python -m sndr apply --dry-run --tree {_dry_run_spec(pin)}`"))
    changed, gone = changed_files(pin, cand)
    on_pin = set(pin.files())
    parts = [f"{len(rels)} file{'s' if len(rels) != 1 else ''} {what} ({_names(rels)})" for what, rels in
             (("changed", [r for r in changed if r in on_pin]),
              ("only on the candidate", [r for r in changed if r not in on_pin]), ("only on the pin", gone)) if rels]
    return [Problem("same_version", f"{both}, with other files (tree digest {pin.digest[:12]} -> "
                    f"{cand.digest[:12]}; {', '.join(parts)}): this compares two builds of one release, not a bump, "
                    "and the patches' vllm ranges read alike on both", key="--candidate")]


def _same_version(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a.strip() == b.strip()


def _dry_run_spec(snap: Snapshot) -> str:
    """A --tree that ``apply --dry-run`` reads for this tree: its own spec, or (a wheel, a git revision) its release."""
    return f"vllm=={snap.version}" if snap.kind in ("wheel", "git") else snap.spec


def _names(rels: list[str], limit: int = 10) -> str:
    return ", ".join(rels[:limit]) + (f" and {len(rels) - limit} more" if len(rels) > limit else "")
