"""Apply re-checks every target against the ledger: a reinstall or a restore is patched again (issue 21 s.1).

Real vLLM 0.32.0 / 0.33.0 files; the real-reinstall-into-a-venv variant lives in
``tests/e2e/test_reinstall.py``.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import copy_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sndr.apply import run_apply, run_revert, run_verify
from sndr.load import load_patch_set

from .test_apply import DATA, FILES, vllm_hash


@pytest.fixture(scope="module")
def patch_set():
    return load_patch_set(DATA, packs=False)


@pytest.fixture
def tree(pin_subtree) -> Path:
    return pin_subtree(FILES)


def _restore(root: Path, pristine_root: Path, rels) -> None:
    """What `git checkout` or an image layer does: the pristine file put back (a new inode)."""
    for rel in rels:
        tmp = root / (rel + ".restore")
        shutil.copy2(pristine_root / rel, tmp)
        tmp.replace(root / rel)


def test_a_hand_restored_file_is_patched_again(tree, patch_set, vllm_pin_root):
    assert run_apply(tree, patch_set, environ={}).ok
    patched = vllm_hash(tree)
    _restore(tree, vllm_pin_root, [FILES[1]])
    assert not run_verify(tree, patch_set, environ={}).ok
    again = run_apply(tree, patch_set, environ={})
    assert again.ok and again.exit_code == 0
    assert again.files_written == [FILES[1]]
    assert any("back to pristine" in n for n in again.notes)
    assert not any("already applied" in n for n in again.notes)
    assert vllm_hash(tree) == patched
    assert run_verify(tree, patch_set, environ={}).ok
    # The ledger still knows the real pristine bytes: revert is byte-exact.
    assert run_revert(tree).ok
    assert all((tree / r).read_bytes() == (vllm_pin_root / r).read_bytes() for r in FILES)


def test_every_file_restored_is_patched_again_without_force(tree, patch_set, vllm_pin_root):
    assert run_apply(tree, patch_set, environ={}).ok
    patched = vllm_hash(tree)
    _restore(tree, vllm_pin_root, FILES)
    again = run_apply(tree, patch_set, environ={})
    assert again.ok and sorted(again.files_written) == sorted(FILES)
    assert vllm_hash(tree) == patched
    assert run_verify(tree, patch_set, environ={}).ok
    third = run_apply(tree, patch_set, environ={})  # and now the fast path is right to say so
    assert third.ok and third.files_written == [] and any("already applied" in n for n in third.notes)


def test_a_file_neither_pristine_nor_patched_is_still_refused(tree, patch_set):
    assert run_apply(tree, patch_set, environ={}).ok
    p = tree / FILES[0]
    p.write_text(p.read_text() + "\n# local hotfix\n")
    before = vllm_hash(tree)
    r = run_apply(tree, patch_set, environ={})
    assert not r.ok and r.exit_code == 1
    assert [(pr.code, pr.file) for pr in r.problems] == [("modified_since_apply", FILES[0])]
    assert "neither the pristine nor the patched" in r.problems[0].message
    assert vllm_hash(tree) == before


def _install_version(root: Path, src: Path) -> None:
    """Replace the target files and the dist-info with another version's, as `pip install -U` does."""
    for info in root.glob("vllm-*.dist-info"):
        shutil.rmtree(info)
    for info in src.glob("vllm-*.dist-info"):
        shutil.copytree(info, root / info.name)
    _restore(root, src, [r for r in FILES if (src / r).exists()])
    for rel in ("vllm/__init__.py", "vllm/version.py", "vllm/_version.py"):
        if (src / rel).exists():
            shutil.copy2(src / rel, root / rel)


def test_a_ledger_from_another_vllm_version_is_reported_and_replanned(tree, patch_set, vllm_candidate_root):
    assert run_apply(tree, patch_set, environ={}).ok
    _install_version(tree, vllm_candidate_root)  # an upgrade to 0.33.0 under the 0.32.0 ledger
    ver = run_verify(tree, patch_set, environ={})
    assert not ver.ok and "ledger_stale" in {p.code for p in ver.problems}
    fresh = copy_tree(vllm_candidate_root, Path(tempfile.mkdtemp(prefix="sndr-cand-")) / "site", FILES)
    expected = run_apply(fresh, patch_set, environ={})  # the same set on a never-touched 0.33.0
    r = run_apply(tree, patch_set, environ={})
    assert r.ok == expected.ok
    assert any(n.startswith("ledger_stale: the ledger was written for vLLM 0.32.0") for n in r.notes)
    assert vllm_hash(tree) == vllm_hash(fresh)
    if r.ok:
        assert run_verify(tree, patch_set, environ={}).ok
        assert run_revert(tree).ok  # the new pristine is 0.33.0's, not the old ledger's
        assert all((tree / f).read_bytes() == (vllm_candidate_root / f).read_bytes() for f in FILES)


