"""Read-only views of a vLLM source tree, whatever form it comes in.

Users point sndr at the installed vLLM of a container, a checkout, a wheel, a
git revision, or just a version they have not installed (``vllm==0.33.0``).
Everything downstream (classify, plan, preflight, manifest) codes against one
small interface, :class:`Tree`, so the kind of source never leaks past here.

Two properties hold for every kind:

* ``files()`` lists the ``.py`` files under ``vllm/`` as sorted posix paths;
* ``digest`` hashes exactly those paths and contents, so the same source gives
  the same digest whether it is read from a directory, a zip or a git object
  store. That is what lets a pin be named by content.

Nothing here imports vLLM: versions are read from metadata or parsed
statically, and the installed tree is located with ``find_spec`` in a child
interpreter.
"""

from __future__ import annotations

import abc
import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
import zipfile
from functools import cached_property
from pathlib import Path
from typing import Self

from packaging.version import InvalidVersion, Version

from . import env
from .errors import EXIT_BAD_INPUT, Problem, SndrError, bad_input

__all__ = [
    "Tree",
    "DirTree",
    "WheelTree",
    "GitTree",
    "open_tree",
    "find_installed_root",
    "fetch_version",
    "tree_digest",
]

_PKG = "vllm"
_SPEC_FORMS = (
    "a directory that contains vllm/, a .whl file, 'vllm==X.Y.Z', "
    "'git:REPO@REV', or 'installed[:/path/to/python]'"
)


# ----------------------------------------------------------------------------- helpers


def _check_rel(rel: str) -> str:
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


def _is_source(rel: str) -> bool:
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


def _metadata_version(text: str | None) -> str | None:
    """The ``Version:`` header of a METADATA/PKG-INFO text (headers end at the first blank line)."""
    if not text:
        return None
    for line in text.splitlines():
        if not line.strip():
            break
        if line.lower().startswith("version:"):
            return line.split(":", 1)[1].strip() or None
    return None


def _static_version(source: str | None) -> str | None:
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


def _describe_version(describe: str) -> str | None:
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


def _run_git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
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
        if data is None:
            return None
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
        found = _metadata_version(self.metadata())
        for rel in (f"{_PKG}/version.py", f"{_PKG}/_version.py"):
            if found:
                break
            try:
                found = _static_version(self.read_text(rel))
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
        return self.root / _check_rel(rel)

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
            static = static or _static_version(data.decode("utf-8", "replace") if data else None)
        for text in texts:
            if static and _metadata_version(text) == static:
                return text

        def key(text: str):
            try:
                return Version(_metadata_version(text) or "0")
            except InvalidVersion:
                return Version("0")

        return max(texts, key=key)

    def _fallback_version(self) -> str | None:
        if not (self.root / ".git").exists():
            return None
        proc = _run_git(self.root, "describe", "--tags", "--long", "--match", "v[0-9]*", "HEAD", check=False)
        return _describe_version(proc.stdout.decode()) if proc.returncode == 0 else None


# ----------------------------------------------------------------------------- wheel


class WheelTree(Tree):
    """A wheel read in place: members are decompressed on demand, never extracted."""

    kind = "wheel"

    def __init__(self, path: Path, spec: str | None = None):
        self.path = Path(path)
        self.spec = str(spec if spec is not None else path)
        self.root = None
        try:
            self._zip = zipfile.ZipFile(self.path)
        except FileNotFoundError:
            raise bad_input("tree_not_found", f"wheel {self.path} does not exist", file=str(self.path)) from None
        except (zipfile.BadZipFile, OSError) as exc:
            raise bad_input("bad_wheel", f"{self.path} is not a readable wheel: {exc}", file=str(self.path)) from None
        self._members = {i.filename: i for i in self._zip.infolist() if not i.is_dir()}
        self._files = sorted(n for n in self._members if _is_source(n))
        self._lock = threading.Lock()
        if not self._files:
            self._zip.close()
            raise bad_input("no_vllm", f"wheel {self.path} contains no vllm/*.py files", file=str(self.path))

    def files(self) -> list[str]:
        return list(self._files)

    def read_bytes(self, rel: str) -> bytes | None:
        info = self._members.get(_check_rel(rel))
        if info is None:
            return None
        with self._lock:
            return self._zip.read(info)

    def exists(self, rel: str) -> bool:
        return _check_rel(rel) in self._members

    def metadata(self) -> str | None:
        names = sorted(n for n in self._members if re.fullmatch(rf"{_PKG}-[^/]+\.dist-info/METADATA", n))
        if not names:
            return None
        return (self.read_bytes(names[0]) or b"").decode("utf-8", "replace")

    def _fallback_version(self) -> str | None:
        parts = self.path.name.split("-")
        return parts[1] if len(parts) >= 5 else None

    def close(self) -> None:
        self._zip.close()


