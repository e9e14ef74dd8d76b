"""Tree views on real vLLM releases: every kind must see the same files and digest."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from sndr import env
from sndr.errors import SndrError
from sndr.tree import (
    DirTree,
    GitTree,
    WheelTree,
    directory,
    fetch_version,
    find_installed_root,
    open_tree,
)
from sndr.treeview import describe_version
from tests.conftest import CANDIDATE, PIN, copy_tree

VERSIONS = [PIN, CANDIDATE]
SAMPLE = "vllm/v1/core/kv_cache_utils.py"


def _wheel(version: str) -> Path:
    found = sorted((env.cache_root() / env.CACHE_WHEELS).glob(f"vllm-{version}-*.whl"))
    if not found:
        where = env.cache_root() / env.CACHE_WHEELS
        pytest.skip(f"no_cached_wheel: no vllm {version} wheel in {where} (fetching a tree deletes it once "
                    f"extracted); to run this test: {sys.executable} -m pip download --no-deps "
                    f"--only-binary=:all: vllm=={version} -d {where}")
    return found[0]


def _floor_digest(root: Path) -> str:
    """The digest spelled out independently of sndr.tree: guards the formula itself."""
    rels = sorted(p.relative_to(root).as_posix() for p in (root / "vllm").rglob("*.py"))
    outer = hashlib.sha256()
    for rel in rels:
        outer.update(f"{rel}\0{hashlib.sha256((root / rel).read_bytes()).hexdigest()}\n".encode())
    return outer.hexdigest()


def _git(repo: Path, *args: str) -> str:
    env_ = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env_).stdout


@pytest.fixture(scope="module")
def git_repo(tmp_path_factory, vllm_pin_root, vllm_candidate_root) -> Path:
    """A checkout whose history is the real 0.32.0 then 0.33.0 sources, tagged like upstream."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path_factory.mktemp("vllm-git")
    _git(repo, "init", "-q", "-b", "main")
    for version, root in ((PIN, vllm_pin_root), (CANDIDATE, vllm_candidate_root)):
        shutil.rmtree(repo / "vllm", ignore_errors=True)
        shutil.copytree(root / "vllm", repo / "vllm")
        _git(repo, "add", "-A", "vllm")
        _git(repo, "commit", "-q", "-m", f"vllm {version}")
        _git(repo, "tag", f"v{version}")
    # A checkout does not carry the generated _version.py: version then comes from git describe.
    _git(repo, "rm", "-q", "vllm/_version.py")
    _git(repo, "commit", "-q", "-m", "drop generated _version.py")
    return repo


# ----------------------------------------------------------------------------- agreement across kinds


@pytest.mark.parametrize("version", VERSIONS)
def test_views_agree_on_files_and_digest(version, vllm_root, git_repo):
    root = vllm_root(version)
    views = [
        open_tree(root),
        open_tree(str(root / "vllm")),
        open_tree(f"vllm=={version}"),
        open_tree(str(_wheel(version))),
        open_tree(f"git:{git_repo}@v{version}"),
    ]
    assert [v.kind for v in views] == ["dir", "dir", "version", "wheel", "git"]
    reference = views[0]
    assert reference.files()[0].startswith("vllm/") and SAMPLE in reference.files()
    for view in views[1:]:
        assert view.files() == reference.files(), view
        assert view.digest == reference.digest, view
        assert view.version == version, view
        assert view.read_bytes(SAMPLE) == reference.read_bytes(SAMPLE)
    assert reference.digest == _floor_digest(root)
    for view in views:
        view.close()


def test_pin_and_candidate_digests_differ(vllm_pin_root, vllm_candidate_root):
    assert open_tree(vllm_pin_root).digest != open_tree(vllm_candidate_root).digest


def test_roots(vllm_pin_root):
    assert open_tree(vllm_pin_root).root == vllm_pin_root.resolve()
    assert open_tree(str(vllm_pin_root / "vllm")).root == vllm_pin_root.resolve()
    assert open_tree(f"vllm=={PIN}").root == vllm_pin_root
    assert open_tree(_wheel(PIN)).root is None


# ----------------------------------------------------------------------------- version


@pytest.mark.parametrize("version", ["0.10.1", PIN, CANDIDATE])
def test_version_from_metadata(version, vllm_root):
    tree = open_tree(vllm_root(version))
    assert tree.version == version
    assert tree.metadata() is not None and "Requires-Dist:" in tree.metadata()
    with WheelTree(_wheel(version)) as wheel:
        assert wheel.version == version
        assert "Requires-Dist:" in wheel.metadata()


