"""A revision of a local git checkout as a :class:`sndr.treeview.Tree` (``--tree git:REPO@REV``)."""

from __future__ import annotations

import os
import subprocess
import threading
import weakref
from pathlib import Path

from .errors import bad_input
from .fsio import not_a_dir
from .treespec import PKG as _PKG
from .treespec import Spec
from .treeview import Tree, check_rel, describe_version, is_source, run_git

__all__ = ["GitTree", "open_checkout_rev", "open_git", "split_git"]


class GitTree(Tree):
    """A revision of a local git checkout, read from the object store.

    The file list comes from one ``git ls-tree -r``; contents come from one
    long-lived ``git cat-file --batch`` (and one buffered batch for the whole
    digest), never one ``git show`` process per file.
    """

    kind = "git"

    def __init__(self, repo: Path, rev: str = "HEAD", spec: str | None = None):
        self.repo = Path(repo).resolve()
        self.rev = rev
        self.spec = spec if spec is not None else f"git:{repo}@{rev}"
        self.root = None
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        top = run_git(self.repo, "rev-parse", "--show-toplevel", check=False)
        if top.returncode != 0:
            raise bad_input("not_git", f"{self.repo} is not a git checkout", file=str(self.repo))
        self._toplevel = Path(top.stdout.decode().strip())
        self._prefix = run_git(self.repo, "rev-parse", "--show-prefix").stdout.decode().strip()
        commit = run_git(self.repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
        if commit.returncode != 0:
            raise bad_input("git_rev_not_found", f"revision {rev!r} does not exist in {self.repo}", file=str(self.repo))
        self.commit = commit.stdout.decode().strip()
        self._blobs = self._list_blobs()
        self._files = sorted(r for r in self._blobs if is_source(r))
        if not self._files:
            raise bad_input("no_vllm", f"{self.repo} at {rev} has no vllm/*.py files", file=str(self.repo))

    def _list_blobs(self) -> dict[str, str]:
        """relpath -> blob sha of regular files under vllm/ (symlinks and submodules skipped)."""
        out = run_git(self._toplevel, "ls-tree", "-r", "-z", "--full-tree", self.commit, "--", f"{self._prefix}{_PKG}").stdout
        blobs: dict[str, str] = {}
        for record in out.split(b"\0"):
            if not record:
                continue
            head, _, path = record.partition(b"\t")
            mode, otype, sha = head.decode().split()
            if otype == "blob" and mode in ("100644", "100755"):
                rel = path.decode("utf-8", "surrogateescape")[len(self._prefix):]
                blobs[rel] = sha
        return blobs

    def files(self) -> list[str]:
        return list(self._files)

    def _object_name(self, rel: str) -> str:
        return self._blobs.get(rel) or f"{self.commit}:{self._prefix}{rel}"

    def _batch(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                ["git", "-C", str(self._toplevel), "cat-file", "--batch"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
            weakref.finalize(self, _close_proc, self._proc)
        return self._proc

    def read_bytes(self, rel: str) -> bytes | None:
        name = self._object_name(check_rel(rel))
        with self._lock:
            proc = self._batch()
            assert proc.stdin is not None and proc.stdout is not None  # opened with PIPE
            proc.stdin.write(name.encode("utf-8", "surrogateescape") + b"\n")
            proc.stdin.flush()
            return _read_batch_entry(proc.stdout)

    def exists(self, rel: str) -> bool:
        if check_rel(rel) in self._blobs:
            return True
        return self.read_bytes(rel) is not None

    def _iter_contents(self):
        # One buffered batch for all files: ~3,000 round trips through a pipe
        # would cost more than the hashing itself.
        request = "".join(f"{self._blobs[r]}\n" for r in self._files).encode()
        proc = subprocess.run(["git", "-C", str(self._toplevel), "cat-file", "--batch", "--buffer"],
                              input=request, capture_output=True, check=True)
        view, pos = memoryview(proc.stdout), 0
        for rel in self._files:
            nl = proc.stdout.index(b"\n", pos)
            size = int(proc.stdout[pos:nl].split()[2])
            yield rel, bytes(view[nl + 1: nl + 1 + size])
            pos = nl + 1 + size + 1

    def _fallback_version(self) -> str | None:
        proc = run_git(self._toplevel, "describe", "--tags", "--long", "--match", "v[0-9]*", self.commit, check=False)
        return describe_version(proc.stdout.decode()) if proc.returncode == 0 else None

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                _close_proc(self._proc)
                self._proc = None


def _read_batch_entry(stream) -> bytes | None:
    """One ``cat-file --batch`` answer: ``<sha> <type> <size>\\n<data>\\n`` or ``<name> missing\\n``."""
    header = stream.readline().split()
    if len(header) != 3:
        return None
    size = int(header[2])
    data = stream.read(size)
    stream.read(1)
    return data if header[1] == b"blob" else None


def _close_proc(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


def split_git(spec: str) -> tuple[Path, str] | None:
    """``REPO@REV`` -> (REPO, REV) for the leftmost ``@`` whose left side is a directory.

    Leftmost-first keeps reflog revisions such as ``HEAD@{1}`` intact.
    """
    for i, ch in enumerate(spec):
        if ch == "@" and i > 0:
            left = Path(spec[:i]).expanduser()
            if left.is_dir():
                return left, spec[i + 1:] or "HEAD"
    return None


def open_git(spec: Spec) -> GitTree:
    """``git:REPO@REV``, or ``git:REPO`` for its HEAD."""
    rest = spec.arg
    split = split_git(rest)
    if split is None and Path(rest).expanduser().is_dir():
        split = (Path(rest).expanduser(), "HEAD")
    if split is None:
        code, why = _no_checkout(rest)
        raise bad_input(code, f"{spec.text!r}: {why}", file=rest, hint="git:/path/to/vllm@REV")
    return GitTree(split[0], split[1], spec=spec.text)


def _no_checkout(rest: str) -> tuple[str, str]:
    """Why ``REPO[@REV]`` names no directory, with its code: what its longest existing REPO is (a FIFO, a regular
    file, ...: :func:`sndr.fsio.not_a_dir` names it; bad_tree_spec, as ``--tree`` of such a path), or that none of
    its readings exists (tree_not_found)."""
    readings = [rest] + [rest[:i] for i in range(len(rest) - 1, 0, -1) if rest[i] == "@"]
    for r in readings:
        p = Path(r).expanduser()
        kind = not_a_dir(p)
        if kind is not None:
            return "bad_tree_spec", f"{p} is {kind}, not a directory"
        if p.is_symlink() and not p.exists():
            return "tree_not_found", f"{p} is a symlink to {os.readlink(p)}, which does not exist"
    return "tree_not_found", f"no directory before '@' ({Path(readings[-1]).expanduser()} does not exist)"


def open_checkout_rev(text: str) -> GitTree | None:
    """``REPO@REV`` without ``git:`` (a path that does not exist): the revision, when REPO is a checkout."""
    split = split_git(text)
    if split is not None and run_git(split[0], "rev-parse", "--git-dir", check=False).returncode == 0:
        return GitTree(split[0], split[1], spec=text)
    return None