# ----------------------------------------------------------------------------- git


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
        top = _run_git(self.repo, "rev-parse", "--show-toplevel", check=False)
        if top.returncode != 0:
            raise bad_input("not_git", f"{self.repo} is not a git checkout", file=str(self.repo))
        self._toplevel = Path(top.stdout.decode().strip())
        self._prefix = _run_git(self.repo, "rev-parse", "--show-prefix").stdout.decode().strip()
        commit = _run_git(self.repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
        if commit.returncode != 0:
            raise bad_input("git_rev_not_found", f"revision {rev!r} does not exist in {self.repo}", file=str(self.repo))
        self.commit = commit.stdout.decode().strip()
        self._blobs = self._list_blobs()
        self._files = sorted(r for r in self._blobs if _is_source(r))
        if not self._files:
            raise bad_input("no_vllm", f"{self.repo} at {rev} has no vllm/*.py files", file=str(self.repo))

    def _list_blobs(self) -> dict[str, str]:
        """relpath -> blob sha of regular files under vllm/ (symlinks and submodules skipped)."""
        out = _run_git(self._toplevel, "ls-tree", "-r", "-z", "--full-tree", self.commit, "--", f"{self._prefix}{_PKG}").stdout
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
        name = self._object_name(_check_rel(rel))
        with self._lock:
            proc = self._batch()
            assert proc.stdin is not None and proc.stdout is not None  # opened with PIPE
            proc.stdin.write(name.encode("utf-8", "surrogateescape") + b"\n")
            proc.stdin.flush()
            return _read_batch_entry(proc.stdout)

    def exists(self, rel: str) -> bool:
        if _check_rel(rel) in self._blobs:
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
        proc = _run_git(self._toplevel, "describe", "--tags", "--long", "--match", "v[0-9]*", self.commit, check=False)
        return _describe_version(proc.stdout.decode()) if proc.returncode == 0 else None

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


# ----------------------------------------------------------------------------- installed


_PROBE = r"""
import importlib.util, json
out = {}
spec = importlib.util.find_spec("vllm")
if spec is not None and spec.submodule_search_locations:
    out["package"] = list(spec.submodule_search_locations)[0]
try:
    import importlib.metadata as md
    dist = md.distribution("vllm")
    out["metadata"] = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
except Exception:
    pass
print(json.dumps(out))
"""


def _resolve_python(python: str | None) -> str:
    if python is None:
        return sys.executable
    p = Path(python).expanduser()
    if p.is_dir():  # a venv or prefix: take its interpreter
        for cand in (p / "bin" / "python", p / "bin" / "python3", p / "Scripts" / "python.exe"):
            if cand.exists():
                return str(cand)
    if not p.exists() and shutil.which(python) is None:
        raise bad_input("python_not_found", f"python interpreter {python!r} does not exist", file=python)
    return str(p) if p.exists() else str(shutil.which(python))


def _probe_installed(python: str | None = None) -> tuple[Path, str | None]:
    """(root containing vllm/, METADATA text) as seen by ``python``, without importing vLLM.

    ``find_spec`` on a top-level package only locates it. It runs in a child
    interpreter started in a neutral directory, so neither sndr's own
    ``sys.path`` nor a ``vllm/`` in the caller's cwd can shadow the install.
    """
    exe = _resolve_python(python)
    try:
        proc = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise bad_input("python_not_found", f"cannot run {exe}: {exc}", file=exe) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise bad_input("python_failed", f"{exe} could not look up vllm: {last}", file=exe)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if "package" not in found:
        raise bad_input("vllm_not_found", f"vllm is not importable by {exe}", file=exe,
                        hint="pass the interpreter of the vLLM environment: --tree installed:/path/to/python")
    return Path(found["package"]).parent, found.get("metadata")


def find_installed_root(python: str | None = None) -> Path:
    """The directory containing ``vllm/`` that ``import vllm`` would use in ``python``."""
    return _probe_installed(python)[0]


# ----------------------------------------------------------------------------- version cache


def _want_version(version: str) -> Version:
    text = re.sub(r"^\s*vllm\s*===?\s*", "", version, flags=re.I).strip()
    try:
        return Version(text)
    except InvalidVersion:
        raise bad_input("bad_version", f"{version!r} is not a PEP 440 version", hint="e.g. vllm==0.33.0") from None


def _version_of_name(name: str) -> Version | None:
    """Version field of ``vllm-<ver>`` (tree dirs) or ``vllm-<ver>-<tags>.whl`` (wheels)."""
    parts = name.split("-")
    if len(parts) < 2 or parts[0] != _PKG:
        return None
    try:
        return Version(parts[1])
    except InvalidVersion:
        return None


def _ours(path: Path) -> bool:
    """A fetched tree is used only when this uid made it and nobody else can write into it."""
    try:
        st = path.lstat()
    except OSError:
        return False
    import stat as _stat

    return _stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _cached_tree(cache: Path, want: Version) -> Path | None:
    trees = cache / "trees"
    exact = trees / f"{_PKG}-{want}"
    if _ours(exact) and (exact / ".complete").is_file():
        return exact
    if not trees.is_dir():
        return None
    for d in sorted(trees.iterdir()):
        if d.suffix != ".tmp" and _version_of_name(d.name) == want and _ours(d) and (d / ".complete").is_file():
            return d
    return None


def trusted_cache_root() -> Path:
    """The cache root for fetched trees, under the cache-root rule (:mod:`sndr.caches`): a root another
    uid could change is refused (``cache_unsafe``), never read from or fetched into."""
    from . import caches
    from .fsio import UnsafeDirError

    try:
        for name in ("trees", "wheels", "locks"):
            caches.require_dir(name, "tree cache").close()
    except UnsafeDirError as exc:
        raise bad_input("cache_unsafe", f"refused: {exc.why}; a vllm==X tree is never read from or fetched into "
                        f"a cache another user could change", file=exc.path,
                        hint=f"set {env.CACHE_DIR} to a directory only you can write (sndr creates it 0700)") from None
    return Path(caches.root_path())


def _cached_wheel(cache: Path, want: Version) -> Path | None:
    wheels = cache / "wheels"
    if not wheels.is_dir():
        return None
    for w in sorted(wheels.glob(f"{_PKG}-*.whl")):
        if _version_of_name(w.name) == want:
            return w
    return None


def _pip_failure(version: str, stderr: str) -> SndrError:
    """Map pip's stderr to a reason code; users should never read a pip traceback."""
    if "No matching distribution" in stderr or "Could not find a version" in stderr:
        hint = None
        m = re.search(r"\(from versions: ([^)]*)\)", stderr)
        if m and m.group(1).strip() != "none":
            known = [v.strip() for v in m.group(1).split(",") if v.strip()]
            hint = "latest published: " + ", ".join(known[-5:])
        return SndrError(Problem("version_not_found", f"vllm=={version} is not published on the package index (no wheel)",
                                 key=f"vllm=={version}", hint=hint), EXIT_BAD_INPUT)
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return SndrError(Problem("fetch_failed", f"pip could not download vllm=={version}: {lines[-1] if lines else 'no output'}",
                             key=f"vllm=={version}", hint="check network access to the package index, or set "
                             f"{env.CACHE_DIR} to a cache that already holds the tree"), EXIT_BAD_INPUT)


def _download_wheel(cache: Path, version: str) -> Path:
    """pip-download the wheel into a private dir, then move it into wheels/.

    Moving a finished file in means a killed download never leaves a partial
    ``.whl`` that a later run would trust.
    """
    if env.env_flag(env.OFFLINE):
        raise bad_input("offline", f"vllm=={version} is not in the cache ({cache}) and {env.OFFLINE}=1 forbids fetching",
                        key=f"vllm=={version}")
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=wheels) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
               f"{_PKG}=={version}", "-d", tmp]
        returncode, out, err = _pip_with_progress(cmd, version, cache)
        got = sorted(Path(tmp).glob(f"{_PKG}-*.whl"))
        if returncode != 0 or not got:
            raise _pip_failure(version, err + out)
        dest = wheels / got[0].name
        os.replace(got[0], dest)
    return dest


