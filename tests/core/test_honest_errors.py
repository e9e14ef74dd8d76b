"""Bad input is an error that names the file (exit 2), never an empty or a silent result (issue 32
MEDIUM 3 and LOW items). Hermetic: the synthetic tree and patch set of ``tests/hook_fixtures.py``."""

from __future__ import annotations

import errno
import os

import pytest

from hook_fixtures import make_patches, make_tree, tree_bytes
from sndr.apply import cli_main


@pytest.fixture
def site(tmp_path):
    return make_tree(tmp_path / "site")


@pytest.fixture
def patches(tmp_path):
    return make_patches(tmp_path / "patches", only=["F0001", "F0002"])


def _apply(capsys, *args) -> tuple[int, str, str]:
    rc = cli_main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _deny_listing(monkeypatch, directory):
    """``scandir(directory)`` fails as it does for a user without r/x on it (root is never refused)."""
    import sndr.load as load

    real = os.scandir

    def scandir(path="."):
        if os.fspath(path) == os.fspath(directory):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(load.os, "scandir", scandir)


@pytest.mark.parametrize("extra", [[], ["--dry-run"], ["--allow-empty"], ["--verify"]])
def test_an_unreadable_patch_directory_is_an_error_naming_it(site, patches, monkeypatch, capsys, extra):
    """Was: "the patch set is empty ... pass --allow-empty", and --allow-empty then reverted every file."""
    assert _apply(capsys, "--patches", str(patches), "--tree", str(site))[0] == 0
    before = tree_bytes(site)
    _deny_listing(monkeypatch, patches)
    rc, out, err = _apply(capsys, "--patches", str(patches), "--tree", str(site), *extra)
    assert rc == 2, out + err
    assert f"{patches} [--patches]: cannot list the patch directory: Permission denied (unreadable)" in err
    assert "empty" not in err and "reverted" not in out
    assert tree_bytes(site) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root_reads_everything: root lists a mode-000 directory; the "
                                              "monkeypatched variant above covers it for root")
def test_an_unreadable_patch_directory_by_its_mode(site, patches, capsys):
    os.chmod(patches, 0)
    try:
        rc, _, err = _apply(capsys, "--patches", str(patches), "--tree", str(site))
    finally:
        os.chmod(patches, 0o755)
    assert rc == 2 and f"{patches}: cannot list the patch directory" in err


def test_patches_naming_a_file_says_so_and_names_its_directory(site, patches, capsys):
    one = patches / "F0001-answer.toml"
    rc, _, err = _apply(capsys, "--patches", str(one), "--tree", str(site))
    assert rc == 2
    assert f"{one} [--patches]: the patch directory is a file, not a directory (patches_not_a_dir)" in err
    assert f"--patches {patches}" in err and "does not exist" not in err


@pytest.mark.parametrize("mode", [[], ["--verify"], ["--revert"], ["--dry-run"]])
def test_a_tree_without_vllm_is_one_line_and_nothing_else(tmp_path, mode):
    """Was: the right one-line error, then ``Exception ignored in: TreeRoot.__del__ ... AttributeError``."""
    import subprocess
    import sys

    empty = tmp_path / "novllm"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "sndr.apply", "--tree", str(empty), *mode], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == f"sndr apply: {empty}: directory does not contain a vllm/ package (not_a_tree)"
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
