"""The planner's caches under the cache root (``sndr.caches``): a dry run reads them and writes nothing.

"Dry-run is pure" covers the cache root too: ``apply --dry-run`` wrote its compile-ok and scope entries
into ``<cache root>/plan-<python>`` (and created that directory, and the cache root itself), and
``--dry-run --tree vllm==X`` created ``wheels/`` and ``locks/`` beside the cached tree. Each test
snapshots the whole cache root and the tree (names, kinds, modes, bytes, mtimes) around a real run.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sndr import PIN_VERSION, caches, env, fsio
from sndr import plan as plan_mod
from sndr.apply import run_apply
from sndr.load import load_patch_set
from tests.conftest import CORE_SET_FILES

DATA = Path(__file__).resolve().parents[1] / "data" / "core"
FILES = CORE_SET_FILES  # (tests/conftest.py)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` and ``root`` itself: kind, mode, bytes (or link target) and mtime. A
    temp file made and removed again still shows, in its directory's mtime. {} when ``root`` is absent."""
    if not os.path.lexists(root):
        return {}
    out: dict[str, tuple] = {}
    for p in [root, *sorted(root.rglob("*"))]:
        st = p.lstat()
        body: bytes | str | None = None
        if stat.S_ISREG(st.st_mode):
            body = p.read_bytes()
        elif stat.S_ISLNK(st.st_mode):
            body = os.readlink(p)
        out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), body, st.st_mtime_ns)
    return out


def sndr_apply(*args: str, cache: Path) -> subprocess.CompletedProcess:
    e = dict(os.environ, SNDR_CACHE_DIR=str(cache), SNDR_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "sndr.apply", *args], capture_output=True, text=True, env=e)


def plan_dir(cache: Path) -> Path:
    return cache / env.plan_cache_name(fsio.python_tag())


@pytest.mark.parametrize("primed", [False, True], ids=["no-cache-root", "primed-cache-root"])
def test_dry_run_writes_nothing_in_the_tree_or_the_cache_root(pin_subtree, tmp_path, primed):
    """``python -m sndr.apply --dry-run``: the tree and the cache root are byte for byte as they were, whether
    the cache root does not exist yet (it is not created) or holds a real apply's entries (it is read, not
    written, and its 0755 mode is not tightened); the report is the same either way."""
    tree = pin_subtree(FILES)
    cache = tmp_path / "cache"
    if primed:
        other = shutil.copytree(tree, tmp_path / "other")
        assert sndr_apply("--tree", str(other), "--patches", str(DATA), "-q", cache=cache).returncode == 0
        assert sorted(p.name[:3] for p in plan_dir(cache).iterdir() if p.name.startswith("ok-"))  # entries to read
        cache.chmod(0o755)  # ours, readable by others: a writer tightens it quietly, a dry run leaves it
    before_tree, before_cache = snapshot(tree), snapshot(cache)
    r = sndr_apply("--dry-run", "--tree", str(tree), "--patches", str(DATA), "--json", "-", "-q", cache=cache)
    assert r.returncode == 0, r.stderr
    assert '"mode": "dry-run"' in r.stdout
    assert snapshot(tree) == before_tree
    assert snapshot(cache) == before_cache
    assert not os.path.lexists(cache) or primed


def test_dry_run_reads_the_plan_cache_a_real_apply_wrote(pin_subtree, tmp_path, monkeypatch):
    """The read-only view is still a cache: a dry run after a real apply of the same files takes its
    compile-ok entries (no ``compile`` of a changed file) and writes nothing; with no cache root it compiles
    every changed ``.py`` and creates nothing either."""
    tree = pin_subtree(FILES)
    other = shutil.copytree(tree, tmp_path / "other")
    cache = tmp_path / "cache"
    patch_set = load_patch_set(DATA, packs=False)
    compiled: list[str] = []

    def counting_compile(source, filename, *args, **kwargs):
        compiled.append(filename)
        return compile(source, filename, *args, **kwargs)

    monkeypatch.setattr(plan_mod, "compile", counting_compile, raising=False)
    monkeypatch.setenv(env.CACHE_DIR, str(cache))
    try:
        assert caches.enable(readonly=True) is None and not os.path.lexists(cache)  # nothing there, nothing made
        assert run_apply(tree, patch_set, dry_run=True).ok
        cold = sorted(compiled)
        assert cold and all(f.endswith(".py") for f in cold) and not os.path.lexists(cache)

        caches.enable()  # a real apply writes the entries
        assert run_apply(other, patch_set).ok
        before = snapshot(cache)
        compiled.clear()
        memo = caches.enable(readonly=True)
        assert memo is not None and memo.readonly
        assert run_apply(tree, patch_set, dry_run=True).ok
        assert compiled == []  # every changed file's compile-ok entry was read
        assert snapshot(cache) == before
        with pytest.raises(OSError):  # the view itself refuses a write, whoever asks
            memo.write("ok-planted", b"")
        assert snapshot(cache) == before
    finally:
        caches.disable()


def test_dry_run_on_a_cached_release_writes_nothing_under_the_cache_root(vllm_pin_root, tmp_path):
    """``--dry-run --tree vllm==X`` with the release already fetched reads ``trees/vllm-X`` and creates
    nothing beside it (it made ``wheels/`` and ``locks/``, and ``plan-<python>``, before)."""
    cache = tmp_path / "cache"
    release = cache / env.CACHE_TREES / f"vllm-{PIN_VERSION}"
    for rel in [*FILES, "vllm/__init__.py", "vllm/version.py"]:
        (release / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(vllm_pin_root / rel, release / rel)
    for info in vllm_pin_root.glob("*.dist-info"):
        shutil.copytree(info, release / info.name)
    (release / ".complete").write_text("test\n")
    cache.chmod(0o700)
    before = snapshot(cache)
    r = sndr_apply("--dry-run", "--tree", f"vllm=={PIN_VERSION}", "--patches", str(DATA), "--json", "-", "-q",
                   cache=cache)
    assert r.returncode == 0, r.stderr
    assert '"mode": "dry-run"' in r.stdout and f'"vllm_version": "{PIN_VERSION}"' in r.stdout
    assert snapshot(cache) == before