@pytest.mark.parametrize("version", ["0.10.1", PIN, CANDIDATE])
def test_version_without_dist_info(version, vllm_root, tmp_path):
    site = copy_tree(vllm_root(version), tmp_path / "site", [SAMPLE])
    for info in site.glob("*.dist-info"):
        shutil.rmtree(info)
    tree = open_tree(site)
    assert tree.metadata() is None
    assert tree.version == version
    assert tree.files() == sorted(tree.files()) and SAMPLE in tree.files()


def test_version_unknown_is_a_clear_error(vllm_pin_root, tmp_path):
    site = copy_tree(vllm_pin_root, tmp_path / "site", [SAMPLE])
    for info in site.glob("*.dist-info"):
        shutil.rmtree(info)
    (site / "vllm" / "_version.py").unlink()
    with pytest.raises(SndrError) as exc:
        _ = open_tree(site).version  # reading it raises
    assert exc.value.problems[0].code == "version_unknown"
    assert exc.value.exit_code == 2


def test_git_version_from_describe(git_repo):
    head = _git(git_repo, "rev-parse", "--short=7", "HEAD").strip()
    tree = open_tree(f"{git_repo}@HEAD")  # the plain REPO@REV form
    assert isinstance(tree, GitTree)
    assert not tree.exists("vllm/_version.py")
    assert Version(tree.version) > Version(CANDIDATE)
    assert tree.version.startswith("0.33.1.dev1+g") and head.startswith(tree.version.split("+g")[1][:7])
    assert open_tree(f"git:{git_repo}@v{CANDIDATE}").version == CANDIDATE
    assert open_tree(f"git:{git_repo}").commit == _git(git_repo, "rev-parse", "HEAD").strip()


@pytest.mark.parametrize(
    "describe,expected",
    [
        ("v0.33.0-0-g4ba787e", "0.33.0"),
        ("v0.33.0-12-g4ba787e", "0.33.1.dev12+g4ba787e"),
        ("v0.11.0rc2-3-gabc1234", "0.11.0rc2.dev3+gabc1234"),
        ("not-a-version", None),
    ],
)
def test_describe_version(describe, expected):
    assert describe_version(describe) == expected


# ----------------------------------------------------------------------------- reading


def test_read_any_file_and_missing(vllm_candidate_root):
    meta = f"vllm-{CANDIDATE}.dist-info/METADATA"
    with open_tree(vllm_candidate_root) as d, open_tree(_wheel(CANDIDATE)) as w:
        for tree in (d, w):
            assert tree.read_bytes(meta).startswith(b"Metadata-Version")
            assert tree.exists(meta) and tree.exists(SAMPLE)
            assert tree.read_bytes("vllm/no_such_module.py") is None
            assert not tree.exists("vllm/no_such_module.py")
            assert tree.read_text("vllm/no_such_module.py") is None
            assert "def " in tree.read_text(SAMPLE)
            with pytest.raises(SndrError) as exc:
                tree.read_bytes("../etc/passwd")
            assert exc.value.problems[0].code == "bad_path"


def test_git_reads_single_files_and_non_python(git_repo, vllm_pin_root):
    tree = open_tree(f"git:{git_repo}@v{PIN}")
    assert tree.read_bytes(SAMPLE) == (vllm_pin_root / SAMPLE).read_bytes()
    assert tree.read_bytes("vllm/no_such_module.py") is None
    assert tree.read_bytes("vllm/v1") is None  # a tree object, not a file
    assert tree.read_bytes(SAMPLE) == (vllm_pin_root / SAMPLE).read_bytes()  # process still in step
    tree.close()


def test_read_text_rejects_bad_utf8(pin_subtree):
    site = pin_subtree([SAMPLE])
    path = site / SAMPLE
    data = path.read_bytes()
    path.write_bytes(data + b"# caf\xe9\n")
    with pytest.raises(SndrError) as exc:
        open_tree(site).read_text(SAMPLE)
    problem = exc.value.problems[0]
    assert (problem.code, problem.file) == ("not_utf8", SAMPLE)
    assert problem.line == data.count(b"\n") + 1


