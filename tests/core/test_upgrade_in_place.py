"""An in-place vLLM upgrade (and downgrade) under sndr's ledger: ``--dry-run`` takes exactly the apply's
path, and the apply's verdicts are the ones a never-touched tree of that version gets (issue 32 HIGH 2,
MEDIUM 4).

The shipped set on full copies of the real 0.32.0 and 0.33.0 trees. ``_pip_install`` does to the
tree what ``pip install --no-deps vllm==X`` does: the old version's files go, the new version's come,
with a dist-info ``RECORD`` holding their sha256 (the cached trees keep only the ``.py`` files, so
the RECORD is written from them: the hashes pip writes for the same bytes). sndr's ``.sndr/`` state
(pip knows nothing of it) stays.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
from pathlib import Path

import pytest
from conftest import copy_tree

from sndr.apply import run_apply, run_verify
from sndr.load import load_patch_set
from sndr.model import Report


@pytest.fixture(scope="module")
def shipped():
    return load_patch_set(packs=False)


def _record(src: Path) -> str:
    lines = []
    for p in sorted(src.rglob("*.py")):
        data = p.read_bytes()
        b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
        lines.append(f"{p.relative_to(src)},sha256={b64},{len(data)}")
    return "\n".join(lines) + "\n"


def _pip_install(root: Path, new: Path, old: Path) -> None:
    for p in old.rglob("*.py"):  # pip removes what the old RECORD lists (files a patch created stay)
        (root / p.relative_to(old)).unlink(missing_ok=True)
    for info in root.glob("vllm-*.dist-info"):
        shutil.rmtree(info)
    shutil.copytree(new, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".complete"))
    [info] = root.glob("vllm-*.dist-info")
    (info / "RECORD").write_text(_record(new))


def _everything(root: Path) -> dict[str, bytes]:
    """Every file under the root, sndr's state included: what a pure dry-run must leave as it was."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _verdicts(r: Report) -> dict:
    return {"ok": r.ok, "exit": r.exit_code, "counts": r.counts, "digest": r.patch_set_digest,
            "patches": [(p.id, p.status, p.reason_code) for p in r.patches],
            "edits": [(p.id, e.file, e.name, e.verdict.value) for p in r.patches for e in p.edits],
            "problems": [(p.code, p.patch, p.file) for p in r.problems],
            "left_out": [lo.id for lo in r.left_out],
            "files": sorted(r.files_written)}


def _dry_then_real(root: Path, patch_set, **kw) -> tuple[dict, dict]:
    before = _everything(root)
    dry = run_apply(root, patch_set, environ={}, dry_run=True, **kw)
    assert _everything(root) == before, "the dry-run wrote"
    real = run_apply(root, patch_set, environ={}, **kw)
    return _verdicts(dry), _verdicts(real)


def _clean(src: Path, tmp: Path, patch_set) -> dict:
    """The same set planned on a never-touched tree of that version."""
    return _verdicts(run_apply(copy_tree(src, tmp), patch_set, environ={}, dry_run=True))


def test_upgrade_to_0_33_dry_run_is_the_apply(tmp_path, vllm_pin_root, vllm_candidate_root, shipped):
    tree = copy_tree(vllm_pin_root, tmp_path / "site")
    assert run_apply(tree, shipped, environ={}).ok
    _pip_install(tree, vllm_candidate_root, vllm_pin_root)
    dry, real = _dry_then_real(tree, shipped)
    assert dry == real
    clean = _clean(vllm_candidate_root, tmp_path / "clean", shipped)
    # HIGH 2: the dry-run no longer plans from 0.32.0's pristine copies ("applies 64 ... ok", exit 0).
    # MEDIUM 4: upstream-merged edits read "merged" (16/47 on a clean 0.33.0), never "applies".
    assert real["counts"] == clean["counts"]
    assert real["edits"] == clean["edits"] and real["exit"] == clean["exit"] and real["ok"] == clean["ok"]
    assert real["counts"].get("merged", 0) > real["counts"].get("applies", 0)
    if not real["ok"]:  # 0.33.0 breaks a patch of the shipped set: both refuse, exit 1
        assert real["exit"] == dry["exit"] == 1 and real["problems"]


