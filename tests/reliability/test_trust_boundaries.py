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

from sndr import caches, fsio, stderr

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
    from sndr.kernels import _cudart

    calls: list[str] = []

    def compile_(source, name, opts):
        calls.append(source)
        return _stand_in_compile(source, name, opts)

    monkeypatch.setattr(_cudart, "nvrtc_version", lambda: NVRTC)
    monkeypatch.setattr(_cudart, "_nvrtc_compile", compile_)
    monkeypatch.setattr(_cudart, "_CUBIN_DIRS", {})
    monkeypatch.setattr(stderr, "_SAID", set())  # the said-once memory of sndr.stderr.say
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
    from sndr.startup import hookcache
    from sndr.tree import fetch_version

    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o775)
    monkeypatch.setenv("SNDR_CACHE_DIR", str(root))
    monkeypatch.setattr(stderr, "_SAID", set())  # the said-once memory of sndr.stderr.say
    monkeypatch.setattr(hookcache, "_CACHES", {})
    assert hookcache.open_cache() is None
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


# ----------------------------------------------------------------------------- 5. one output writer


def _chardev(path: Path) -> Path:
    """A /dev/null-like character device (1, 3) of our own: the real /dev/null is never put at risk."""
    os.mknod(path, 0o666 | __import__("stat").S_IFCHR, os.makedev(1, 3))
    return path


