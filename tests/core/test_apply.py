"""Apply, verify and revert the test patch set on real vLLM 0.32.0 files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sndr.apply import run_apply, run_revert, run_verify
from sndr.errors import SndrError
from sndr.load import load_patch_set
from sndr.model import Verdict
from tests.conftest import CORE_SET_FILES

DATA = Path(__file__).resolve().parents[1] / "data" / "core"
FILES = CORE_SET_FILES  # (tests/conftest.py)


def tree_hash(root: Path) -> dict[str, str]:
    """Hash of every file under root, .sndr state included (for purity checks)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def vllm_hash(root: Path) -> dict[str, str]:
    return {k: v for k, v in tree_hash(root).items() if k.startswith("vllm/")}


@pytest.fixture
def tree(pin_subtree) -> Path:
    return pin_subtree(FILES)


@pytest.fixture(scope="module")
def patch_set():
    return load_patch_set(DATA, packs=False)


def sndr_apply(*args: str, env=None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "sndr.apply", *args], capture_output=True, text=True, env=e)


def test_dry_run_is_pure_and_reports_every_edit(tree, patch_set):
    before = tree_hash(tree)
    report = run_apply(tree, patch_set, dry_run=True)
    assert tree_hash(tree) == before
    assert report.ok and report.exit_code == 0
    verdicts = {(e.patch, e.name): e.verdict for p in report.patches for e in p.edits}
    assert verdicts == {
        ("T0001", "guard"): Verdict.APPLIES,
        ("T0002", "lookup"): Verdict.APPLIES,
        ("T0002", "never-there"): Verdict.OPTIONAL_ABSENT,
        ("T0003", "parent-new"): Verdict.APPLIES,
        ("T0003", "parent-old"): Verdict.OPTIONAL_ABSENT,
        ("T0004", "clamp"): Verdict.APPLIES,
        ("T0005", "message"): Verdict.APPLIES,
        ("T0006", "doc"): Verdict.APPLIES,
    }
    guard = next(e for p in report.patches for e in p.edits if e.name == "guard")
    assert (guard.line, guard.qualname) == (838, "HybridKVCacheCoordinator.find_longest_cache_hit")
    lookup = next(e for p in report.patches for e in p.edits if e.name == "lookup")
    assert lookup.qualname == "Scheduler._update_after_schedule"
    chained = next(e for p in report.patches for e in p.edits if e.name == "message")
    assert chained.chained_from == ["T0001"]
    assert sorted(report.files_written) == sorted(FILES)


def test_apply_compiles_verify_and_revert_byte_exact(tree, patch_set):
    pristine = vllm_hash(tree)
    report = run_apply(tree, patch_set)
    assert report.ok, report.problems
    assert sorted(report.files_written) == sorted(FILES)
    for rel in FILES:
        text = (tree / rel).read_text()
        compile(text, rel, "exec")
    coord = (tree / FILES[0]).read_text()
    assert 'assert curr_hit_length >= 0, f"sndr: negative hit length {curr_hit_length}"' in coord
    assert coord.count("curr_hit_length = hit_length\n") == 1
    assert run_verify(tree, patch_set).ok
    again = run_apply(tree, patch_set)
    assert again.ok and again.files_written == []
    assert all(p.status == "applied" for p in again.patches)
    rev = run_revert(tree)
    assert rev.ok and sorted(rev.files_written) == sorted(FILES)
    assert vllm_hash(tree) == pristine
    assert not (tree / ".sndr" / "ledger.json").exists()


def test_insertion_is_applied_without_ledger(tree, patch_set):
    """In-memory mode has no ledger: an applied insertion must read as applied."""
    run_apply(tree, patch_set, only=["T0001"])
    (tree / ".sndr" / "ledger.json").unlink()
    report = run_verify(tree, patch_set, only=["T0001"])
    (edit,) = report.patches[0].edits
    assert edit.verdict == Verdict.APPLIED
    # And it is never applied a second time.
    text = (tree / FILES[0]).read_text()
    assert text.count("sndr: negative hit length") == 1