def _record_line(root: Path, rel: str) -> str:
    data = (root / rel).read_bytes()
    b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
    return f"{rel},sha256={b64},{len(data)}"


def test_a_reinstall_of_another_build_is_recognised_by_the_installer_record(tree, patch_set, vllm_pin_root):
    """Same version, other bytes (a rebuilt wheel): the dist-info RECORD, not --force, says they are the installer's."""
    assert run_apply(tree, patch_set, environ={}).ok
    rebuilt = FILES[3]
    _restore(tree, vllm_pin_root, [rebuilt])
    p = tree / rebuilt
    p.write_text(p.read_text() + "\n# rebuilt wheel\n")
    record = next(tree.glob("vllm-*.dist-info")) / "RECORD"
    record.write_text(_record_line(tree, rebuilt) + "\n")
    r = run_apply(tree, patch_set, environ={})
    assert r.ok, r.problems
    assert r.files_written == [rebuilt] and any("installer recorded" in n for n in r.notes)
    assert "# rebuilt wheel" in p.read_text()  # patched on top of the installed build
    assert run_verify(tree, patch_set, environ={}).ok
    assert run_revert(tree).ok
    assert p.read_text().endswith("\n# rebuilt wheel\n")  # the new pristine is the installed build


# ----------------------------------------------------------------------------- property


@pytest.fixture(scope="module")
def applied_template(vllm_pin_root, tmp_path_factory, patch_set):
    root = copy_tree(vllm_pin_root, tmp_path_factory.mktemp("applied") / "site", FILES)
    assert run_apply(root, patch_set, environ={}).ok
    return root, vllm_hash(root)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(restored=st.sets(st.sampled_from(FILES)))
def test_any_subset_restored_to_pristine_then_apply_then_verify_passes(restored, applied_template, vllm_pin_root,
                                                                        patch_set):
    template, patched = applied_template
    root = Path(tempfile.mkdtemp(prefix="sndr-restore-")) / "site"
    shutil.copytree(template, root)
    try:
        _restore(root, vllm_pin_root, sorted(restored))
        r = run_apply(root, patch_set, environ={})
        assert r.ok and sorted(r.files_written) == sorted(restored)
        assert run_verify(root, patch_set, environ={}).ok
        assert vllm_hash(root) == patched
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def test_verify_counts_say_what_the_tree_holds_after_a_restore(tree, patch_set, vllm_pin_root):
    """QA: after a reinstall or one hand-restored file, verify printed ``applied N`` (every edit)
    above its hash_mismatch errors. Edits in a file that fails its hash are counted not_applied,
    named, and their patch reads failed; never ``applied`` for a file back to pristine."""
    from sndr.render import edit_names

    assert run_apply(tree, patch_set, environ={}).ok
    before = run_verify(tree, patch_set, environ={})
    assert before.ok and "not_applied" not in before.counts
    _restore(tree, vllm_pin_root, [FILES[1]])
    report = run_verify(tree, patch_set, environ={})
    assert not report.ok and {p.code for p in report.problems} == {"hash_mismatch"}
    in_file = [e for p in report.patches for e in p.edits if e.file == FILES[1] and e.reason_code == "hash_mismatch"]
    assert [e.name for p in report.patches for e in p.edits if e.file == FILES[1] and e not in in_file] == [
        "never-there"]  # optional and absent: it stays so
    assert in_file and report.counts.get("not_applied") == len(in_file)
    assert sum(report.counts.values()) == sum(before.counts.values())
    assert report.counts.get("applied", 0) == before.counts["applied"] - len(in_file)
    assert sorted(edit_names(report)["not_applied"]) == sorted(f"{e.patch}/{e.name}" for e in in_file)
    assert all(e.verdict.value == "applies" for e in in_file)  # the file is pristine: they apply again
    hit = {e.patch for e in in_file}
    assert {p.id for p in report.patches if p.status == "failed"} == hit
    # Every file restored (a reinstall): nothing reads applied.
    _restore(tree, vllm_pin_root, FILES)
    report = run_verify(tree, patch_set, environ={})
    assert "applied" not in report.counts and report.counts["not_applied"] == before.counts["applied"]
