"""The one unified-diff parser of the upstream tools (``sync`` and ``vendor``).

It rests on ``unidiff`` (a declared dependency): file headers, git's extended
headers (rename, copy, mode, binary) and hunk bodies are its job. What it
leaves to us is kept here, once:

- a hunk is a list of ``(tag, text)`` pairs, ``tag`` one of ``' '``, ``'-'``,
  ``'+'`` and ``text`` the line with its newline; ``\\ No newline at end of
  file`` strips the newline of the line before it;
- a file's status is ``added``/``deleted`` only when ``/dev/null`` or git's mode
  lines say so (unidiff also guesses it from ``@@ -0,0`` hunks, which a
  ``diff -U0`` insertion at the top of a file has too), ``renamed`` only when
  git says ``rename from``/``copy from``;
- a bare hunk body (``@@ ...`` without file headers, as tests and tools pass)
  is read as one file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from ..errors import Problem, SndrError

__all__ = ["DiffFile", "Hunk", "parse_diff_files", "parse_hunks"]

Tag = Literal[" ", "-", "+"]
FileStatus = Literal["modified", "added", "deleted", "renamed", "binary"]


@dataclass
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list[tuple[str, str]] = field(default_factory=list)  # (' '|'-'|'+', text with its newline)

    def image(self, side: Literal["pre", "post"], context: int | None = None) -> str:
        """The hunk's text before (pre) or after (post), with at most ``context`` lines of context per end."""
        keep = (" ", "-") if side == "pre" else (" ", "+")
        lines = self.lines
        if context is not None:
            changed = [i for i, (t, _) in enumerate(lines) if t != " "]
            if changed:
                lo, hi = max(0, changed[0] - context), min(len(lines), changed[-1] + 1 + context)
                lines = lines[lo:hi]
        return "".join(text for tag, text in lines if tag in keep)

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_count} +{self.new_start},{self.new_count} @@"

    @property
    def pre_lines(self) -> list[str]:
        return [t for tag, t in self.lines if tag in (" ", "-")]

    @property
    def post_lines(self) -> list[str]:
        return [t for tag, t in self.lines if tag in (" ", "+")]

    @property
    def added_flags(self) -> list[bool]:
        """Per post-image line: whether it is a ``+`` line."""
        return [tag == "+" for tag, _ in self.lines if tag in (" ", "+")]

    @property
    def pure_addition(self) -> bool:
        tags = {tag for tag, _ in self.lines}
        return "+" in tags and "-" not in tags


H = TypeVar("H")


@dataclass
class DiffFile(Generic[H]):
    """One file of a diff; ``H`` is its hunk type (:class:`Hunk` here, vendoring's own hunk in ``vendor``)."""

    source: str
    target: str
    status: FileStatus
    hunks: list[H]

    @property
    def raw_path(self) -> str:
        return self.source if self.status == "deleted" else self.target


def _status(pf) -> FileStatus:
    info = list(pf.patch_info or [])
    if pf.is_binary_file or any(line.startswith("GIT binary patch") for line in info):
        return "binary"
    if pf.source_file == "/dev/null" or any(line.startswith("new file mode") for line in info):
        return "added"
    if pf.target_file == "/dev/null" or any(line.startswith("deleted file mode") for line in info):
        return "deleted"
    if any(line.startswith(("rename from ", "copy from ")) for line in info):
        return "renamed"
    return "modified"


def _hunk(h) -> Hunk:
    out = Hunk(h.source_start, h.source_length, h.target_start, h.target_length)
    for ln in h:
        t = ln.line_type
        if t == "\\":
            if out.lines:
                tag, text = out.lines[-1]
                out.lines[-1] = (tag, text[:-1] if text.endswith("\n") else text)
            continue
        if t in (" ", "-", "+"):
            out.lines.append((t, ln.value))
    return out


def parse_diff_files(text: str, *, what: str = "--diff") -> list[DiffFile[Hunk]]:
    """The files of a unified diff (git, ``diff -u`` or a bare hunk body)."""
    import unidiff

    if text and not text.endswith("\n"):
        text += "\n"
    if text.startswith("@@"):
        text = "--- a/-\n+++ b/-\n" + text
    try:
        patch_set = unidiff.PatchSet(text)
    except unidiff.UnidiffParseError as exc:
        raise SndrError(Problem("bad_diff", f"not a unified diff: {exc}", key=what)) from None
    return [DiffFile(pf.source_file, pf.target_file, _status(pf), [_hunk(h) for h in pf]) for pf in patch_set]


def parse_hunks(diff_text: str) -> tuple[list[Hunk], bool]:
    """Hunks of a one-file unified diff, and whether git called the file binary."""
    if "\n@@" not in diff_text and not diff_text.startswith("@@"):
        binary = "Binary files " in diff_text or "GIT binary patch" in diff_text
        return [], binary
    files = parse_diff_files(diff_text)
    hunks = [h for f in files for h in f.hunks]
    return hunks, any(f.status == "binary" for f in files)
