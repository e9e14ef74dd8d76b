"""Issue 33: trust boundaries beside the main path: every cache, every output path, every side path.

The attacker is uid 65534 (a forked child that drops to it, as in
``test_hardening.py``); the victim is this process (root where the test needs
another uid). Each test is an attack from the issue and the promise it must keep.
"""

from __future__ import annotations

import hmac  # noqa: F401 - the attacker child (uid 65534) may not read the stdlib: import it here
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sndr import caches, fsio

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (another uid, chown)")
NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]


def _as_nobody(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a forked child that dropped to uid/gid 65534; fail the test if it raised."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fn()
            code = 0
        except BaseException as exc:  # noqa: BLE001 - report, then leave the child
            os.write(2, f"attacker child failed: {exc!r}\n".encode())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the attacker's child failed ({status})"


@pytest.fixture
def world(tmp_path):
    """A root-owned 0755 directory under /tmp that uid 65534 can reach (pytest's tmp_path is 0700)."""
    base = Path(tempfile.mkdtemp(prefix="sndr-trust-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _nobody_dir(path: Path) -> Path:
    path.mkdir(mode=0o755)
    os.chown(path, NOBODY, NOBODY)
    return path


# ----------------------------------------------------------------------------- 1. the cubin cache


KERNEL = 'extern "C" __global__ void k(int* o) {{ o[threadIdx.x] = {value}; }}\n'
WRITES_1, WRITES_1337 = KERNEL.format(value=1), KERNEL.format(value=1337)
NVRTC = (12, 8)


def _stand_in_compile(source: str, name: str, opts: list[str]) -> bytes:
    """NVRTC's stand-in: a 'cubin' that records the value the kernel writes."""
    m = re.search(r"o\[threadIdx\.x\] = (\d+);", source)
    assert m, source
    return b"STAND-IN CUBIN\0" + m.group(1).encode()


def _stand_in_launch(cubin: bytes) -> list[int]:
    """The driver's stand-in: what a 4-thread launch of the loaded cubin writes."""
    assert cubin.startswith(b"STAND-IN CUBIN\0"), cubin[:40]
    return [int(cubin.split(b"\0", 1)[1])] * 4


@pytest.fixture
def cudart(monkeypatch):
    from sndr.kernels.turboquant_k8v4 import _cudart

    calls: list[str] = []

    def compile_(source, name, opts):
        calls.append(source)
        return _stand_in_compile(source, name, opts)

    monkeypatch.setattr(_cudart, "nvrtc_version", lambda: NVRTC)
    monkeypatch.setattr(_cudart, "_nvrtc_compile", compile_)
    monkeypatch.setattr(_cudart, "_CUBIN_DIRS", {})
    monkeypatch.setattr(caches, "_SAID", set())
    _cudart.compiled = calls  # type: ignore[attr-defined]
    return _cudart


def _entry(cudart, source: str) -> str:
    return f"k-sm90-{cudart.cubin_key(source, 'k', cudart._options('90', {}), NVRTC)}.cubin"


def _forge(cache_root: Path, entry: str, cubin: bytes) -> Callable[[], None]:
    """The attacker's move: store ``cubin`` under ``entry``, validly sealed with a secret it owns."""

    def plant() -> None:
        d = fsio.PrivateDir.open(cache_root / "cubin", "cubin cache")
        d.put_sealed("cubin", entry, cubin)
        assert d.get_sealed("cubin", entry) == cubin  # a valid entry of the attacker's own cache

    return plant


@ROOT_ONLY
def test_cubin_planted_by_another_uid_in_its_cache_root_is_never_loaded(cudart, world, monkeypatch, capsys):
    """Issue 33 HIGH 1: uid 65534 owns the cache root and stores a 'writes 1337' cubin, sealed with its own
    secret, under the key of the 'writes 1' kernel. Root compiles again and never reads that cache."""
    root = _nobody_dir(world / "cache")
    entry = _entry(cudart, WRITES_1)
    _as_nobody(_forge(root, entry, _stand_in_compile(WRITES_1337, "k", [])))
    assert (root / "cubin" / entry).stat().st_uid == NOBODY  # the plant is there, under the right name
    monkeypatch.setenv("SNDR_CACHE_DIR", str(root))
    cubin = cudart.compile_cubin(WRITES_1, "k", "90", {})
    assert _stand_in_launch(cubin) == [1, 1, 1, 1]
    assert cudart.compiled == [WRITES_1]  # compiled here, not loaded from the plant
    err = capsys.readouterr().err
    assert "cubin cache is disabled" in err and f"owned by uid {NOBODY}" in err, err
    assert cudart.cubin_cache() is None


@ROOT_ONLY
def test_cubin_directory_of_another_uid_under_a_trusted_root_is_refused(cudart, world, monkeypatch, capsys):
    """The root is ours but ``cubin/`` belongs to uid 65534 (made while the root was open): refused too."""
    root = world / "cache"
    root.mkdir(mode=0o755)  # ours; the attacker can reach its directory but rename nothing here
    _nobody_dir(root / "cubin")
    entry = _entry(cudart, WRITES_1)
    _as_nobody(_forge(root, entry, _stand_in_compile(WRITES_1337, "k", [])))
    monkeypatch.setenv("SNDR_CACHE_DIR", str(root))
    cubin = cudart.compile_cubin(WRITES_1, "k", "90", {})
    assert _stand_in_launch(cubin) == [1, 1, 1, 1]
    err = capsys.readouterr().err
    assert "cubin cache is disabled" in err and f"owned by uid {NOBODY}" in err, err


def test_cubin_of_another_kernel_or_unsealed_under_this_key_is_compiled_again(cudart, tmp_path, monkeypatch):
    """In our own cache: another kernel's sealed entry renamed to this key, or a raw cubin dropped there
    (a restore, a copy from another cache), is refused by the seal and replaced by a fresh compile."""
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path / "cache"))
    evil = cudart.compile_cubin(WRITES_1337, "k", "90", {})
    assert cudart.compile_cubin(WRITES_1337, "k", "90", {}) == evil and cudart.compiled == [WRITES_1337]  # a hit
    d = tmp_path / "cache" / "cubin"
    good, bad = d / _entry(cudart, WRITES_1), d / _entry(cudart, WRITES_1337)
    shutil.copy(bad, good)  # sealed, but for the other name
    assert _stand_in_launch(cudart.compile_cubin(WRITES_1, "k", "90", {})) == [1, 1, 1, 1]
    good.write_bytes(evil)  # not sealed at all
    if os.geteuid() == 0:
        os.chown(good, NOBODY, NOBODY)
    assert _stand_in_launch(cudart.compile_cubin(WRITES_1, "k", "90", {})) == [1, 1, 1, 1]
    assert cudart.compiled == [WRITES_1337, WRITES_1, WRITES_1]
    # The fresh compile replaced the plant with our own sealed entry: the next load is a hit.
    assert _stand_in_launch(cudart.compile_cubin(WRITES_1, "k", "90", {})) == [1, 1, 1, 1]
    assert len(cudart.compiled) == 3


def test_cubin_key_is_the_exact_source_options_and_nvrtc(cudart):
    opts = cudart._options("90", {"D": 128})
    k = cudart.cubin_key(WRITES_1, "k", opts, NVRTC)
    assert k != cudart.cubin_key(WRITES_1337, "k", opts, NVRTC)
    assert k != cudart.cubin_key(WRITES_1, "k", cudart._options("90", {"D": 64}), NVRTC)
    assert k != cudart.cubin_key(WRITES_1, "k", opts, (12, 9))
    assert len(k) == 64


# ----------------------------------------------------------------------------- 2. one decision per cache root


def _plant_tree(trees: Path, pin: Path, version: str) -> Path:
    """A complete-looking cached tree of ``version`` that is really a copy of the pin."""
    planted = trees / f"vllm-{version}"
    shutil.copytree(pin, planted)
    (planted / ".complete").write_text(f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl\n")
    return planted


def _preflight(pin: Path, pdir: Path, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, SNDR_CACHE_DIR=str(cache), SNDR_OFFLINE="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "sndr", "preflight", "--patches", str(pdir), "--pin", str(pin),
                           "--candidate", "vllm==0.33.0", "--no-config", "--no-suggestions"],
                          capture_output=True, text=True, timeout=300, env=env)


@ROOT_ONLY
def test_planted_tree_under_a_cache_root_of_another_uid_never_makes_the_preflight_clean(
        world, pin_subtree, tmp_path):
    """Issue 33 HIGH 3: uid 65534 owns the cache root and plants ``trees/vllm-0.33.0`` (a copy of the pin).
    The preflight used it and said "clean", exit 0. Now the whole root is refused: exit 2, naming it."""
    from .test_bad_input import FILES, patch_text

    pin = pin_subtree(FILES)
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "PB0001-x.toml").write_text(patch_text())
    root = _nobody_dir(world / "cache")
    _nobody_dir(root / "trees")
    planted = _plant_tree(root / "trees", pin, "0.33.0")
    for p in [planted, *planted.rglob("*")]:
        os.chown(p, NOBODY, NOBODY, follow_symlinks=False)
    proc = _preflight(pin, pdir, root)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "cache_unsafe" in out and f"owned by uid {NOBODY}" in out and str(root) in out, out
    assert "clean" not in out.lower() and "Traceback" not in out, out


