"""Git access for the sync queue: the few plumbing calls it needs, batched.

A range of thousands of commits must not cost thousands of processes per
question, so the per-commit questions are asked in batches:

- :meth:`Git.commits` lists ``FROM..TO`` (``git log`` semantics: reachable from
  TO and not from FROM, so release tags on release branches work);
- :meth:`Git.all_changes` gives every commit's file changes, renames detected,
  from one ``git diff-tree --stdin``;
- :meth:`Git.patch_ids` gives ``git patch-id --stable`` of many commits (or of
  their inverse diffs, to recognise a revert that does not say so) from one
  pipe;
- :meth:`Git.blob` reads blobs through one long-lived ``git cat-file --batch``.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import bad_input
from .diff import Hunk

__all__ = ["EMPTY_TREE", "ChangeKind", "CommitInfo", "GitFileChange", "Git"]

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_SHA40 = re.compile(r"^[0-9a-f]{40}$")
#: ``git diff-tree --name-status`` letters kept (added, modified, deleted, renamed, copied, type changed).
ChangeKind = Literal["A", "M", "D", "R", "C", "T"]


@dataclass
class GitFileChange:
    kind: ChangeKind
    path: str
    old_path: str | None = None
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths the change touches: its path, and a rename's or copy's old path."""
        return (self.path,) if not self.old_path else (self.path, self.old_path)

    def renamed_from(self) -> str:
        """A rename's or copy's old path (``git diff-tree`` always names it)."""
        if self.old_path is None:
            raise ValueError(f"{self.kind} {self.path}: the change names no old path")
        return self.old_path


@dataclass
class CommitInfo:
    sha: str
    parents: list[str]
    subject: str
    body: str = ""
    changes: list[GitFileChange] = field(default_factory=list)  # mirrored files only
    other_files: int = 0

    @property
    def short(self) -> str:
        return self.sha[:10]

    @property
    def parent(self) -> str:
        return self.parents[0] if self.parents else EMPTY_TREE


