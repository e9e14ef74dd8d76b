"""Issue 33: hostile journals. Recovery resolves every journal path like the commit does (inside
the tree, no symlink on the way, directories through held fds), and refuses a journal larger
than any sndr writes before spending time on it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sndr import commit as commit_mod
from sndr.errors import SndrError

from .test_bad_input import FILE, FILES, snapshot
from .test_hardening import _assert_clean_error, _cli, _patches, _two_files


def _outside(tmp_path: Path) -> dict[str, bool]:
    out = tmp_path / "outside"
    return {name: (out / name).is_dir() for name in ("victim", "new", "deep")}


def _plant(tree: Path, files: list[dict]) -> None:
    (tree / ".sndr/journal.json").write_text(json.dumps({"format": 1, "digest": "f" * 64, "ledger_before": None,
                                                         "created_dirs_before": [], "files": files}))


@pytest.mark.parametrize("case", ["mkdirs_not_a_parent", "rmdirs_not_a_parent", "mkdirs_through_link",
                                  "rmdirs_through_link", "file_through_link"])
def test_a_journal_through_an_in_tree_symlink_changes_nothing_outside(tmp_path, pin_subtree, case):
    tree = pin_subtree(FILES)
    pdir = _patches(tmp_path, _two_files())
    assert _cli(tree, pdir)[0] == 0
    outside = tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / "keep.txt").write_text("not sndr's\n")
    (outside / "victim" / "keep.txt").unlink()  # empty: an rmdir would succeed
    (tree / "vllm/lnk").symlink_to(outside)
    obj = commit_mod.sha256_bytes((tree / FILE).read_bytes())  # stored: the patched bytes are an object too
    (tree / ".sndr/objects" / obj).write_bytes((tree / FILE).read_bytes())
    files = {
        # what the attack planted: directories that have nothing to do with the file
        "mkdirs_not_a_parent": [{"path": "vllm/gone.py", "before": None, "after": None,
                                 "mkdirs": ["vllm/lnk/victim"]}],
        "rmdirs_not_a_parent": [{"path": FILE, "before": obj, "after": None, "rmdirs": ["vllm/lnk/new"]}],
        # parents of the file, but the file lies behind the link
        "mkdirs_through_link": [{"path": "vllm/lnk/victim/f.py", "before": None, "after": None,
                                 "mkdirs": ["vllm/lnk", "vllm/lnk/victim"]}],
        "rmdirs_through_link": [{"path": "vllm/lnk/new/deep/f.py", "before": obj, "after": None,
                                 "rmdirs": ["vllm/lnk/new", "vllm/lnk/new/deep"]}],
        "file_through_link": [{"path": "vllm/lnk/victim/x.py", "before": None, "after": None}],
    }[case]
    _plant(tree, files)
    before, out_before = snapshot(tree), _outside(tmp_path)
    for args in (["--verify"], [], ["--revert"]):
        rc, text = _cli(tree, pdir, *args)
        _assert_clean_error(rc, text, ".sndr/journal.json")
        assert any(f"({c})" in text for c in ("journal_corrupt", "symlink_refused", "path_escape")), text
        assert "vllm/lnk" in text, text  # the path is named
        assert _outside(tmp_path) == out_before, f"{case} {args}: a directory outside the tree changed"
        assert snapshot(tree) == before
    assert (tree / ".sndr/journal.json").exists()  # kept for inspection


def test_tree_dirs_are_made_and_removed_through_held_fds_never_through_a_link(tmp_path, pin_subtree):
    """The fd walk itself (what stays true if a link is swapped in after the journal was checked)."""
    tree_path = pin_subtree(FILES)
    tree = commit_mod.TreeRoot(tree_path)
    outside = tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    (tree_path / "vllm/lnk").symlink_to(outside)
    for rel, op in (("vllm/lnk/new", "mkdir"), ("vllm/lnk/victim", "rmdir"), ("vllm/lnk/victim/x", "mkdir")):
        with pytest.raises(SndrError) as info:
            commit_mod._tree_dir(tree, rel, op, named="journal")
        assert info.value.problems[0].code == "symlink_refused" and "vllm/lnk" in info.value.problems[0].message
    with pytest.raises(SndrError):
        commit_mod._tree_dir(tree, "vllm/lnk", "mkdir")  # the final name is a link: refused
    assert commit_mod._tree_dir(tree, "vllm/lnk", "rmdir") is False  # unlinkat(AT_REMOVEDIR) never follows it
    assert (tree_path / "vllm/lnk").is_symlink() and (outside / "victim").is_dir()
    assert not (outside / "new").exists()
    (tree_path / "vllm/made").mkdir()
    assert commit_mod._tree_dir(tree, "vllm/made/here", "mkdir") and (tree_path / "vllm/made/here").is_dir()
    assert commit_mod._tree_dir(tree, "vllm/made/here", "rmdir") and not (tree_path / "vllm/made/here").exists()


@pytest.mark.parametrize("how", ["entries", "bytes"])
def test_an_oversized_journal_is_refused_at_once_with_a_salvage_hint(tmp_path, pin_subtree, how):
    """The issue's journal: 200,000 entries, 12 MB, cost 69 s of CPU on the next command."""
    tree = pin_subtree(FILES)
    pdir = _patches(tmp_path, _two_files())
    assert _cli(tree, pdir)[0] == 0
    n = 200_000 if how == "bytes" else commit_mod.MAX_JOURNAL_FILES + 1
    files = [{"path": f"vllm/f{i}.py", "before": None, "after": None} for i in range(n)]
    _plant(tree, files)
    size = (tree / ".sndr/journal.json").stat().st_size
    assert (size > commit_mod.MAX_JOURNAL_BYTES) == (how == "bytes")
    before = snapshot(tree)
    for args in (["--verify"], [], ["--revert"]):
        t0 = time.monotonic()
        rc, text = _cli(tree, pdir, *args)
        took = time.monotonic() - t0
        _assert_clean_error(rc, text, ".sndr/journal.json", "(journal_too_large)", "sndr salvage-ledger")
        assert took < 15, f"{args}: {took:.1f} s (the issue's journal cost 69 s of CPU)"
        assert snapshot(tree) == before


def test_a_commit_larger_than_the_journal_bound_is_refused_before_writing(tmp_path, pin_subtree):
    tree = commit_mod.TreeRoot(pin_subtree(FILES))
    writes = [commit_mod.FileWrite(f"vllm/f{i}.py", None, b"x = 1\n") for i in range(commit_mod.MAX_JOURNAL_FILES + 1)]
    with pytest.raises(SndrError) as info:
        commit_mod.commit(tree, writes, None, "f" * 64)
    assert info.value.problems[0].code == "journal_too_large"
    assert not (tree.root / ".sndr").exists()