def _kind(path: Path) -> str:
    import stat

    st = path.lstat()
    return ("fifo" if stat.S_ISFIFO(st.st_mode) else "chr" if stat.S_ISCHR(st.st_mode)
            else "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "reg")


def test_write_output_replaces_a_regular_file_of_ours_atomically(tmp_path, capsys):
    from sndr.cli import write_output

    out = tmp_path / "r.json"
    out.write_text("old\n")
    os.chmod(out, 0o640)
    before = out.stat().st_ino
    write_output(out, "new\n")
    assert out.read_text() == "new\n" and out.stat().st_ino != before  # a new inode: replaced, not rewritten
    assert out.stat().st_mode & 0o777 == 0o640  # its mode kept
    assert not [p for p in tmp_path.iterdir() if fsio.is_temp_name(p.name)]
    write_output(tmp_path / "sub" / "new.json", "x")  # a new path (its directory created)
    assert (tmp_path / "sub" / "new.json").read_text() == "x"
    write_output("-", "to stdout\n")
    assert capsys.readouterr().out == "to stdout\n"


@pytest.mark.parametrize("kind", ["fifo", "chr", "dir", "symlink"])
def test_write_output_refuses_what_is_not_a_regular_file_of_ours(tmp_path, kind):
    from sndr.cli import write_output
    from sndr.errors import SndrError

    target = tmp_path / "out"
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "chr":
        if os.geteuid() != 0:
            pytest.skip("mknod of a character device needs root")
        _chardev(target)
    elif kind == "dir":
        target.mkdir()
    else:
        target.symlink_to(victim)
    before = _kind(target)
    with pytest.raises(SndrError) as info:
        write_output(target, "report\n", "--json")
    p = info.value.problems[0]
    assert p.code == "output_refused" and p.file == str(target) and info.value.exit_code == 2, p
    assert _kind(target) == before and victim.read_text() == "secret\n"


def test_write_output_into_a_named_directory_never_follows_a_link_there(tmp_path, monkeypatch):
    """``manifest build --out DIR`` wrote DIR/vllm-<version>.json through DIR when DIR was a symlink to a directory
    elsewhere: the writer checked the file's own name only. The directory the user named is an output path too
    (``check_output(directory=True)``, ``write_output(named_dir=True)``): a symlink, FIFO or file there is refused,
    naming it, and a link swapped in between that check and the write is not followed either (the file is written
    through the directory opened O_NOFOLLOW)."""
    from sndr import cli
    from sndr.errors import SndrError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "out"
    link.symlink_to(elsewhere)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    plain = tmp_path / "plain"
    plain.write_text("x")
    for where, said in ((link, f"it is a symlink to {elsewhere}"), (fifo, "it is a FIFO, not a directory"),
                        (plain, "it is a regular file, not a directory")):
        for named_dir in (False, True):  # the check before the work; the writer itself
            with pytest.raises(SndrError) as info:
                if named_dir:
                    cli.write_output(where / "m.json", "{}\n", "--out", named_dir=True)
                else:
                    cli.check_output(where, "--out", directory=True)
            p = info.value.problems[0]
            assert (p.code, p.file, info.value.exit_code) == ("output_refused", str(where), 2), p
            assert said in p.message, p
    assert list(elsewhere.iterdir()) == [] and link.is_symlink() and plain.read_text() == "x"

    real = tmp_path / "real"
    real.mkdir()
    makedirs = os.makedirs

    def swap_then_makedirs(path, *args, **kwargs):  # after the checks, before the write: a link takes its place
        if os.fspath(path) == str(real):
            real.rename(tmp_path / "moved")
            real.symlink_to(elsewhere)
        return makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", swap_then_makedirs)
    with pytest.raises(SndrError) as info:
        cli.write_output(real / "m.json", "{}\n", "--out", named_dir=True)
    assert info.value.problems[0].code == "output_refused" and "symlink" in info.value.problems[0].message
    assert list(elsewhere.iterdir()) == [] and not [p for p in (tmp_path / "moved").iterdir()]
    monkeypatch.undo()
    for dest in (tmp_path / "moved" / "m.json", tmp_path / "new" / "sub" / "m.json"):  # a directory; a new one
        cli.write_output(dest, "{}\n", "--out", named_dir=True)
        assert dest.read_text() == "{}\n"
        assert not [p for p in dest.parent.iterdir() if fsio.is_temp_name(p.name)]


@ROOT_ONLY
def test_symlink_of_another_uid_to_a_root_only_file_is_never_written(world):
    """Issue 33 MEDIUM 7: ``apply --json FILE --dry-run`` followed uid 65534's symlink and overwrote a
    root-only 0600 file with the report."""
    secret = world / "shadow"
    secret.write_text("root only\n")
    os.chmod(secret, 0o600)
    drop = world / "drop"
    drop.mkdir()
    os.chmod(drop, 0o1777)  # a /tmp-like directory the attacker can write
    link = drop / "report.json"
    _as_nobody(lambda: os.symlink(secret, link))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "sndr", "apply", "--dry-run", "--tree", str(world / "none"),
                           "--json", str(link)], capture_output=True, text=True, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "output_refused" in out and str(link) in out, out
    assert secret.read_text() == "root only\n" and _kind(link) == "link"
    own = world / "own"
    own.write_text("x")
    os.chown(own, NOBODY, NOBODY)
    from sndr.cli import write_output
    from sndr.errors import SndrError

    with pytest.raises(SndrError, match=f"owned by uid {NOBODY}"):
        write_output(own, "report")
    assert own.read_text() == "x"


def _run_sndr(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "sndr", *argv], capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL)


OUTPUT_COMMANDS = {
    "apply --json": ["apply", "--dry-run", "--tree", "/nonexistent-tree", "--json", "{out}"],
    "sync plan --json": ["sync", "plan", "--repo", "/nonexistent", "--from", "a", "--to", "b", "--json", "{out}"],
    "sync plan --md": ["sync", "plan", "--repo", "/nonexistent", "--from", "a", "--to", "b", "--md", "{out}"],
    "vendor --json": ["vendor", "--diff", "/nonexistent.diff", "--id", "PN0001", "--tree", "/nonexistent",
                      "--json", "{out}"],
    "preflight --json": ["preflight", "--pin", "/nonexistent", "--candidate", "/nonexistent", "--json", "{out}"],
    "preflight --markdown": ["preflight", "--pin", "/x", "--candidate", "/y", "--markdown", "{out}"],
    "preflight --sarif": ["preflight", "--pin", "/x", "--candidate", "/y", "--sarif", "{out}"],
    "manifest build --out": ["manifest", "build", "--tree", "/nonexistent", "--out", "{out}"],
    "status --json": ["status", "--run-dir", "/nonexistent-run", "--prune", "--json", "{out}"],
    "list --json": ["list", "--patches", "/nonexistent-patches", "--json", "{out}"],
    "watchlist lint --json": ["watchlist", "lint", "--watchlist", "/nonexistent.yaml", "--json", "{out}"],
    "watchlist check --json": ["watchlist", "check", "--preflight", "/x.json", "--watchlist", "/y.yaml",
                               "--json", "{out}"],
    "schema codes --json": ["schema", "codes", "--json", "{out}"],
    "import --json": ["import", "quilt", "/nonexistent-series", "--to", "/nonexistent-out", "--tree", "/x",
                      "--json", "{out}"],
    "import --to": ["import", "quilt", "/nonexistent-series", "--to", "{out}", "--tree", "/x"],
    "vendor --out": ["vendor", "--diff", "/nonexistent.diff", "--id", "PN0001", "--tree", "/nonexistent",
                     "--out", "{out}"],
}