def test_dir_files_follow_the_disk(pin_subtree):
    """Commit writes into dir trees: a created file must show up without reopening."""
    site = pin_subtree([SAMPLE])
    tree = open_tree(site)
    before = tree.files()
    (site / "vllm" / "v1" / "core" / "new_module.py").write_text("x = 1\n")
    (site / "vllm" / "v1" / "core" / "__pycache__").mkdir(exist_ok=True)
    assert tree.files() == sorted(before + ["vllm/v1/core/new_module.py"])


# ----------------------------------------------------------------------------- bad specs


@pytest.mark.parametrize(
    "make,code",
    [
        (lambda p: str(p / "missing"), "tree_not_found"),
        (lambda p: str(p), "no_vllm"),
        (lambda p: str((p / "notes.txt").write_text("x") and p / "notes.txt"), "bad_tree_spec"),
        (lambda p: "vllm>=0.32", "bad_tree_spec"),
        (lambda p: "vllm==not.a.version", "bad_version"),
        (lambda p: f"git:{p}@HEAD", "not_git"),
        (lambda p: "", "bad_tree_spec"),
    ],
)
def test_bad_specs_exit_2(make, code, tmp_path):
    with pytest.raises(SndrError) as exc:
        open_tree(make(tmp_path))
    assert exc.value.exit_code == 2
    assert exc.value.problems[0].code == code


