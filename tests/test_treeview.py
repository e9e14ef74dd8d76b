"""PristineView, the one "read a patched tree as pristine": apply, ``sndr list`` and the preflight agree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sndr.apply import run_apply
from sndr.commit import TreeRoot
from sndr.listing import _sndr_state
from sndr.load import load_patch_set
from sndr.preflight.snapshot import Snapshot
from sndr.tree import open_tree
from sndr.treeview import DirTree, PristineView
from tests.conftest import CORE_SET_FILES

REPO = Path(__file__).resolve().parents[1]
FILES = CORE_SET_FILES  # (tests/conftest.py)
CREATED = "vllm/sndr_probe.py"


@pytest.fixture
def patched(pin_subtree, tmp_path) -> tuple[Path, dict[str, bytes], str]:
    """A 0.32.0 subtree patched with the core test set plus a patch that creates a file;
    (root, every vllm/ file's bytes before the apply, the digest before)."""
    root = pin_subtree(FILES)
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "tests" / "data" / "core", patches)
    shutil.copy(REPO / "tests" / "data" / "preflight" / "bump_032_033" / "PF29-ship-a-probe-module.toml", patches)
    before = {rel: (root / rel).read_bytes() for rel in DirTree(root).files()}
    digest = DirTree(root).digest
    report = run_apply(root, load_patch_set(patches, packs=False))
    assert report.ok and CREATED in report.files_written, report
    return root, before, digest


def test_pristine_view_reads_the_tree_as_it_was(patched):
    root, before, digest = patched
    troot = TreeRoot(root)
    ledger = troot.read_ledger()
    assert ledger is not None and ledger.files[CREATED].created
    view = troot.pristine(ledger, base=open_tree(root))
    assert isinstance(view, PristineView)
    assert view.files() == sorted(before)  # the file sndr created is not upstream's
    assert view.read_bytes(CREATED) is None
    changed = [rel for rel in ledger.files if rel != CREATED]
    assert changed and all((root / rel).read_bytes() != before[rel] for rel in changed)  # the tree is patched
    assert all(view.read_bytes(rel) == before[rel] for rel in before)
    assert view.digest == digest
    assert view.version == troot.version == open_tree(root).version == "0.32.0"


def test_apply_listing_and_preflight_read_the_same_pristine(patched):
    root, before, digest = patched
    troot = TreeRoot(root)
    ledger = troot.read_ledger()
    apply_view = troot.pristine(ledger)  # apply's dry run and verify read through the TreeRoot itself
    reader, listed_ledger, held = _sndr_state(open_tree(root))
    assert listed_ledger is not None and held == set(ledger.files)
    snap = Snapshot(open_tree(root))
    assert snap.has_ledger and snap.digest == digest and snap.files() == sorted(before)
    for rel in sorted(before):
        text = before[rel].decode()
        assert apply_view.read_text(rel) == reader(rel) == snap.read_text(rel) == text, rel


def test_listing_reads_a_file_changed_since_as_it_is(patched):
    """``only``: a ledger file that no longer holds sndr's bytes is read as it is now (sndr list)."""
    root, before, _ = patched
    rel = FILES[-1]
    (root / rel).write_text("# edited by hand\n")
    reader, _, held = _sndr_state(open_tree(root))
    assert rel not in held
    assert reader(rel) == "# edited by hand\n"
    troot = TreeRoot(root)
    assert troot.pristine(troot.read_ledger()).read_bytes(rel) == before[rel]  # apply's view: every ledger file