def test_pycache_of_touched_files_is_removed(tree, patch_set):
    cache = tree / "vllm/v1/core/__pycache__"
    cache.mkdir()
    stale = cache / "block_pool.cpython-311.pyc"
    other = cache / "block_table.cpython-311.pyc"
    stale.write_bytes(b"stale")
    other.write_bytes(b"other")
    run_apply(tree, patch_set)
    assert not stale.exists() and other.exists()


def test_changed_patch_set_replans_from_pristine(tree, patch_set, tmp_path):
    run_apply(tree, patch_set)
    edited = tmp_path / "patches"
    edited.mkdir()
    for f in DATA.glob("*.toml"):
        (edited / f.name).write_text(f.read_text())
    p = edited / "T0004-free-blocks.toml"
    p.write_text(p.read_text().replace("max(0, self.free_block_queue.num_free_blocks)",
                                       "max(0, int(self.free_block_queue.num_free_blocks))"))
    new_set = load_patch_set(edited, packs=False)
    assert not run_verify(tree, new_set).ok  # different patch set digest
    report = run_apply(tree, new_set)
    assert report.ok and report.files_written == ["vllm/v1/core/block_pool.py"]
    text = (tree / "vllm/v1/core/block_pool.py").read_text()
    assert "max(0, int(self.free_block_queue.num_free_blocks))" in text
    assert "max(0, self.free_block_queue" not in text
    assert run_verify(tree, new_set).ok


def test_foreign_change_is_refused_unless_forced(tree, patch_set):
    run_apply(tree, patch_set)
    target = tree / "vllm/v1/core/block_pool.py"
    target.write_text(target.read_text() + "# local hotfix\n")
    before = vllm_hash(tree)
    r = sndr_apply("--tree", str(tree), "--patches", str(DATA), "--revert")
    assert r.returncode == 1
    assert "vllm/v1/core/block_pool.py" in r.stdout and "changed by someone else" in r.stdout
    # revert's --force puts the pristine bytes back over the change; apply's takes the change as pristine
    assert "--force puts the pristine bytes back over it" in r.stdout and "new pristine" not in r.stdout
    assert vllm_hash(tree) == before
    assert "--force merges it (3-way) into the pristine copy" in run_apply(tree, patch_set).problems[0].hint
    forced = run_revert(tree, force=True)
    assert forced.ok
    assert b"# local hotfix" not in target.read_bytes()  # what the hint said: the change is gone


POOL = "vllm/v1/core/block_pool.py"
CLAMPED = "        return max(0, self.free_block_queue.num_free_blocks)\n"


def test_force_merges_a_hand_edit_three_way_and_revert_keeps_only_it(tree, patch_set, vllm_pin_root):
    """``apply --force`` over a hand-edited patched file took its current bytes as the new pristine, sndr's own
    edit included (a later revert kept sndr's line; only a note said so). Now it is a 3-way merge (merge3) of
    the pristine copy, the file as it is and the bytes sndr wrote: the hand edit goes onto the pristine copy,
    which becomes the file's pristine, and the set is applied on it again. The dry-run says the same; verify
    passes; revert gives back upstream's file with the hand edit, and without sndr's edit."""
    run_apply(tree, patch_set)
    target = tree / POOL
    text = target.read_text()
    target.write_text("# local hotfix at the top\n" + text + "# and one at the end\n")
    before = tree_hash(tree)
    dry = run_apply(tree, patch_set, force=True, dry_run=True)
    assert tree_hash(tree) == before
    forced = run_apply(tree, patch_set, force=True)
    # the file already holds upstream + the hand edit + sndr's edit: only the ledger (its new pristine) is written
    assert forced.ok and dry.ok and dry.files_written == forced.files_written == [], (dry, forced)
    assert any("only record the ledger" in n for n in dry.notes), dry.notes
    for r, verb in ((dry, "would merge"), (forced, "merged")):
        [note] = [n for n in r.notes if "3-way" in n]
        assert POOL in note and verb in note, r.notes
        assert not [n for n in r.notes if "sndr's own" in n], r.notes
    now = target.read_text()
    assert now.startswith("# local hotfix at the top\n") and now.endswith("# and one at the end\n")
    assert CLAMPED in now and run_verify(tree, patch_set).ok
    assert run_revert(tree).ok
    upstream = (vllm_pin_root / POOL).read_text()
    assert target.read_text() == "# local hotfix at the top\n" + upstream + "# and one at the end\n"


