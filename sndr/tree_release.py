"""Published releases (``--tree vllm==X.Y.Z``): the cached tree under the cache root, fetched from the index once.

The layout under :func:`sndr.env.cache_root` (names in :mod:`sndr.env`):
``trees/vllm-<ver>/`` (the wheel's ``.py`` files and the dist-info sndr reads,
``.complete`` written last), ``wheels/`` (a wheel ``pip download`` fetched,
deleted once extracted) and ``locks/fetch.lock``. The cache root must pass the
cache-root rule (:mod:`sndr.caches`); a cached tree is used only when this uid
made it. The tree itself is a :class:`sndr.treeview.DirTree` of that directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

from . import env
from .errors import EXIT_BAD_INPUT, Problem, SndrError, bad_input
from .tree_wheel import WheelTree
from .treespec import PKG as _PKG
from .treespec import Spec
from .treeview import DirTree, check_rel, is_source, metadata_version

__all__ = ["cached_tree", "fetch_version", "open_release", "trusted_cache_root", "want_version"]


def want_version(version: str) -> Version:
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


def cached_tree(cache: Path, want: Version) -> Path | None:
    trees = cache / env.CACHE_TREES
    exact = trees / f"{_PKG}-{want}"
    if _ours(exact) and (exact / ".complete").is_file():
        return exact
    if not trees.is_dir():
        return None
    for d in sorted(trees.iterdir()):
        if d.suffix != ".tmp" and _version_of_name(d.name) == want and _ours(d) and (d / ".complete").is_file():
            return d
    return None


def trusted_cache_root(*, readonly: bool = False) -> Path | None:
    """The cache root for fetched trees, under the cache-root rule (:mod:`sndr.caches`): a root another
    uid could change is refused (``cache_unsafe``), never read from or fetched into. ``readonly``: the same
    check of the root and ``trees/`` creating nothing (None where ``trees/`` does not exist), so reading a
    tree fetched before writes nothing under the cache root (a dry run)."""
    from . import caches
    from .fsio import UnsafeDirError

    names = (env.CACHE_TREES,) if readonly else (env.CACHE_TREES, env.CACHE_WHEELS, env.CACHE_LOCKS)
    try:
        for name in names:
            caches.require_dir(name, "tree cache", readonly=readonly).close()
    except FileNotFoundError:
        if not readonly:
            raise
        return None
    except UnsafeDirError as exc:
        raise bad_input("cache_unsafe", f"refused: {exc.why}; a vllm==X tree is never read from or fetched into "
                        f"a cache another user could change", file=exc.path,
                        hint=f"set {env.CACHE_DIR} to a directory only you can write (sndr creates it 0700)") from None
    return Path(caches.root_path())


def _cached_wheel(cache: Path, want: Version) -> Path | None:
    wheels = cache / env.CACHE_WHEELS
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
    wheels = cache / env.CACHE_WHEELS
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

    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from .render import make_console

    console = make_console(stderr=True)
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
    if is_source(name):
        return True
    return re.fullmatch(rf"{_PKG}-[^/]+\.dist-info/(METADATA|entry_points\.txt)", name) is not None


def _extract(wheel: Path, cache: Path) -> Path:
    """Extract the .py sources and the dist-info we read into trees/vllm-<ver>/.

    Writes a ``.tmp`` sibling, drops ``.complete`` last, then renames: a crash
    at any point leaves either no tree or a whole one.
    """
    with WheelTree(wheel) as view:
        version = metadata_version(view.metadata()) or view._fallback_version()
        trees = cache / env.CACHE_TREES
        final, tmp = trees / f"{_PKG}-{version}", trees / f"{_PKG}-{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        for name in sorted(view._members):
            if not _wanted_member(name):
                continue
            dest = tmp / check_rel(name)
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

    want = want_version(version)
    cache = trusted_cache_root(readonly=True)  # a tree fetched before is read without writing anything
    hit = cached_tree(cache, want) if cache is not None else None
    if hit is not None:
        return hit
    cache = trusted_cache_root()
    assert cache is not None  # not readonly: created, or raised
    (cache / env.CACHE_LOCKS).mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / env.CACHE_LOCKS / "fetch.lock")):
        hit = cached_tree(cache, want)
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


def open_release(spec: Spec) -> DirTree:
    """``vllm==X`` (also ``===``): the cached tree of that release; any other operator is refused."""
    if spec.op not in ("==", "==="):
        raise bad_input("bad_tree_spec", f"{spec.text!r}: a tree needs one exact version", hint=f"use vllm=={spec.arg}")
    return DirTree(fetch_version(spec.arg), spec=spec.text, kind="version")