class Git:
    """Plumbing calls on one repository."""

    def __init__(self, repo: Path | str):
        self.repo = Path(repo)
        self._batch: subprocess.Popen[bytes] | None = None
        if not self.repo.is_dir():
            raise bad_input("repo_not_found", "repository does not exist", file=str(repo))
        if self.run("rev-parse", "--git-dir", check=False).returncode != 0:
            raise bad_input("not_a_repo", "not a git repository", file=str(repo),
                            hint="point --repo at a vLLM git checkout")

    # -- processes

    def _argv(self, *args: str) -> list[str]:
        return ["git", "-C", str(self.repo), "-c", "core.quotepath=off", *args]

    def run(self, *args: str, check: bool = True, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run(self._argv(*args), capture_output=True, input=stdin)
        except FileNotFoundError:
            raise bad_input("git_not_found", "git is not installed") from None
        if check and proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            raise bad_input("git_failed", f"git {' '.join(args[:3])} failed: {err[-1] if err else proc.returncode}",
                            file=str(self.repo))
        return proc

    def text(self, *args: str, stdin: bytes | None = None) -> str:
        return self.run(*args, stdin=stdin).stdout.decode("utf-8", errors="surrogateescape")

    def close(self) -> None:
        if self._batch is not None:
            try:
                if self._batch.stdin is not None:  # opened as a pipe in blob()
                    self._batch.stdin.close()
                self._batch.wait(timeout=5)
            except Exception:  # noqa: BLE001 - best effort on the way out
                self._batch.kill()
            self._batch = None

    def __del__(self):  # pragma: no cover - the planner closes it explicitly
        self.close()

    # -- revisions

    def resolve(self, ref: str, what: str) -> str:
        proc = self.run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        if proc.returncode != 0:
            raise bad_input("unknown_rev", f"{what} {ref!r} is not a commit in {self.repo}", key=what)
        return proc.stdout.decode().strip()

    def is_ancestor(self, a: str, b: str) -> bool:
        return self.run("merge-base", "--is-ancestor", a, b, check=False).returncode == 0

    def merge_base(self, a: str, b: str) -> str | None:
        proc = self.run("merge-base", a, b, check=False)
        out = proc.stdout.decode().strip()
        return out or None

    def commits(self, base: str, tip: str) -> list[CommitInfo]:
        """``git log --reverse --topo-order base..tip``: reachable from tip and not from base."""
        return self._log(f"{base}..{tip}")

    def _log(self, *revs: str) -> list[CommitInfo]:
        out = self.text("log", "--reverse", "--topo-order", "--format=%H%x1f%P%x1f%s%x1f%b%x1e", *revs)
        commits = []
        for rec in out.split("\x1e"):
            rec = rec.lstrip("\n")
            if not rec:
                continue
            sha, parents, subject, body = (rec.split("\x1f") + ["", "", ""])[:4]
            commits.append(CommitInfo(sha=sha, parents=parents.split(), subject=subject, body=body))
        return commits

    def find_subject(self, rev: str, subject: str, limit: int = 50) -> str | None:
        """The newest commit reachable from ``rev`` that ``subject`` names: PR suffixes stripped on both sides
        (a squash commit and its cherry-pick carry different ones), a truncated title by its kept start; the
        one with the same PR number first."""
        from .reverts import pr_numbers, strip_pr, subject_matches, truncated_prefix

        needle = truncated_prefix(subject) or strip_pr(subject)
        out = self.text("log", f"-n{limit}", "-F", f"--grep={needle}", "--format=%H%x1f%s", rev)
        hits = []
        for line in out.splitlines():
            sha, _, subj = line.partition("\x1f")
            if subject_matches(subject, subj):
                hits.append((sha, subj))
        nums = pr_numbers(subject)[-1:]
        exact = [sha for sha, subj in hits if nums and nums[0] in pr_numbers(subj)]
        ranked = exact or [sha for sha, _ in hits]
        return ranked[0] if ranked else None

    # -- changes

    def all_changes(self, shas: list[str]) -> dict[str, list[GitFileChange]]:
        """Every commit's file changes against its first parent (renames detected), in one call."""
        if not shas:
            return {}
        raw = self.run("diff-tree", "--stdin", "--root", "-r", "-M", "--name-status", "-z",
                       stdin=("\n".join(shas) + "\n").encode()).stdout
        parts = raw.decode("utf-8", errors="surrogateescape").split("\0")
        out: dict[str, list[GitFileChange]] = {s: [] for s in shas}
        cur: list[GitFileChange] | None = None
        i = 0
        while i < len(parts):
            tok = parts[i].strip("\n")
            if not tok:
                i += 1
                continue
            if _SHA40.match(tok):
                cur = out.setdefault(tok, [])
                i += 1
                continue
            kind = tok[0]
            if cur is None:  # pragma: no cover - diff-tree always names the commit first
                i += 1
                continue
            if kind in ("R", "C"):
                cur.append(GitFileChange(kind=kind, path=parts[i + 2], old_path=parts[i + 1]))
                i += 3
            else:
                cur.append(GitFileChange(kind=kind if kind in ("A", "M", "D", "T") else "M", path=parts[i + 1]))
                i += 2
        return out

    def diff(self, parent: str, sha: str, paths: list[str]) -> str:
        return self.text("diff", "-M", "-U3", "--no-color", "--no-ext-diff", "--no-textconv", parent, sha, "--", *paths)

    def patch_ids(self, shas: list[str], *, inverse: bool = False) -> dict[str, str]:
        """``git patch-id --stable`` of each commit's diff (``inverse``: of the diff that undoes it)."""
        if not shas:
            return {}
        # --no-prefix: -R swaps the a/ b/ prefixes, and patch-id hashes the file header lines
        args = ["diff-tree", "--stdin", "--root", "-r", "-p", "--no-prefix", "--no-color", "--no-ext-diff",
                "--no-textconv"]
        if inverse:
            args.append("-R")
        diffs = self.run(*args, stdin=("\n".join(shas) + "\n").encode()).stdout
        ids = self.run("patch-id", "--stable", stdin=diffs).stdout.decode().split("\n")
        out: dict[str, str] = {}
        for line in ids:
            pid, _, sha = line.partition(" ")
            if sha:
                out[sha.strip()] = pid
        return out

    # -- blobs

    def blob(self, rev: str, path: str) -> bytes | None:
        if self._batch is None:
            self._batch = subprocess.Popen(self._argv("cat-file", "--batch"), stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        b = self._batch
        assert b.stdin is not None and b.stdout is not None  # both opened as pipes
        b.stdin.write(f"{rev}:{path}\n".encode("utf-8", errors="surrogateescape"))
        b.stdin.flush()
        header = b.stdout.readline().decode("utf-8", errors="surrogateescape").rstrip("\n")
        if header.endswith(" missing") or header.endswith(" ambiguous") or not header:
            return None
        _oid, kind, size = header.rsplit(" ", 2)
        data = b.stdout.read(int(size))
        b.stdout.read(1)  # the newline after the contents
        return data if kind == "blob" else None