def edit_sndrs_line(tree: Path) -> int:
    """A hand edit of the line T0004's edit changed in POOL; returns that line's number."""
    target = tree / POOL
    text = target.read_text()
    assert text.count(CLAMPED) == 1
    target.write_text(text.replace(CLAMPED, "        return max(1, self.free_block_queue.num_free_blocks)\n"))
    return text[:text.index(CLAMPED)].count("\n") + 1


def assert_force_refused(tree: Path, patch_set, line: int) -> None:
    """``apply --force`` (dry-run and real) refuses with force_merge_conflict naming POOL:line, exit 1, and
    leaves the tree (its state included) as it was."""
    before = tree_hash(tree)
    for dry_run in (True, False):
        r = run_apply(tree, patch_set, force=True, dry_run=dry_run)
        assert not r.ok and r.exit_code == 1 and r.files_written == []
        [p] = [p for p in r.problems if p.code == "force_merge_conflict"]
        assert (p.file, p.line) == (POOL, line) and "nothing was written" in p.message, p
        assert f"line {line} of the file now overlaps sndr's line {line} of the bytes it wrote (T0004);" in p.message, p
        assert p.patch == "T0004", p  # the patch whose line it is, not every patch of the file
        assert tree_hash(tree) == before


def test_force_refuses_a_hand_edit_on_sndrs_own_lines_naming_file_and_line(tree, patch_set):
    """A hand edit of the very lines sndr changed does not merge: refused (force_merge_conflict, exit 1), the
    file and the line named, nothing written (the dry-run says the same)."""
    run_apply(tree, patch_set)
    line = edit_sndrs_line(tree)
    assert_force_refused(tree, patch_set, line)
    r = sndr_apply("--tree", str(tree), "--patches", str(DATA), "--force")
    assert r.returncode == 1 and f"{POOL}:{line}" in r.stdout + r.stderr and "force_merge_conflict" in r.stdout + r.stderr


INT_CLAMPED = "        return max(0, int(self.free_block_queue.num_free_blocks))\n"
HOTFIX = "# local hotfix\n"


def set_b(tmp_path: Path, change: str):
    """Set A (tests/data/core) with one patch on POOL changed (``changed``: T0004's clamp casts to int now) or
    added (``added``: T0099 marks the ``get_usage`` line): the bytes sndr writes there differ from set A's."""
    edited = tmp_path / f"patches-{change}"
    edited.mkdir()
    for f in DATA.glob("*.toml"):
        (edited / f.name).write_text(f.read_text())
    if change == "changed":
        p = edited / "T0004-free-blocks.toml"
        p.write_text(p.read_text().replace(CLAMPED, INT_CLAMPED))
    else:
        q = "'''"
        (edited / "T0099-usage-doc.toml").write_text(
            f'id = "T0099"\ntitle = "t"\n[[files]]\npath = "{POOL}"\n[[files.edits]]\nname = "doc"\n'
            f'anchor = {q}\n    def get_usage(self) -> float:\n{q}\n'
            f'replacement = {q}\n    def get_usage(self) -> float:  # sndr: T0099\n{q}\n')
    return load_patch_set(edited, packs=False)


def b_edit(change: str) -> str:
    return INT_CLAMPED if change == "changed" else "    def get_usage(self) -> float:  # sndr: T0099\n"


def objects(tree: Path) -> set[str]:
    return {p.name for p in (tree / ".sndr/objects").iterdir()}


