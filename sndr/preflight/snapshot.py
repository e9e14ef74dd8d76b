"""Reading trees for the preflight: one pristine snapshot per tree, shared by the plan and the suggestions."""

from __future__ import annotations

from pathlib import Path

from ..errors import SndrError, bad_input
from ..fsio import FileProblem, decode_strict
from ..state import LEDGER, STATE_DIR
from .models import TreeInfo

# ============================================================================ reading trees


class Snapshot:
    """Pristine texts of one tree, read once and shared by the plan, suggestions and config drift.

    A tree that carries an sndr ledger (an installed, patched vLLM) is read
    through the ledger, so the preflight always compares upstream to upstream.
    """

    def __init__(self, tree):
        self.tree = tree
        self.spec = str(getattr(tree, "spec", "") or tree)
        self.kind = str(getattr(tree, "kind", "") or "")
        self._ledger = None
        self._root = None
        root = getattr(tree, "root", None)
        if root is not None and (Path(root) / STATE_DIR / LEDGER).is_file():
            from ..commit import TreeRoot

            self._root = TreeRoot(root)
            self._ledger = self._root.read_ledger()
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
            files = self.tree.files()
            if self._ledger is not None:  # files sndr created are not upstream's
                files = [f for f in files if not (f in self._ledger.files and self._ledger.files[f].created)]
            self._files = files
        return list(self._files)

    def read_bytes(self, rel: str) -> bytes | None:
        if rel not in self._bytes:
            if self._ledger is not None:
                self._bytes[rel] = self._root.pristine_bytes(rel, self._ledger)
            else:
                self._bytes[rel] = self.tree.read_bytes(rel)
        return self._bytes[rel]

    def load_all(self) -> None:
        """Read every source file once (the read-and-hash floor; the digest and the suggestions need them all)."""
        if self._ledger is None and hasattr(self.tree, "_iter_contents"):
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
            if data is None:
                self._text[rel] = None
            else:
                try:
                    self._text[rel] = decode_strict(data, rel, "file")  # the strict-decode rule's one home
                except FileProblem as exc:
                    raise bad_input(exc.code, f"not valid UTF-8: {exc.message}", file=rel, line=exc.line) from None
        return self._text[rel]

    def text_or_none(self, rel: str) -> str | None:
        try:
            return self.read_text(rel)
        except SndrError:
            return None

    @property
    def digest(self) -> str:
        if self._digest is None:
            from ..tree import tree_digest

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