#: Outputs that one command checks in the same loop as another of its flags (one check_output loop over the
#: flags, before any work): the inner loop runs the FIFO case of the flag named here, the full suite all of them.
SAME_LOOP = {"preflight --markdown": "preflight --json", "preflight --sarif": "preflight --json",
             "sync plan --md": "sync plan --json"}


def _output_marks(name: str, target: str):
    if name in SAME_LOOP:
        return pytest.mark.full_only(f"{SAME_LOOP[name]}-fifo: the same check_output loop over this command's flags")
    if target == "fifo" or name == "apply --json":
        return ()
    return pytest.mark.full_only("the FIFO case of this command and the device case of apply")


#: Every command with a FIFO, and with a character device; the inner loop runs the device case of one command
#: (the writer's check is one function: test_write_output_refuses_what_is_not_a_regular_file_of_ours has every kind).
OUTPUT_CASES = [pytest.param(name, target, id=f"{name}-{target}", marks=_output_marks(name, target))
                for name in sorted(OUTPUT_COMMANDS) for target in ("fifo", "chr")]


@pytest.mark.parametrize(("name", "target"), OUTPUT_CASES)
def test_every_command_refuses_a_fifo_or_device_output_without_hanging(tmp_path, name, target):
    """Issue 33 MEDIUM 7 / issue 30 item 4: ``sync plan --json /dev/null`` made /dev/null a regular file; a
    FIFO became a 350 KB file. Every command refuses both, before any work, with exit 2 and no hang."""
    out = tmp_path / "out.json"
    if target == "fifo":
        os.mkfifo(out)
    elif os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    else:
        _chardev(out)
    proc = _run_sndr(*[a.format(out=out) for a in OUTPUT_COMMANDS[name]])
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "output_refused" in text and str(out) in text, text
    assert "Traceback" not in text
    assert _kind(out) == target


def test_prometheus_textfile_refuses_a_fifo_and_replaces_a_file(tmp_path):
    pytest.importorskip("prometheus_client")
    from sndr.errors import SndrError
    from sndr.startup.metrics import write_textfile

    fifo = tmp_path / "sndr.prom"
    os.mkfifo(fifo)
    with pytest.raises(SndrError, match="FIFO"):
        write_textfile(str(fifo), [], ["a finding"])
    assert _kind(fifo) == "fifo"
    good = tmp_path / "ok.prom"
    write_textfile(str(good), [], [])
    assert "sndr_status_ok 1.0" in good.read_text()


# ----------------------------------------------------------------------------- 3. FIFOs in side paths