def ledger_of(tree: Path) -> dict:
    return json.loads((tree / ".sndr/ledger.json").read_text())


def test_apply_stores_the_bytes_it_writes_and_a_dry_run_stores_nothing(tree, patch_set):
    """Apply keeps, for every file it patches, the pristine copy and the bytes it writes in .sndr/objects
    (content-addressed: the ledger's ``patched_sha256`` names the copy); the dry-run stores no object."""
    before = tree_hash(tree)
    assert run_apply(tree, patch_set, dry_run=True).ok and tree_hash(tree) == before
    assert not (tree / ".sndr/objects").exists()
    assert run_apply(tree, patch_set).ok
    files = ledger_of(tree)["files"]
    assert files and all(not e["created"] for e in files.values()), files
    for rel, e in files.items():
        now = (tree / rel).read_bytes()
        assert hashlib.sha256(now).hexdigest() == e["patched_sha256"] != e["pristine_sha256"], rel
        assert (tree / ".sndr/objects" / e["patched_sha256"]).read_bytes() == now, rel
        assert e["pristine_sha256"] in objects(tree), rel


@pytest.mark.parametrize("change", ["changed", "added"])
def test_force_merges_across_a_changed_patch_set_with_the_stored_bytes(tree, patch_set, tmp_path, vllm_pin_root,
                                                                       change):
    """The upgrade case: set A applied, a hand edit on a line away from sndr's edits, then ``apply --force``
    with set B (one patch on that file changed or added). The bytes set A wrote are no longer what this set
    would write, so they could not be rebuilt and the file's current bytes (A's edits in them) used to be taken
    as pristine. Now apply stores the bytes it writes and the merge takes them as its base: the hand edit
    survives, B's edits are in, the ledger's pristine is upstream + the hand edit, and a revert gives back
    exactly upstream + the hand edit. The dry-run says the same and stores nothing."""
    run_apply(tree, patch_set)
    b = set_b(tmp_path, change)
    target = tree / POOL
    target.write_text(target.read_text() + HOTFIX)
    before = tree_hash(tree)
    dry = run_apply(tree, b, force=True, dry_run=True)
    assert dry.ok and tree_hash(tree) == before, dry.problems
    forced = run_apply(tree, b, force=True)
    assert forced.ok and dry.files_written == forced.files_written == [POOL], (dry, forced)
    for r, verb in ((dry, "would merge"), (forced, "merged")):
        [note] = [n for n in r.notes if "3-way" in n]
        assert POOL in note and verb in note and "stored at apply" in note, r.notes
        assert not [n for n in r.notes if "no 3-way merge" in n or "sndr's own" in n], r.notes
    upstream = (vllm_pin_root / POOL).read_text()
    now = target.read_text()
    assert now.endswith(HOTFIX) and b_edit(change) in now and run_verify(tree, b).ok
    if change == "changed":
        assert CLAMPED not in now
    entry = ledger_of(tree)["files"][POOL]
    pristine = (tree / ".sndr/objects" / entry["pristine_sha256"]).read_text()
    assert pristine == upstream + HOTFIX
    assert (tree / ".sndr/objects" / entry["patched_sha256"]).read_text() == now  # the next --force's base
    assert run_revert(tree).ok
    assert target.read_text() == upstream + HOTFIX
    for rel in FILES:
        if rel != POOL:
            assert (tree / rel).read_bytes() == (vllm_pin_root / rel).read_bytes(), rel


def test_force_across_a_changed_set_refuses_a_hand_edit_on_sndrs_lines(tree, patch_set, tmp_path):
    """With set B and the stored base, a hand edit of the lines set A's edit changed is still a conflict:
    ``force_merge_conflict`` naming the file and the line, exit 1, the tree (state included) untouched."""
    run_apply(tree, patch_set)
    b = set_b(tmp_path, "added")
    assert_force_refused(tree, b, edit_sndrs_line(tree))