@ROOT_ONLY
def test_planted_tree_of_another_uid_under_our_cache_root_is_not_used(pin_subtree, tmp_path):
    """The root is ours, but ``trees/vllm-0.33.0`` belongs to another uid: never taken for the release."""
    from sndr.errors import SndrError
    from sndr.tree import open_tree

    from .test_bad_input import FILES

    pin = pin_subtree(FILES)
    root = tmp_path / "cache"
    (root / "trees").mkdir(parents=True, mode=0o700)
    planted = _plant_tree(root / "trees", pin, "0.33.0")
    os.chown(planted, NOBODY, NOBODY)
    env = {"SNDR_CACHE_DIR": str(root), "SNDR_OFFLINE": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with pytest.raises(SndrError) as info:
            open_tree("vllm==0.33.0")
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert info.value.problems[0].code == "offline", info.value.render()


def test_every_cache_under_a_refused_root_is_refused(tmp_path, monkeypatch, capsys):
    """One decision per root: a group-writable cache root turns off the code, plan, cubin, preflight and
    tree caches alike, and a vllm==X tree is refused with exit 2 (cache_unsafe)."""
    from sndr.errors import SndrError
    from sndr.preflight import lineindex
    from sndr.startup import importer
    from sndr.tree import fetch_version

    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o775)
    monkeypatch.setenv("SNDR_CACHE_DIR", str(root))
    monkeypatch.setattr(caches, "_SAID", set())
    monkeypatch.setattr(importer, "_CACHES", {})
    assert importer.open_cache() is None
    assert caches.open_plan_cache() is None
    assert caches.open_dir("cubin", "cubin cache") is None
    assert lineindex.tree_index("f" * 64, lambda: ["a.py"], lambda rel: "import os\n") is None
    with pytest.raises(SndrError) as info:
        fetch_version("0.33.0")
    assert info.value.problems[0].code == "cache_unsafe" and info.value.exit_code == 2
    assert os.listdir(root) == []  # nothing was created under the refused root
    err = capsys.readouterr().err
    for what in ("code cache", "plan cache", "cubin cache", "preflight cache"):
        assert f"the {what} is disabled" in err or f"{what} is disabled" in err.lower(), (what, err)