def _not_dirs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """A path of every kind that is not a directory, and how the error names it."""
    import socket

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    whl_fifo = tmp_path / "x.whl"
    os.mkfifo(whl_fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    sock = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    plain = tmp_path / "notes.txt"
    plain.write_text("x")
    return {"fifo": (fifo, "a FIFO"), "fifo named .whl": (whl_fifo, "a FIFO"),
            "symlink to a fifo": (link, f"a symlink to {fifo}, which is a FIFO"),
            "socket": (sock, "a socket"), "device": (Path("/dev/null"), "a character device"),
            "regular file": (plain, "a regular file")}


def test_a_tree_that_is_not_a_directory_is_named_as_what_it_is(pin_subtree, tmp_path, capsys):
    """``--tree FIFO`` said "fifo does not contain a vllm/ package" (no_vllm) in every reading command, and "fifo is
    a file, not a directory" in apply, verify, revert, status, gc: a FIFO, a device or a socket is not a file you
    could have meant. Tree resolution names the kind (bad_tree_spec, registered, exit 2), for the reading view
    (open_tree) and the directory a writing command uses (directory) alike, through a symlink too; and a real
    tree still opens."""
    from sndr.__main__ import main
    from sndr.errors import CODES

    site = pin_subtree(["vllm/v1/core/block_pool.py"])
    assert open_tree(str(site)).root == site.resolve() and directory(str(site), dry_run=False) == site
    assert "bad_tree_spec" in CODES
    for name, (path, kind) in _not_dirs(tmp_path).items():
        for resolve, tail in ((open_tree, "not a directory that contains vllm/ or a .whl file"),
                              (lambda spec: directory(spec, dry_run=True), "not a directory")):
            with pytest.raises(SndrError) as exc:
                resolve(str(path))
            p = exc.value.problems[0]
            assert (p.code, p.file, exc.value.exit_code) == ("bad_tree_spec", str(path), 2), (name, p)
            assert p.message == f"{path} is {kind}, {tail}", (name, p.message)
        for argv in (["list", "--tree", str(path)], ["apply", "--dry-run", "--tree", str(path)]):
            assert main(argv) == 2, (name, argv)
            err = capsys.readouterr().err
            assert f"{path} is {kind}, not a directory" in err and "(bad_tree_spec)" in err, (name, err)
            assert "does not contain a vllm/ package" not in err and "Traceback" not in err, (name, err)


def test_a_git_spec_names_what_its_repo_is(tmp_path):
    """``git:FIFO@REV`` said "no directory before '@'" (tree_not_found) for a path that is there: it names the kind,
    as ``--tree FIFO`` does (bad_tree_spec); a path that is not there stays tree_not_found, named."""
    for name, (path, kind) in _not_dirs(tmp_path).items():
        for spec in (f"git:{path}@main", f"git:{path}", f"git:{path}@a@b"):
            with pytest.raises(SndrError) as exc:
                open_tree(spec)
            p = exc.value.problems[0]
            assert (p.code, exc.value.exit_code) == ("bad_tree_spec", 2), (name, spec, p)
            assert p.message == f"{spec!r}: {path} is {kind}, not a directory", (name, p.message)
    for spec, msg in ((f"git:{tmp_path}/gone@main", f"no directory before '@' ({tmp_path}/gone does not exist)"),
                      (f"git:{tmp_path}/dangling@v1", f"{tmp_path}/dangling is a symlink to {tmp_path}/nowhere, "
                                                       "which does not exist")):
        (tmp_path / "dangling").unlink(missing_ok=True)
        (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
        with pytest.raises(SndrError) as exc:
            open_tree(spec)
        assert (exc.value.problems[0].code, exc.value.problems[0].message) == ("tree_not_found", f"{spec!r}: {msg}")


def test_bare_version_hints_the_spec():
    with pytest.raises(SndrError) as exc:
        open_tree(CANDIDATE)
    assert exc.value.problems[0].hint == f"did you mean vllm=={CANDIDATE}?"


def test_unknown_git_revision(git_repo):
    with pytest.raises(SndrError) as exc:
        open_tree(f"git:{git_repo}@no-such-branch")
    assert exc.value.problems[0].code == "git_rev_not_found"


# ----------------------------------------------------------------------------- fetch_version


def test_fetch_reuses_complete_tree_offline(monkeypatch, vllm_candidate_root):
    monkeypatch.setenv(env.OFFLINE, "1")
    assert fetch_version(CANDIDATE) == vllm_candidate_root
    assert fetch_version(f"vllm=={CANDIDATE}") == vllm_candidate_root
    assert fetch_version("0.33") == vllm_candidate_root  # PEP 440 equality, not string equality


def test_fetch_extracts_cached_wheel_offline(monkeypatch, tmp_path, vllm_root):
    """A cache holding only the wheel yields a whole tree, same digest, no network."""
    version = "0.10.1"
    reference = vllm_root(version)
    wheel = _wheel(version)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / wheel.name).symlink_to(wheel)
    monkeypatch.setenv(env.CACHE_DIR, str(tmp_path))
    monkeypatch.setenv(env.OFFLINE, "1")
    root = fetch_version(version)
    assert root == tmp_path / "trees" / f"vllm-{version}"
    assert (root / ".complete").read_text().strip() == wheel.name
    assert not list((tmp_path / "trees").glob("*.tmp"))
    assert open_tree(root).digest == open_tree(reference).digest
    assert (root / f"vllm-{version}.dist-info" / "entry_points.txt").is_file()
    assert fetch_version(version) == root
    # Only the .py files stay in the cache: the wheel is gone once extracted (its source is untouched).
    assert list((tmp_path / "wheels").iterdir()) == [] and wheel.is_file()


def test_download_shows_what_it_fetches_and_its_size(tmp_path, capfd):
    """pip names the wheel and its size; sndr repeats both on stderr while it downloads (rich progress)."""
    from sndr.tree_release import _pip_with_progress

    dest = tmp_path / "dl"
    dest.mkdir()
    fake_pip = ("import sys, pathlib, time; "
                "print('Collecting vllm==0.0.1'); "
                "print('  Downloading https://files.example/vllm-0.0.1-py3-none-any.whl (312.4 MB)', flush=True); "
                f"pathlib.Path({str(dest)!r}, 'vllm-0.0.1-py3-none-any.whl').write_bytes(b'x' * 1000); "
                "time.sleep(0.6); print('Saved'); sys.stderr.write('pip warning\\n')")
    code, out, err = _pip_with_progress([sys.executable, "-c", fake_pip, str(dest)], "0.0.1", tmp_path)
    assert code == 0 and "Saved" in out and "pip warning" in err
    shown = capfd.readouterr().err
    assert "fetching vllm==0.0.1" in shown and "only its .py files are kept" in shown
    assert "downloading vllm-0.0.1-py3-none-any.whl (312.4 MB)" in shown


def test_parallel_fetches_extract_once(tmp_path, vllm_root):
    """Two processes racing on an empty tree cache: the lock makes one extract, both get a whole tree."""
    version = "0.10.1"
    wheel = _wheel(version)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / wheel.name).symlink_to(wheel)
    env_ = {**os.environ, env.CACHE_DIR: str(tmp_path), env.OFFLINE: "1"}
    code = f"from sndr.tree import fetch_version, open_tree; r = fetch_version({version!r}); print(r, open_tree(r).digest)"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env_, cwd=Path(__file__).resolve().parent.parent,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    expected = f"{tmp_path / 'trees' / f'vllm-{version}'} {open_tree(vllm_root(version)).digest}"
    assert [o.strip() for o, _ in outs] == [expected, expected]
    assert sorted(p.name for p in (tmp_path / "trees").iterdir()) == [f"vllm-{version}"]