@pytest.mark.parametrize("hand_line, names, sndr_lines", [
    (876, ["T0004", "T0099"], "sndr's line 875 (T0004) and sndr's line 877 (T0099)"),  # the blank line between the two edits
    (874, ["T0004"], "sndr's line 875 (T0004)"),  # the docstring's end, next to T0004's line only
])
def test_force_refuses_a_hand_edit_next_to_sndrs_lines_naming_its_line_and_the_patches(
        tree, tmp_path, hand_line, names, sndr_lines):
    """Two patches edit lines 875 (T0004) and 877 (T0099) of POOL; a hand edit of a line next to them (not on
    them) does not merge either (merge3 has no common line to place it by). The refusal named the whole
    merge region as lines sndr's edits changed ("lines 875-877 ... overlaps lines sndr's edits changed"), the
    file at line 875 (T0004's line, not the one edited by hand) and no patch: now it names the line changed
    since apply (the file:line too), says it is next to sndr's lines, which, and which patch wrote each."""
    b = set_b(tmp_path, "added")
    assert run_apply(tree, b).ok
    target = tree / POOL
    lines = target.read_text().splitlines(True)
    assert lines[874] == CLAMPED and lines[876] == b_edit("added")  # 1-based 875 and 877: sndr's lines
    lines[hand_line - 1] = "        # a hand edit\n"
    target.write_text("".join(lines))
    before = tree_hash(tree)
    for dry_run in (True, False):
        r = run_apply(tree, b, force=True, dry_run=dry_run)
        assert not r.ok and r.exit_code == 1 and r.files_written == []
        [p] = [p for p in r.problems if p.code == "force_merge_conflict"]
        assert (p.file, p.line) == (POOL, hand_line), p
        assert f"line {hand_line} of the file now is next to {sndr_lines} (a 3-way merge" in p.message, p
        assert p.patch == ", ".join(names) and "overlaps" not in p.message, p
        assert tree_hash(tree) == before
    r = sndr_apply("--tree", str(tree), "--patches", str(tmp_path / "patches-added"), "--force")
    assert r.returncode == 1 and f"{POOL}:{hand_line}" in r.stdout + r.stderr, r.stdout + r.stderr


def test_force_over_a_damaged_stored_base_stops_naming_the_object(tree, patch_set):
    """A stored copy of the bytes sndr wrote that no longer matches its hash is damage, not "no base": the
    apply stops (``object_corrupt``, naming the object's path), nothing written; no fallback hides it."""
    run_apply(tree, patch_set)
    obj = tree / ".sndr/objects" / ledger_of(tree)["files"][POOL]["patched_sha256"]
    obj.write_bytes(b"tampered\n")
    target = tree / POOL
    target.write_text(target.read_text() + HOTFIX)
    before = tree_hash(tree)
    with pytest.raises(SndrError) as exc:
        run_apply(tree, patch_set, force=True)
    [p] = exc.value.problems
    assert p.code == "object_corrupt" and p.file == str(obj), p
    assert tree_hash(tree) == before


def _forget_written_bytes(tree: Path) -> None:
    """Make the tree's state what a ledger from before sndr stored the bytes it writes looks like."""
    for e in ledger_of(tree)["files"].values():
        (tree / ".sndr/objects" / e["patched_sha256"]).unlink()


def test_force_on_an_old_ledger_rebuilds_the_bytes_sndr_wrote(tree, patch_set, vllm_pin_root):
    """A ledger written before sndr stored the bytes it writes: with the same set they are rebuilt (a plan on
    the pristine copies, used because their sha256 is the ledger's) and the merge goes on, the note saying
    so; the apply then stores them."""
    run_apply(tree, patch_set)
    _forget_written_bytes(tree)
    target = tree / POOL
    target.write_text(target.read_text() + HOTFIX)
    forced = run_apply(tree, patch_set, force=True)
    assert forced.ok and forced.files_written == [], forced
    [note] = [n for n in forced.notes if "3-way" in n]
    assert POOL in note and "rebuilt from this set" in note and "stored at apply" not in note, forced.notes
    assert ledger_of(tree)["files"][POOL]["patched_sha256"] in objects(tree)
    assert run_revert(tree).ok and target.read_text() == (vllm_pin_root / POOL).read_text() + HOTFIX