def test_downgrade_back_to_0_32_has_no_false_merged(tmp_path, vllm_pin_root, vllm_candidate_root, shipped):
    """0.32.0 -> 0.33.0 (applied there with --keep-going) -> 0.32.0: the dry-run read the 0.33.0 pristine
    copies and called PN0009/PN0017 "merged" on a pristine 0.32.0 tree."""
    tree = copy_tree(vllm_pin_root, tmp_path / "site")
    assert run_apply(tree, shipped, environ={}).ok
    _pip_install(tree, vllm_candidate_root, vllm_pin_root)
    run_apply(tree, shipped, environ={}, keep_going=True)  # a 0.33.0 ledger (what does not apply is left out)
    _pip_install(tree, vllm_pin_root, vllm_candidate_root)
    dry, real = _dry_then_real(tree, shipped)
    assert dry == real
    clean = _clean(vllm_pin_root, tmp_path / "clean", shipped)
    assert real["edits"] == clean["edits"] and real["counts"] == clean["counts"]
    assert "merged" not in real["counts"] and real["ok"] and real["exit"] == 0
    assert run_verify(tree, shipped, environ={}).ok


def test_dry_run_equals_apply_on_every_ledger_state(tmp_path, vllm_pin_root, shipped):
    """The paths apply takes before planning (fast path, back to pristine, foreign change, --force, another
    set) give the dry-run the same verdicts, files and exit status."""
    tree = copy_tree(vllm_pin_root, tmp_path / "site")
    dry, real = _dry_then_real(tree, shipped)  # first contact
    assert dry == real and real["ok"]
    dry, real = _dry_then_real(tree, shipped)  # the fast path: nothing to write
    assert dry == real and real["files"] == []
    rel = real["edits"][0][1]
    (tree / rel).write_bytes((vllm_pin_root / rel).read_bytes())  # restored: back to pristine
    dry, real = _dry_then_real(tree, shipped)
    assert dry == real and real["files"] == [rel]
    (tree / rel).write_bytes((tree / rel).read_bytes() + b"# local hotfix\n")  # someone else's change
    dry, real = _dry_then_real(tree, shipped)
    assert dry == real and real["exit"] == 1 and real["problems"] == [("modified_since_apply", None, rel)]
    dry, real = _dry_then_real(tree, shipped, force=True)  # the hotfixed bytes taken as pristine
    assert dry == real and real["ok"]
    dry, real = _dry_then_real(tree, shipped, only=["PG0006"])  # another set: the rest goes back to pristine
    assert dry == real and real["ok"] and len(real["files"]) > 1


def test_list_after_an_in_place_upgrade_reads_like_a_clean_tree(tmp_path, vllm_pin_root, vllm_candidate_root,
                                                                 shipped, capsys):
    """``sndr list --tree`` took the same shortcut as apply's verdict table: merged edits read applied."""
    import json

    from sndr.__main__ import main as sndr_main

    tree = copy_tree(vllm_pin_root, tmp_path / "site")
    assert run_apply(tree, shipped, environ={}).ok
    _pip_install(tree, vllm_candidate_root, vllm_pin_root)
    clean = copy_tree(vllm_candidate_root, tmp_path / "clean")
    docs = []
    for root in (tree, clean):
        assert sndr_main(["list", "--tree", str(root), "--json", "-"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0]["patches"] == docs[1]["patches"]
    assert docs[0]["patch_set_digest"] == docs[1]["patch_set_digest"]


def test_manifest_after_an_in_place_upgrade_is_the_new_versions(tmp_path, vllm_pin_root, vllm_candidate_root,
                                                                shipped):
    """`manifest build` on a tree sndr patched on 0.32.0 and then upgraded to 0.33.0 in place: the ledger's
    pristine copies are 0.32.0's, so the manifest is built from the files as 0.33.0's installer left them
    (byte for byte a clean 0.33.0 tree's manifest, said in a note); a file that still holds sndr's 0.32.0
    patched bytes has no pristine copy of 0.33.0 and is refused (tree_patched), named."""
    import json

    from sndr.errors import SndrError
    from sndr.manifest import build_manifest
    from sndr.tree import open_tree

    tree = copy_tree(vllm_pin_root, tmp_path / "site")
    assert run_apply(tree, shipped, environ={}).ok
    ledger = json.loads((tree / ".sndr" / "ledger.json").read_text())
    rel = sorted(r for r, e in ledger["files"].items() if e["patches"])[0]  # a file sndr wrote (not one it read)
    patched = (tree / rel).read_bytes()
    _pip_install(tree, vllm_candidate_root, vllm_pin_root)
    notes: list[str] = []
    got = build_manifest(open_tree(tree), shipped, notes).to_json()
    assert got == build_manifest(open_tree(vllm_candidate_root), shipped).to_json()
    assert len(notes) == 1 and "written for vLLM 0.32.0" in notes[0], notes
    (tree / rel).write_bytes(patched)  # as if the installer had left it
    with pytest.raises(SndrError) as exc:
        build_manifest(open_tree(tree), shipped)
    p = exc.value.problems[0]
    assert (p.code, p.file) == ("tree_patched", rel) and "0.32.0" in p.message, p