def _fifo_at(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _verify(box, timeout: float = 60, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sndr", "apply", "--verify", "--tree", str(box.root)],
                          capture_output=True, text=True, timeout=timeout, env=box.environ(**env),
                          stdin=subprocess.DEVNULL, cwd=str(box.tmp))


@pytest.fixture
def applied_box(tmp_path, monkeypatch):
    from tests.hook_fixtures import Box

    box = Box(tmp_path)
    for k in [k for k in os.environ if k.startswith("SNDR_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SNDR_CACHE_DIR", str(box.cache))
    monkeypatch.setenv("SNDR_PATCHES", str(box.patches))
    return box


def _warm_fast_path(box, **env) -> None:
    """Two verifies warm the fast path's memo: in this process (the same sndr and cache a child reads; two
    child interpreters cost ~0.6 s of CPU per test), then the check that the next verify is answered by it."""
    import contextlib
    import io

    from sndr.__main__ import main
    from sndr.startup import verify

    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        for _ in range(2):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(["apply", "--verify", "--tree", str(box.root)])
            assert rc == 0, out.getvalue() + err.getvalue()
        assert verify.check(str(box.root), None, os.environ) is not None  # the next verify is answered by the fast path
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.parametrize("where", [".sndr/journal.json", ".sndr/ledger.json", "vllm/engine.py"])
def test_verify_fast_path_never_hangs_on_a_fifo(applied_box, where):
    """Issue 33 MEDIUM 4: the ``--verify --tree T`` fast path opened these with a plain open() and blocked."""
    box = applied_box
    box.apply()
    _warm_fast_path(box)
    path = box.root / where
    if where.endswith("journal.json"):
        os.mkfifo(path)
    else:
        _fifo_at(path)
    proc = _verify(box)
    out = proc.stdout + proc.stderr
    assert proc.returncode in (1, 2) and "Traceback" not in out, out
    assert "ok  enabled set" not in proc.stdout, out
    assert _kind(path) == "fifo"


def test_verify_fast_path_never_hangs_on_a_fifo_profile(applied_box):
    """The same with SNDR_PROFILE a FIFO and a set that uses ``when`` (the profile is in the memo key)."""
    box = applied_box
    sub = box.patches / "F0002-sub.toml"
    sub.write_text(sub.read_text().replace('title = "A package __init__"\n',
                                           'title = "A package __init__"\nwhen = { quantization = "fp8" }\n'))
    profile = box.tmp / "profile.toml"
    profile.write_text('quantization = "fp8"\n')
    box.apply(SNDR_PROFILE=str(profile))
    _warm_fast_path(box, SNDR_PROFILE=profile)
    _fifo_at(profile)
    proc = _verify(box, SNDR_PROFILE=profile)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out and str(profile) in out and "not a regular file" in out, out


@pytest.mark.parametrize("strict", ["0", "1"])
def test_register_never_hangs_on_a_fifo_ledger(applied_box, strict):
    """``register()`` runs in every vLLM process: a FIFO ledger is a problem it names, never a hang; under
    SNDR_STRICT=1 it aborts startup."""
    from tests.hook_fixtures import out_of

    box = applied_box
    box.apply()
    _fifo_at(box.root / ".sndr" / "ledger.json")
    code = """
        import json
        import sndr.startup.hook as h
        try:
            h.register()
            print("OUT" + json.dumps({"missing": h._STATE.missing, "problems": h._STATE.problems}))
        except Exception as exc:
            print("OUT" + json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
    """
    proc = subprocess.run([sys.executable, "-c", __import__("textwrap").dedent(code)], capture_output=True, text=True,
                          timeout=60, env=box.environ(SNDR_STRICT=strict), cwd=str(box.tmp))
    out = out_of(proc)
    if strict == "1":
        assert out["raised"] == "StrictError" and "ledger" in out["message"], out
    else:
        assert any("not a regular file" in p for p in out["problems"]), out
        assert any(m.startswith("ledger:") for m in out["missing"]), out


# ----------------------------------------------------------------------------- 4. tracebacks and exit 3


def _reseal_ledger(box, mutate: Callable[[dict], None]) -> Path:
    import hashlib
    import json

    from sndr.state import canonical_json
    from tests.hook_fixtures import replace_file

    path = box.root / ".sndr" / "ledger.json"
    led = json.loads(path.read_text())
    mutate(led)
    body = {k: v for k, v in led.items() if k != "checksum"}
    led["checksum"] = hashlib.sha256(canonical_json(body).encode()).hexdigest()
    replace_file(path, json.dumps(led))
    return path


def _one_clean_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == code and "Traceback" not in out, out
    for n in needles:
        assert n in out, (n, out)
    return out


@pytest.mark.parametrize("rel", ["vllm/a\x00b.py", "vllm/" + "a" * 300 + ".py"])
def test_ledger_naming_a_nul_or_overlong_path_is_bad_input_not_a_traceback(applied_box, rel):
    """A ledger with a valid checksum that names a path with a NUL byte, or a 300-character name: the warm
    fast path and the full verifier answer with one line naming the ledger (exit 2), never a traceback."""
    box = applied_box
    box.apply()
    _warm_fast_path(box)
    entry = {"pristine_sha256": "0" * 64, "patched_sha256": "1" * 64, "patches": ["F0001"], "created": False}
    ledger = _reseal_ledger(box, lambda led: led["files"].__setitem__(rel, entry))
    proc = _verify(box)
    if "\x00" in rel:
        _one_clean_line(proc, 2, str(ledger), "ledger_corrupt", "NUL")
    else:
        _one_clean_line(proc, 2, "a" * 40)


def test_journal_naming_a_nul_path_is_bad_input(applied_box):
    import json

    box = applied_box
    box.apply()
    journal = box.root / ".sndr" / "journal.json"
    journal.write_text(json.dumps({"files": [{"path": "vllm/a\x00b.py", "before": None, "after": None}]}))
    _one_clean_line(_verify(box), 2, str(journal), "journal_corrupt")


def test_verify_fast_path_on_a_symlink_loop_target_is_not_a_traceback(applied_box):
    box = applied_box
    box.apply()
    _warm_fast_path(box)
    target = box.root / "vllm" / "engine.py"
    target.unlink()
    target.symlink_to(target.name)  # a loop: open() raises ELOOP
    out = _one_clean_line(_verify(box), 2, "vllm/engine.py")
    assert "ok  enabled set" not in out


def test_big_integers_in_json_inputs_are_bad_input(tmp_path):
    """``sync decide --queue`` and ``pin advance --preflight`` on a 5,000-digit integer: Python's int
    max-str-digits ValueError was a traceback and exit 3."""
    big = tmp_path / "big.json"
    big.write_text('{"format": ' + "9" * 5000 + "}")
    _one_clean_line(_run_sndr("sync", "decide", "abcdef1", "--queue", str(big), "--tier", "IGNORE"), 2,
                    str(big), "bad_json", "4300 digits")
    from sndr.errors import SndrError
    from sndr.upstream.triggers import load_preflight

    with pytest.raises(SndrError) as info:
        load_preflight(big)
    assert info.value.problems[0].code == "bad_json" and info.value.problems[0].file == str(big)
    from sndr.upstream.pin import load_queue

    with pytest.raises(SndrError, match="bad_json"):
        load_queue(big)


def test_a_created_file_of_200000_unary_minus_signs_is_a_compile_error(tmp_path, pin_subtree):
    from .test_bad_input import FILES

    tree = pin_subtree(FILES)
    pdir = tmp_path / "p"
    pdir.mkdir()
    (pdir / "PB0001-x.toml").write_text('id = "PB0001"\ntitle = "minus"\n\n[[files]]\npath = "vllm/minus.py"\n'
                                        "create = '''\nx = " + "-" * 200_000 + "1\n'''\n")
    proc = _run_sndr("apply", "--dry-run", "--tree", str(tree), "--patches", str(pdir), timeout=120)
    _one_clean_line(proc, 2, "vllm/minus.py", "compile_error", "nested too deeply")


def test_a_damaged_line_index_is_rebuilt_not_an_index_error(tmp_path, capsys):
    import sqlite3

    from sndr.preflight import lineindex

    texts = {"a.py": "import os\nvalue = compute_the_thing()\n", "b.py": "import os\n"}
    monkey_open = dict(lineindex._OPEN)
    lineindex._OPEN.clear()
    try:
        idx = lineindex.tree_index("e" * 64, lambda: sorted(texts), texts.get, root=tmp_path)
        assert idx is not None and idx.lookup(["value = compute_the_thing()"]) == {
            "value = compute_the_thing()": ["a.py"]}
        idx.close()
        lineindex._OPEN.clear()
        db = sqlite3.connect(idx.path)  # damaged but valid SQLite: an id past the file list
        db.execute("UPDATE lines SET ids = '7' WHERE line = 'value = compute_the_thing()'")
        db.commit()
        db.close()
        idx = lineindex.tree_index("e" * 64, lambda: sorted(texts), texts.get, root=tmp_path)
        assert idx is not None
        assert idx.lookup(["value = compute_the_thing()"]) == {"value = compute_the_thing()": []}
        assert "the line index is damaged" in capsys.readouterr().err and not idx.path.exists()
        lineindex._OPEN.clear()
        idx = lineindex.tree_index("e" * 64, lambda: sorted(texts), texts.get, root=tmp_path)  # rebuilt
        assert idx is not None and idx.lookup(["value = compute_the_thing()"])["value = compute_the_thing()"] == [
            "a.py"]
    finally:
        lineindex._OPEN.clear()
        lineindex._OPEN.update(monkey_open)


# ----------------------------------------------------------------------------- LOW: load time, usage errors


def test_runtime_patch_with_a_module_outside_sndr_is_refused_at_load_time(tmp_path, pin_subtree):
    """apply and --verify said ok for a runtime patch whose code lies outside sndr; only startup refused it."""
    from .test_bad_input import FILES

    tree = pin_subtree(FILES)
    pdir = tmp_path / "p"
    pdir.mkdir()
    (pdir / "PR0001-evil.toml").write_text('id = "PR0001"\ntitle = "outside"\nkind = "runtime"\n\n[[runtime]]\n'
                                           'name = "r"\ntarget = "vllm.v1.core.block_pool:BlockPool.get_num_free_blocks"\n'
                                           'replacement = "os:getcwd"\n')
    for extra in (["--dry-run"], ["--verify"]):
        proc = _run_sndr("apply", "--tree", str(tree), "--patches", str(pdir), *extra)
        _one_clean_line(proc, 2, f"{pdir / 'PR0001-evil.toml'}:8", "module_outside", "os")


@pytest.mark.parametrize("argv", [["apply", "--json", "-", "--no-such-option"],
                                  ["sync", "plan", "--json=-", "--no-such-option"],
                                  ["vendor", "--json", "-", "--no-such-option"],
                                  ["preflight", "--json", "-", "--no-such-option"]])
def test_usage_error_with_json_stdout_still_writes_one_json_document(argv):
    import json

    proc = _run_sndr(*argv)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "usage:" in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2 and doc["problems"][0]["code"] == "usage"
    assert "--no-such-option" in doc["problems"][0]["message"] or "required" in doc["problems"][0]["message"]


def test_files_edited_in_place_go_through_the_output_writer(tmp_path):
    """The decisions file (``sync decide``), the pin record (``pin advance --pin-file``): a symlink or a FIFO
    there is refused with exit 2, never replaced or written through."""
    real = tmp_path / "real.yaml"
    _one_clean_line(_run_sndr("sync", "decide", "abcdef1" * 5 + "abcde", "--decisions", str(real), "--tier", "IGNORE"), 0)
    before = real.read_text()
    link = tmp_path / "decisions.yaml"
    link.symlink_to(real)
    proc = _run_sndr("sync", "decide", "abcdef2" * 5 + "abcde", "--decisions", str(link), "--tier", "IGNORE")
    _one_clean_line(proc, 2, str(link), "output_refused", "symlink")
    assert real.read_text() == before and _kind(link) == "link"
    fifo = tmp_path / "pin.toml"
    os.mkfifo(fifo)
    proc = _run_sndr("pin", "advance", "--to", "0.33.0", "--pin-file", str(fifo), "--patches", str(REPO / "patches"),
                     "--no-benchmark-ref", "test")
    _one_clean_line(proc, 2, str(fifo), "output_refused", "FIFO")
    assert _kind(fifo) == "fifo"