def test_force_on_an_old_ledger_and_a_changed_set_takes_the_current_bytes_and_says_so(tree, patch_set, tmp_path):
    """A ledger from before sndr stored the bytes it writes, and a set changed since: the bytes cannot be
    rebuilt either, so there is no merge base: the current bytes are taken as pristine, as before, and the
    notes say why and what revert does."""
    run_apply(tree, patch_set)
    _forget_written_bytes(tree)
    target = tree / POOL
    target.write_text(target.read_text() + HOTFIX)
    forced = run_apply(tree, set_b(tmp_path, "added"), force=True)
    assert forced.ok, forced.problems
    [note] = [n for n in forced.notes if "no 3-way merge" in n]
    assert POOL in note and "not stored" in note and "patch set changed" in note and "as pristine" in note, \
        forced.notes
    assert "# sndr: T0099" in target.read_text()
    assert run_revert(tree).ok  # the adopted bytes come back, sndr's old edit with them (the note's warning)
    assert HOTFIX in target.read_text() and CLAMPED in target.read_text()


def test_an_unverifiable_deletion_gets_its_own_hint_not_drifts(tree, tmp_path):
    """A pure deletion done without sndr (no ledger) cannot be read back from the file: verify says so
    (``deletion_unverifiable``), but its hint was drift's "re-anchor the edit (python -m sndr preflight
    suggests where the code went)", though the anchor did not move. Now the hint says what does work."""
    d = tmp_path / "p"
    d.mkdir()
    keep = "        self.prev_step_scheduled_req_ids: set[str] = set()\n"
    gone = "        # Track requests scheduled in prior step (MRV1-only).\n"
    q = "'''"
    (d / "T0010-delete.toml").write_text(
        'id = "T0010"\ntitle = "drop a comment"\n[[files]]\npath = "vllm/v1/core/sched/scheduler.py"\n'
        f'[[files.edits]]\nname = "del"\nanchor = {q}\n{gone}{keep}{q}\nreplacement = {q}\n{keep}{q}\n')
    target = tree / "vllm/v1/core/sched/scheduler.py"
    target.write_text(target.read_text().replace(gone + keep, keep))  # deleted by hand: no ledger
    report = run_verify(tree, load_patch_set(d, packs=False))
    [p] = [p for p in report.problems if p.code == "edit_drifted"]
    assert "cannot be told from the file alone" in p.message
    assert p.hint and "re-anchor" not in p.hint and "merged marker" in p.hint and "sndr" in p.hint, p.hint