def _pip_with_progress(cmd: list[str], version: str, cache: Path) -> tuple[int, str, str]:
    """Run ``pip download`` showing on stderr what is fetched, its size and the bytes so far (rich).

    pip names the file and its size on stdout (``Downloading vllm-...whl (312.4 MB)``);
    the bytes so far are the size of the partial file in pip's download directory.
    """
    import re as _re
    import threading

    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    console = Console(file=sys.stderr)
    console.print(f"sndr: fetching vllm=={version} from the package index into {cache} "
                  f"(the wheel is ~300 MB; only its .py files are kept)")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_chunks: list[str] = []
    assert proc.stdout is not None and proc.stderr is not None  # opened with PIPE
    stderr = proc.stderr
    reader = threading.Thread(target=lambda: err_chunks.append(stderr.read()), daemon=True)
    reader.start()
    out_lines: list[str] = []
    dest = Path(cmd[-1])
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(f"vllm=={version}", total=None)
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(0.5):
                done = sum(p.stat().st_size for p in dest.glob("*") if p.is_file()) if dest.is_dir() else 0
                progress.update(task, completed=done)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        for line in proc.stdout:
            out_lines.append(line)
            m = _re.search(r"Downloading (\S+) \(([\d.]+) ([kMG]B)\)", line)
            if m:
                scale = {"kB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(3)]
                progress.update(task, total=float(m.group(2)) * scale,
                                description=f"{m.group(1).rsplit('/', 1)[-1]} ({m.group(2)} {m.group(3)})")
                console.print(f"sndr: downloading {m.group(1).rsplit('/', 1)[-1]} ({m.group(2)} {m.group(3)})")
        proc.wait()
        stop.set()
    reader.join(timeout=5)
    return proc.returncode, "".join(out_lines), "".join(err_chunks)


def _wanted_member(name: str) -> bool:
    if _is_source(name):
        return True
    return re.fullmatch(rf"{_PKG}-[^/]+\.dist-info/(METADATA|entry_points\.txt)", name) is not None


def _extract(wheel: Path, cache: Path) -> Path:
    """Extract the .py sources and the dist-info we read into trees/vllm-<ver>/.

    Writes a ``.tmp`` sibling, drops ``.complete`` last, then renames: a crash
    at any point leaves either no tree or a whole one.
    """
    with WheelTree(wheel) as view:
        version = _metadata_version(view.metadata()) or view._fallback_version()
        trees = cache / "trees"
        final, tmp = trees / f"{_PKG}-{version}", trees / f"{_PKG}-{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        for name in sorted(view._members):
            if not _wanted_member(name):
                continue
            dest = tmp / _check_rel(name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            data = view.read_bytes(name)
            assert data is not None, name  # a member of the listing just taken
            dest.write_bytes(data)
    (tmp / ".complete").write_text(wheel.name + "\n")
    if final.exists():  # a tree without .complete that was not ours: replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def fetch_version(version: str) -> Path:
    """Cached root (contains ``vllm/``) of a published vLLM version, fetching it once.

    Order: a complete cached tree (no network), then a cached wheel, then
    ``pip download``. The cache root must pass the cache-root rule
    (:func:`trusted_cache_root`); a cached tree is used only when this uid made it. A file lock makes parallel processes (pytest-xdist,
    several CI jobs) fetch at most once.
    """
    from filelock import FileLock

    want = _want_version(version)
    cache = trusted_cache_root()
    hit = _cached_tree(cache, want)
    if hit is not None:
        return hit
    (cache / "locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / "locks" / "fetch.lock")):
        hit = _cached_tree(cache, want)
        if hit is not None:
            return hit
        wheel = _cached_wheel(cache, want) or _download_wheel(cache, str(want))
        root = _extract(wheel, cache)
        # Keep only the .py files (and the dist-info we read): a wheel is 300+ MB.
        try:
            wheel.unlink()
        except OSError:
            pass
        return root


# ----------------------------------------------------------------------------- open_tree


_VERSION_SPEC = re.compile(r"^\s*vllm\s*(?P<op>[=<>!~]{1,3})\s*(?P<ver>\S+)\s*$", re.I)


def _open_version(spec: str, m: re.Match) -> Tree:
    if m["op"] not in ("==", "==="):
        raise bad_input("bad_tree_spec", f"{spec!r}: a tree needs one exact version", hint=f"use vllm=={m['ver']}")
    return DirTree(fetch_version(m["ver"]), spec=spec, kind="version")


def _open_installed(spec: str) -> Tree:
    python = spec.split(":", 1)[1] if ":" in spec else None
    root, meta = _probe_installed(python or None)
    return DirTree(root, spec=spec, kind="installed", metadata=meta)


def _split_git(spec: str) -> tuple[Path, str] | None:
    """``REPO@REV`` -> (REPO, REV) for the leftmost ``@`` whose left side is a directory.

    Leftmost-first keeps reflog revisions such as ``HEAD@{1}`` intact.
    """
    for i, ch in enumerate(spec):
        if ch == "@" and i > 0:
            left = Path(spec[:i]).expanduser()
            if left.is_dir():
                return left, spec[i + 1:] or "HEAD"
    return None


def _open_git(spec: str) -> Tree:
    """``git:REPO@REV``, or ``git:REPO`` for its HEAD."""
    rest = spec[len("git:"):]
    split = _split_git(rest)
    if split is None and Path(rest).expanduser().is_dir():
        split = (Path(rest).expanduser(), "HEAD")
    if split is None:
        raise bad_input("tree_not_found", f"{spec!r}: no directory before '@'", file=rest, hint="git:/path/to/vllm@REV")
    return GitTree(split[0], split[1], spec=spec)


def _open_path(spec: str, path: Path) -> Tree:
    if path.is_file():
        if path.suffix == ".whl":
            return WheelTree(path, spec=spec)
        raise bad_input("bad_tree_spec", f"{path} is a file but not a .whl", file=str(path), hint=f"a tree is {_SPEC_FORMS}")
    if (path / _PKG).is_dir():
        return DirTree(path.resolve(), spec=spec)
    if path.name == _PKG and (path / "__init__.py").is_file():
        return DirTree(path.resolve().parent, spec=spec)
    raise bad_input("no_vllm", f"{path} does not contain a vllm/ package", file=str(path),
                    hint="point at the directory that contains vllm/ (site-packages or a checkout)")


def open_tree(spec: str | Path | Tree) -> Tree:
    """Open a tree from what a user typed; every bad spec is a SndrError with exit code 2."""
    if isinstance(spec, Tree):
        return spec
    if isinstance(spec, Path):
        if not spec.exists():
            raise bad_input("tree_not_found", f"{spec} does not exist", file=str(spec), hint=f"a tree is {_SPEC_FORMS}")
        return _open_path(str(spec), spec)
    text = str(spec).strip()
    if not text:
        raise bad_input("bad_tree_spec", "empty tree spec", hint=f"a tree is {_SPEC_FORMS}")
    if text == "installed" or text.startswith("installed:"):
        return _open_installed(text)
    m = _VERSION_SPEC.match(text)
    if m:
        return _open_version(text, m)
    if text.startswith("git:"):
        return _open_git(text)
    path = Path(text).expanduser()
    if path.exists():
        return _open_path(text, path)
    split = _split_git(text)
    if split is not None and _run_git(split[0], "rev-parse", "--git-dir", check=False).returncode == 0:
        return GitTree(split[0], split[1], spec=text)
    hint = f"a tree is {_SPEC_FORMS}"
    try:
        Version(text)
        hint = f"did you mean vllm=={text}?"
    except InvalidVersion:
        pass
    raise bad_input("tree_not_found", f"{text} does not exist", file=text, hint=hint)