def test_fetch_offline_miss(monkeypatch, tmp_path):
    monkeypatch.setenv(env.CACHE_DIR, str(tmp_path))
    monkeypatch.setenv(env.OFFLINE, "1")
    with pytest.raises(SndrError) as exc:
        fetch_version("0.33.0")
    assert exc.value.problems[0].code == "offline"


@pytest.mark.skipif(os.environ.get(env.OFFLINE) == "1", reason="needs the package registry (SNDR_OFFLINE=1)")
def test_fetch_nonexistent_version(monkeypatch, tmp_path):
    monkeypatch.setenv(env.CACHE_DIR, str(tmp_path))
    with pytest.raises(SndrError) as exc:
        open_tree("vllm==0.0.999")
    problem = exc.value.problems[0]
    if problem.code == "fetch_failed":
        pytest.skip(f"package registry unreachable: {problem.message}")
    assert problem.code == "version_not_found"
    assert "0.0.999" in problem.message
    assert exc.value.exit_code == 2
    assert "Traceback" not in exc.value.render()
    assert not list((tmp_path / "wheels").glob("*"))


# ----------------------------------------------------------------------------- installed


def _venv_with_vllm(tmp_path: Path, source: Path | None) -> tuple[Path, Path]:
    """A real venv; with ``source``, a copy of a few real vLLM files in its site-packages."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    if source is not None:
        shutil.rmtree(site)
        copy_tree(source, site, [SAMPLE, "vllm/v1/__init__.py", "vllm/v1/core/__init__.py"])
    return python, site


def test_find_installed_root_in_a_venv(tmp_path, monkeypatch, vllm_pin_root):
    python, site = _venv_with_vllm(tmp_path, vllm_pin_root)
    # A vllm/ in the caller's cwd must not shadow the install.
    shutil.copytree(vllm_pin_root / "vllm" / "v1" / "core", tmp_path / "cwd" / "vllm")
    monkeypatch.chdir(tmp_path / "cwd")
    assert find_installed_root(str(python)) == site
    tree = open_tree(f"installed:{python}")
    assert (tree.kind, tree.root) == ("installed", site)
    assert tree.version == PIN
    assert SAMPLE in tree.files()
    assert open_tree(f"installed:{tmp_path / 'venv'}").root == site  # a venv dir works too


def test_find_installed_root_missing(tmp_path):
    python, _ = _venv_with_vllm(tmp_path, None)
    with pytest.raises(SndrError) as exc:
        find_installed_root(str(python))
    assert exc.value.problems[0].code == "vllm_not_found"
    with pytest.raises(SndrError) as exc:
        find_installed_root(str(tmp_path / "no-python"))
    assert exc.value.problems[0].code == "python_not_found"


@pytest.mark.vllm_install
def test_real_vllm_install(tmp_path):
    python = env.vllm_test_python()  # the venv .ci/run builds
    if not Path(python).exists():
        pytest.skip(f"no_vllm_install: no Python at {python} (set {env.TEST_VLLM_PYTHON}; .ci/run builds "
                    f"{env.DEFAULT_TEST_VLLM_PYTHON}: {env.TEST_VLLM_BUILD})")
    probe = subprocess.run([python, "-c", "import importlib.util; print(importlib.util.find_spec('vllm') is not None)"],
                           capture_output=True, text=True)
    if probe.stdout.strip() != "True":
        pytest.skip(f"{python} has no vllm yet (install still in progress?)")
    root = find_installed_root(python)
    assert (root / "vllm" / "__init__.py").is_file()
    tree = open_tree(f"installed:{python}")
    assert isinstance(tree, DirTree) and tree.kind == "installed"
    assert Version(tree.version).base_version == PIN
    assert SAMPLE in tree.files()
    # Installed from the same release wheel: a fourth view with the same content digest. The install
    # may carry sndr patches (someone ran python -m sndr.apply on it): compare a reverted copy of its
    # sources, never the install itself.
    copy = tmp_path / "site"
    shutil.copytree(root / "vllm", copy / "vllm", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.so.*"),
                    symlinks=True)
    for info in root.glob("vllm-*.dist-info"):
        shutil.copytree(info, copy / info.name)
    if (root / ".sndr").is_dir():
        from sndr.apply import run_revert

        shutil.copytree(root / ".sndr", copy / ".sndr")
        assert run_revert(copy).ok
    assert open_tree(copy).digest == open_tree(f"vllm=={PIN}").digest