def test_failed_required_edit_writes_nothing(tree, tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    for f in DATA.glob("*.toml"):
        (d / f.name).write_text(f.read_text())
    (d / "T0009-drift.toml").write_text(
        'id = "T0009"\ntitle = "drifted"\n[[files]]\npath = "vllm/v1/core/block_pool.py"\n'
        "[[files.edits]]\nname = \"gone\"\nanchor = '''\nthis text is not in vLLM\n'''\n"
        "replacement = '''\nnor this\n'''\n")
    before = tree_hash(tree)
    r = sndr_apply("--tree", str(tree), "--patches", str(d), "--json", str(tmp_path / "r.json"))
    assert r.returncode == 1
    assert tree_hash(tree) == before
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["ok"] is False and data["files_written"] == []
    prob = next(p for p in data["problems"] if p["patch"] == "T0009")
    assert prob["code"] == "edit_drifted" and prob["file"] == "vllm/v1/core/block_pool.py"


def test_gating_env_and_version(tree, patch_set):
    report = run_apply(tree, patch_set, dry_run=True, environ={"SNDR_ENABLE_T0004": "0"})
    t4 = next(p for p in report.patches if p.id == "T0004")
    assert t4.status == "gated" and t4.reason_code == "disabled_by_env"
    report = run_apply(tree, patch_set, dry_run=True, environ={"SNDR_ENABLE_T0001": "0"})
    t5 = next(p for p in report.patches if p.id == "T0005")
    assert t5.status == "gated" and t5.reason_code == "requires_gated"
    r = sndr_apply("--tree", str(tree), "--patches", str(DATA), "--dry-run", env={"SNDR_ENABLE_T0004": "maybe"})
    assert r.returncode == 2 and "SNDR_ENABLE_T0004" in r.stderr


@pytest.mark.parametrize("version, spec, enabled", [
    ("0.23.1rc1.dev748+g2dfaae752", ">=0.23", True),
    ("0.23.1rc1.dev748+g2dfaae752", ">=0.24", False),
    ("0.32.0", ">=0.32,<0.34", True),
    ("0.34.0rc1", ">=0.32,<0.34", False),
    ("0.33.0rc2", ">=0.32,<0.34", True),
    ("0.32.0+cu129", "==0.32.0", True),
])
def test_version_gating_handles_dev_and_rc_pins(version, spec, enabled):
    from sndr.model import Patch
    from sndr.plan import gate

    p = Patch.model_validate({"id": "P1", "title": "t", "vllm": spec, "files": [
        {"path": "vllm/x.py", "edits": [{"name": "e", "anchor": "a", "replacement": "b"}]}]})
    assert gate(p, version, environ={}).enabled is enabled


@pytest.mark.parametrize("environ, enabled, code", [
    ({}, True, ""),
    ({"SNDR_PLUGINS": "0"}, False, "disabled_by_env"),
    ({"SNDR_PLUGINS": "off", "SNDR_ENABLE_PK1": "1"}, True, ""),  # the plugin's own variable wins
    ({"SNDR_PLUGINS": "1", "SNDR_ENABLE_PK1": "0"}, False, "disabled_by_env"),
])
def test_sndr_plugins_turns_every_plugin_off_unless_its_own_variable_says_on(environ, enabled, code):
    from sndr.model import Patch
    from sndr.plan import gate

    plugin = Patch.model_validate({"id": "PK1", "title": "t", "kind": "plugin", "module": "sndr.kernels",
                                   "runtime": [{"name": "r", "target": "vllm.x:f", "replacement": "sndr.kernels:f"}]})
    text = Patch.model_validate({"id": "P1", "title": "t", "files": [
        {"path": "vllm/x.py", "edits": [{"name": "e", "anchor": "a", "replacement": "b"}]}]})
    g = gate(plugin, "0.32.0", environ=environ)
    assert (g.enabled, g.code) == (enabled, code)
    if code and "SNDR_PLUGINS" in environ and "SNDR_ENABLE_PK1" not in environ:
        assert "SNDR_PLUGINS=0" in g.reason and "SNDR_ENABLE_PK1=1" in g.reason
    assert gate(text, "0.32.0", environ=environ).enabled  # text patches are not plugins
    with pytest.raises(Exception, match="SNDR_PLUGINS='maybe' is not a boolean"):
        gate(plugin, "0.32.0", environ={"SNDR_PLUGINS": "maybe"})


def test_cli_json_and_exit_codes(tree, tmp_path):
    out = tmp_path / "report.json"
    r = sndr_apply("--tree", str(tree), "--patches", str(DATA), "--json", str(out), "-q")
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["mode"] == "apply" and data["ok"] and len(data["files_written"]) == 5
    assert sndr_apply("--tree", str(tree), "--patches", str(DATA), "--verify", "-q").returncode == 0
    assert sndr_apply("--tree", str(tmp_path), "--patches", str(DATA)).returncode == 2
    assert sndr_apply("--tree", str(tree), "--patches", str(tmp_path / "nope")).returncode == 2


def test_revert_and_verify_on_a_tree_sndr_never_touched(tree, patch_set):
    before = tree_hash(tree)
    rev = run_revert(tree)
    assert rev.ok and rev.files_written == [] and "nothing to revert" in rev.notes[0]
    ver = run_verify(tree, patch_set)
    assert not ver.ok and ver.exit_code == 1
    assert {p.code for p in ver.problems} == {"not_applied"}
    assert tree_hash(tree) == before


@pytest.mark.vllm_install
def test_tree_can_name_an_installed_vllm(tmp_path, vllm_py):
    """--tree installed:PYTHON finds the vLLM that interpreter imports, without importing it."""
    python = vllm_py
    r = sndr_apply("--tree", f"installed:{python}", "--patches", str(DATA), "--dry-run", "--json", "-", "-q")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["mode"] == "dry-run" and data["vllm_version"] == "0.32.0"
    assert data["tree"].endswith("site-packages")


RUNTIME_TARGET = "vllm/v1/sample/ops/topk_topp_sampler.py"  # PR0001's target (a runtime wrapper, no text edit)


def test_runtime_patch_reads_applies_until_a_ledger_records_it(pin_subtree, tmp_path, capsys):
    """The audit's new-user pass: on a pristine tree a runtime patch (no text edit) read ``applied`` in a
    dry-run (--json, the terminal, ``list --tree``) while its binding read ``applies``. It is ``applies``
    (it binds; each vLLM process installs it at startup) until a ledger records it, ``applied`` after, in
    every view; a runtime-only set writes no ledger, and verify still passes it, reading ``applies``."""
    import shutil

    from sndr.__main__ import main as sndr_main

    pdir = tmp_path / "patches"
    pdir.mkdir()
    shutil.copy(DATA / "T0004-free-blocks.toml", pdir)
    shutil.copy(Path(__file__).resolve().parents[2] / "patches" / "PR0001-topk-topp-param-check.toml", pdir)
    tree = pin_subtree(FILES + [RUNTIME_TARGET])
    ps = load_patch_set(pdir, packs=False)

    def rows(report):
        return {p.id: (p.status, sorted({e.verdict.value for e in p.edits})) for p in report.patches}

    def listed():
        assert sndr_main(["list", "--tree", str(tree), "--patches", str(pdir), "--json", "-"]) == 0
        return {r["id"]: (r["verdict"], r["edit_verdicts"]) for r in json.loads(capsys.readouterr().out)["patches"]}

    before = tree_hash(tree)
    dry = run_apply(tree, ps, dry_run=True, environ={})
    assert dry.ok and tree_hash(tree) == before
    assert rows(dry)["PR0001"] == ("applies", ["applies"]), rows(dry)
    assert listed()["PR0001"] == ("applies", ["applies"])
    r = sndr_apply("--tree", str(tree), "--patches", str(pdir), "--dry-run", "-v")
    assert r.returncode == 0 and "PR0001     applies" in r.stdout and "PR0001     applied" not in r.stdout, r.stdout

    done = run_apply(tree, ps, environ={})
    assert done.ok, done.problems
    assert rows(run_verify(tree, ps, environ={}, edits=True))["PR0001"] == ("applied", ["applied"])
    assert rows(run_verify(tree, ps, environ={}))["PR0001"][0] == "applied"
    assert listed()["PR0001"] == ("applied", ["applied"])
    assert rows(run_apply(tree, ps, dry_run=True, environ={}))["PR0001"] == ("applied", ["applied"])

    # A runtime-only set: nothing to write on disk, so no ledger records it; verify passes, as before.
    assert run_revert(tree).ok and tree_hash(tree) != before  # .sndr/objects stays
    only = run_apply(tree, ps, only=["PR0001"], environ={})
    assert only.ok and only.files_written == [] and rows(only)["PR0001"] == ("applies", ["applies"])
    ver = run_verify(tree, ps, only=["PR0001"], environ={})
    assert ver.ok and ver.exit_code == 0 and rows(ver)["PR0001"] == ("applies", ["applies"]), ver
    assert any("runtime" in n and "startup" in n for n in ver.notes), ver.notes
