"""sndr.commit, the transaction, tested through its own API on a small tree (no planner, no CLI).

What is here: the journal a commit writes (and the before-bytes it stores first), the swap of a
new inode in with ``renameat2(RENAME_EXCHANGE)`` and with its fallback, recovery after a SIGKILL at
every fault point of a commit (a forked child dies there; the parent recovers) and after an
exception at each of them (the in-process rollback), the refusals of recovery (a journal that does
not match the tree) and of a commit (a file changed between plan and commit), the lock (a writer
excludes everyone, readers share, a reader never creates state), the object store, and ledger
salvage (which stored ledger it picks, and that it writes nothing when none matches).

What is elsewhere, and not repeated here (all in ``tests/reliability/``, on real vLLM files through
``sndr.apply``): SIGKILL at every step of apply and revert of a 12-file set (``test_crash.py``);
foreign writes and renames in the replace window (``test_rename_race.py``); symlinked state, temp
names, targets, FIFOs, I/O errors and full disks (``test_hardening.py``); hostile journals
(``test_journal.py``, ``test_hardening.py::test_malformed_journal_is_journal_corrupt``); 16 racing
appliers (``test_concurrency.py``); the ``ledger_corrupt`` hint end to end
(``test_hardening.py::test_ledger_corrupt_hint_is_a_recovery_path_that_works``). The ledger
readers are held to one answer in ``tests/test_state.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
from pathlib import Path

import pytest

from sndr import commit as commit_mod
from sndr import env as envmod
from sndr.commit import FileWrite, TreeRoot, commit, recover, salvage_ledger
from sndr.errors import CODES, SndrError
from sndr.fsio import TEMP_MARK
from sndr.model import Ledger, LedgerFile

A0, A1, A2 = b"x = 0\n", b"x = 1  # P1\n", b"x = 2  # P2\n"
B0, B2 = b"def f():\n    return 0\n", b"def f():\n    return 2  # P2\n"
C = b"NEW = True  # created by P2\n"
NEW = "vllm/new/deep/c.py"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "a.py").write_bytes(A0)
    (root / "vllm" / "b.py").write_bytes(B0)
    return root


def ledger(digest: str, files: dict[str, tuple[bytes | None, bytes]]) -> Ledger:
    """A sealed ledger: rel -> (pristine bytes, None for a created file; patched bytes)."""
    entries = {rel: LedgerFile(pristine_sha256=sha(pristine if pristine is not None else patched),
                               patched_sha256=sha(patched), patches=[digest], created=pristine is None)
               for rel, (pristine, patched) in files.items()}
    return Ledger(patch_set_digest=digest, patches=[digest], files=entries).sealed()


def snapshot(root: Path) -> dict[str, object]:
    """Every file and directory of the tree with its bytes, ``.sndr/`` included (a journal or a temp file
    left anywhere shows up), except the object store and the lock file, which only ever grow.
    ``created-dirs.json`` is compared by what it says: recovery writes ``[]`` where there was none."""
    out: dict[str, object] = {".sndr/created-dirs.json": []}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(".sndr/objects") or rel == ".sndr/lock":
            continue
        out[rel] = "<dir>" if p.is_dir() else p.read_bytes()
        if rel == ".sndr/created-dirs.json":
            out[rel] = json.loads(p.read_bytes())
    return out


def run_commit(root: Path, spec: dict[str, bytes | None], new_ledger: Ledger | None, digest: str) -> None:
    """What apply and revert do around :func:`commit`: lock, recover, read every target, commit."""
    tree = TreeRoot(root)
    with tree.lock():
        recover(tree)
        writes = [FileWrite(rel, tree.read_bytes(rel), after) for rel, after in spec.items()]
        commit(tree, writes, new_ledger, digest)


# The two commits the crash tests interrupt, each on top of a first commit that went through.
# "patch": P1 is applied (a.py); then P2 changes a.py again, patches b.py and creates a file in two
# new directories (a ledger before, mkdirs). "revert": P2 created that file; then a revert removes
# it and the ledger (rmdirs, created-dirs.json, no ledger after).
L1 = ledger("P1", {"vllm/a.py": (A0, A1)})
L2 = ledger("P2", {"vllm/a.py": (A0, A2), "vllm/b.py": (B0, B2), NEW: (None, C)})
LC = ledger("PC", {NEW: (None, C)})
SCENARIOS = {
    "patch": ({"vllm/a.py": A1}, L1, {"vllm/a.py": A2, "vllm/b.py": B2, NEW: C}, L2),
    "revert": ({NEW: C}, LC, {NEW: None}, None),
}


def points(scenario: str) -> list[str]:
    """The fault points (``commit._fault``) a commit of ``scenario`` passes, in order."""
    spec = SCENARIOS[scenario][2]
    n = len(spec)
    staged = [f"after_tmp:{i}" for i, after in enumerate(spec.values()) if after is not None]
    return (["after_lock", "after_journal"] + staged + [f"after_replace:{i}" for i in range(n)]
            + ["before_ledger", "after_ledger", "after_commit"])


CRASH_CASES = [(s, p) for s in SCENARIOS for p in points(s)]


def prepared(tmp_path: Path, scenario: str) -> tuple[Path, dict[str, bytes | None], Ledger | None]:
    first, first_ledger, spec, new_ledger = SCENARIOS[scenario]
    root = make_tree(tmp_path)
    run_commit(root, first, first_ledger, first_ledger.patch_set_digest)
    return root, spec, new_ledger


def commit_in_a_child_killed_at(root: Path, spec, new_ledger, point: str) -> int:
    """Run the commit in a forked child that SIGKILLs itself at ``point``; return its wait status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.environ[envmod.FAULT] = point
            run_commit(root, spec, new_ledger, "P2")
        except BaseException:  # noqa: BLE001 - a child reports by exit status only
            code = 3
        os._exit(code)
    return os.waitpid(pid, 0)[1]


# ----------------------------------------------------------------------------- commit and its journal


def test_a_commit_makes_the_set_and_the_ledger_real_and_leaves_no_journal(tmp_path):
    root, spec, new_ledger = prepared(tmp_path, "patch")
    run_commit(root, spec, new_ledger, "P2")
    assert (root / "vllm/a.py").read_bytes() == A2
    assert (root / "vllm/b.py").read_bytes() == B2
    assert (root / NEW).read_bytes() == C
    tree = TreeRoot(root)
    assert tree.read_ledger() == L2
    assert json.loads((root / ".sndr/created-dirs.json").read_bytes()) == ["vllm/new", "vllm/new/deep"]
    assert not (root / ".sndr/journal.json").exists()
    assert not [p for p in root.rglob("*") if TEMP_MARK in p.name]
    # Before-bytes and every ledger written are kept content-addressed (revert and salvage read them).
    for data in (A1, B0, L1.model_dump_json(indent=1).encode(), L2.model_dump_json(indent=1).encode()):
        assert tree.get_object(sha(data)) == data


def test_the_journal_names_every_file_and_its_before_bytes_are_stored_first(tmp_path):
    root, spec, new_ledger = prepared(tmp_path, "patch")
    status = commit_in_a_child_killed_at(root, spec, new_ledger, "after_journal")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    journal = json.loads((root / ".sndr/journal.json").read_bytes())
    assert journal["format"] == 1 and journal["digest"] == "P2"
    by = {e["path"]: e for e in journal["files"]}
    assert list(by) == ["vllm/a.py", "vllm/b.py", NEW]
    assert (by["vllm/a.py"]["before"], by["vllm/a.py"]["after"]) == (sha(A1), sha(A2))
    assert (by["vllm/b.py"]["before"], by["vllm/b.py"]["after"]) == (sha(B0), sha(B2))
    assert (by[NEW]["before"], by[NEW]["after"], by[NEW]["mkdirs"]) == (None, sha(C), ["vllm/new", "vllm/new/deep"])
    assert journal["created_dirs_before"] == []
    old_ledger = L1.model_dump_json(indent=1).encode()
    assert journal["ledger_before"] == sha(old_ledger)
    tree = TreeRoot(root)
    # Durable before the journal named them: recovery needs nothing else.
    assert tree.get_object(by["vllm/a.py"]["before"]) == A1
    assert tree.get_object(by["vllm/b.py"]["before"]) == B0
    assert tree.get_object(journal["ledger_before"]) == old_ledger
    # Killed right after the journal: no target was touched yet.
    assert (root / "vllm/a.py").read_bytes() == A1 and not (root / "vllm/new").exists()


def test_a_file_changed_between_plan_and_commit_is_refused_and_nothing_is_written(tmp_path):
    root = make_tree(tmp_path)
    tree = TreeRoot(root)
    with tree.lock():
        writes = [FileWrite(rel, tree.read_bytes(rel), after) for rel, after in
                  {"vllm/a.py": A1, "vllm/b.py": B2}.items()]
        (root / "vllm/b.py").write_bytes(b"# edited by someone else\n")
        before = snapshot(root)
        with pytest.raises(SndrError) as exc:
            commit(tree, writes, L1, "P1")
    assert exc.value.problems[0].code == "changed_during_apply"
    assert exc.value.problems[0].file == "vllm/b.py"
    assert snapshot(root) == before


# ----------------------------------------------------------------------------- the swap


def test_rename_exchange_swaps_two_entries_atomically(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"first")
    b.write_bytes(b"second")
    ia, ib = os.lstat(a).st_ino, os.lstat(b).st_ino
    if not commit_mod._exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here (kernel, libc or filesystem)")
    assert (a.read_bytes(), b.read_bytes()) == (b"second", b"first")
    assert (os.lstat(a).st_ino, os.lstat(b).st_ino) == (ib, ia)


@pytest.mark.parametrize("swap", ["exchange", "fallback"])
def test_a_replaced_file_is_a_new_inode_and_the_old_one_is_never_written(tmp_path, monkeypatch, swap):
    """Both ways of swapping (RENAME_EXCHANGE; a hard link of the old inode + rename where the
    system has none) leave the same tree: the new bytes under a new inode with the old file's mode,
    the old inode untouched (a process that has it open reads the old code), no temp file, and the
    replaced module's stale bytecode gone while the others' stays."""
    root = make_tree(tmp_path)
    target = root / "vllm/a.py"
    os.chmod(target, 0o640)
    cache = root / "vllm/__pycache__"
    cache.mkdir()
    (cache / "a.cpython-311.pyc").write_bytes(b"stale")
    (cache / "b.cpython-311.pyc").write_bytes(b"current")
    old_ino = os.lstat(target).st_ino
    exchanged: list[bool] = []
    if swap == "fallback":
        monkeypatch.setattr(commit_mod, "_renameat2_fn", [None])
    real = commit_mod._exchange

    def spy(a: Path, b: Path) -> bool:
        exchanged.append(real(a, b))
        return exchanged[-1]

    monkeypatch.setattr(commit_mod, "_exchange", spy)
    with open(target, "rb") as held:
        run_commit(root, {"vllm/a.py": A1}, L1, "P1")
        assert held.read() == A0
    if swap == "exchange" and exchanged != [True]:
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here: the fallback case covers this system")
    assert exchanged == ([True] if swap == "exchange" else [False])
    assert target.read_bytes() == A1
    assert os.lstat(target).st_ino != old_ino
    assert os.lstat(target).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in cache.iterdir()) == ["b.cpython-311.pyc"]
    assert not [p for p in root.rglob("*") if TEMP_MARK in p.name or ".sndr-foreign-" in p.name]


# ----------------------------------------------------------------------------- recovery


@pytest.mark.parametrize(("scenario", "point"), CRASH_CASES)
def test_a_commit_killed_at_any_step_recovers_to_exactly_the_tree_before(tmp_path, scenario, point):
    root, spec, new_ledger = prepared(tmp_path, scenario)
    before = snapshot(root)
    status = commit_in_a_child_killed_at(root, spec, new_ledger, point)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"the child did not die at {point}"
    journal = root / ".sndr/journal.json"
    tree = TreeRoot(root)
    if point == "after_commit":  # the set was complete and the journal gone: nothing to undo
        assert not journal.exists()
        with tree.lock():
            assert recover(tree) == []
        for rel, after in spec.items():
            assert ((root / rel).read_bytes() if after is not None else None) == after
            assert after is not None or not (root / rel).exists()
        assert tree.read_ledger() == new_ledger
        return
    assert journal.exists() == (point != "after_lock")
    with tree.lock():
        restored = recover(tree)
    assert snapshot(root) == before  # files, created directories, ledger, created-dirs.json; no journal, no temp
    assert set(restored) <= set(spec)
    if point.startswith("after_replace") or point in ("before_ledger", "after_ledger"):
        assert restored  # a target had been swapped: recovery put its before-bytes back
    assert TreeRoot(root).read_ledger() == SCENARIOS[scenario][1]
    with tree.lock():
        assert recover(tree) == []  # done once, for good


@pytest.mark.parametrize(("scenario", "point"),
                         [c for c in CRASH_CASES if c[1] not in ("after_lock", "after_commit")])
def test_an_exception_at_any_step_rolls_the_set_back_in_process(tmp_path, monkeypatch, scenario, point):
    root, spec, new_ledger = prepared(tmp_path, scenario)
    before = snapshot(root)

    class Interrupted(Exception):
        pass

    def fault(at: str) -> None:
        if at == point:
            raise Interrupted(at)

    monkeypatch.setattr(commit_mod, "_fault", fault)
    with pytest.raises(Interrupted):
        run_commit(root, spec, new_ledger, "P2")
    assert snapshot(root) == before


def test_recovery_refuses_a_journal_that_does_not_describe_the_tree_and_changes_nothing(tmp_path):
    root, spec, new_ledger = prepared(tmp_path, "patch")
    status = commit_in_a_child_killed_at(root, spec, new_ledger, "after_replace:1")
    assert os.WIFSIGNALED(status)
    assert (root / "vllm/b.py").read_bytes() == B2
    (root / "vllm/b.py").write_bytes(b"# neither its before- nor its after-bytes\n")
    held = snapshot(root)
    tree = TreeRoot(root)
    with tree.lock(), pytest.raises(SndrError) as exc:
        recover(tree)
    assert exc.value.problems[0].code == "journal_mismatch"
    assert exc.value.problems[0].file == "vllm/b.py"
    assert snapshot(root) == held  # a.py stays swapped, the journal stays: nothing is guessed


# ----------------------------------------------------------------------------- lock


def _lock_in_child(root: Path, shared: bool, w: int) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            with TreeRoot(root).lock(shared=shared) as got:
                os.write(w, b"1" if got else b"0")
        except BaseException:  # noqa: BLE001
            code = 3
        os._exit(code)
    return pid


@pytest.mark.parametrize("other_shared", [False, True])
def test_a_writer_holds_every_other_process_off_until_it_releases(tmp_path, other_shared):
    root = make_tree(tmp_path)
    r, w = os.pipe()
    try:
        with TreeRoot(root).lock() as got:
            assert got is True
            pid = _lock_in_child(root, other_shared, w)
            assert select.select([r], [], [], 0.5)[0] == [], "another process got the lock while a writer held it"
        assert select.select([r], [], [], 30)[0] == [r]
        assert os.read(r, 1) == b"1"
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        os.close(r)
        os.close(w)


def test_readers_share_the_lock(tmp_path):
    root = make_tree(tmp_path)
    with TreeRoot(root).lock():
        pass  # the state directory exists from now on
    r, w = os.pipe()
    try:
        with TreeRoot(root).lock(shared=True) as got:
            assert got is True
            pid = _lock_in_child(root, True, w)
            assert select.select([r], [], [], 30)[0] == [r], "a reader waited for another reader"
            assert os.read(r, 1) == b"1"
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        os.close(r)
        os.close(w)


def test_a_reader_never_creates_state_and_a_writer_does(tmp_path):
    root = make_tree(tmp_path)
    with TreeRoot(root).lock(shared=True) as got:
        assert got is False  # nothing to lock: sndr never wrote this tree
    assert not (root / ".sndr").exists()
    with TreeRoot(root).lock() as got:
        assert got is True
    assert (root / ".sndr/lock").is_file()


# ----------------------------------------------------------------------------- objects


def test_objects_are_content_addressed_and_checked_on_read(tmp_path):
    root = make_tree(tmp_path)
    tree = TreeRoot(root)
    shas = tree.put_objects([A0, B0, A0])
    assert shas == [sha(A0), sha(B0), sha(A0)]
    assert sorted(p.name for p in (root / ".sndr/objects").iterdir()) == sorted({sha(A0), sha(B0)})
    assert tree.get_object(sha(B0)) == B0
    (root / ".sndr/objects" / sha(B0)).write_bytes(b"tampered")
    for name, code in ((sha(B0), "object_corrupt"), (sha(C), "object_missing"), ("../../vllm/a.py", "object_missing")):
        with pytest.raises(SndrError) as exc:
            TreeRoot(root).get_object(name)
        assert exc.value.problems[0].code == code, name
        # the recovery path, for a corrupt copy as for a missing one (the corrupt one had no hint)
        assert exc.value.problems[0].hint == "the .sndr state was damaged; reinstall vLLM to get a pristine tree"


# ----------------------------------------------------------------------------- salvage


def _two_commits(tmp_path: Path) -> tuple[Path, Ledger, Ledger]:
    """P1 patches a.py; then P1+P2 keep a.py and patch b.py too. Both ledgers are in the object store."""
    root = make_tree(tmp_path)
    first = ledger("P1", {"vllm/a.py": (A0, A1)})
    both = ledger("P1P2", {"vllm/a.py": (A0, A1), "vllm/b.py": (B0, B2)})
    run_commit(root, {"vllm/a.py": A1}, first, "P1")
    run_commit(root, {"vllm/b.py": B2}, both, "P1P2")
    return root, first, both


def _corrupt_ledger(root: Path) -> bytes:
    path = root / ".sndr/ledger.json"
    data = json.loads(path.read_bytes())
    data["patches"] = ["edited-by-hand"]  # the checksum no longer matches
    raw = json.dumps(data).encode()
    path.write_bytes(raw)
    with pytest.raises(SndrError) as exc:
        TreeRoot(root).read_ledger()
    assert exc.value.problems[0].code == "ledger_corrupt"
    return raw


def test_salvage_puts_back_the_stored_ledger_naming_the_most_files_that_matches_the_tree(tmp_path):
    root, _, both = _two_commits(tmp_path)
    _corrupt_ledger(root)
    got = salvage_ledger(root)
    assert got.sha == sha(both.model_dump_json(indent=1).encode()) and got.problem is None
    assert TreeRoot(root).read_ledger() == both


def test_salvage_skips_a_stored_ledger_the_tree_no_longer_matches(tmp_path):
    root, first, both = _two_commits(tmp_path)
    _corrupt_ledger(root)
    (root / "vllm/b.py").write_bytes(b"# b.py edited by hand since\n")  # the later ledger no longer describes it
    got = salvage_ledger(root)
    assert got.sha == sha(first.model_dump_json(indent=1).encode()) and got.problem is None
    assert got.rejected == ((sha(both.model_dump_json(indent=1).encode()), "vllm/b.py"),)  # named, with why
    assert TreeRoot(root).read_ledger() == first


def test_salvage_writes_nothing_when_no_stored_ledger_matches(tmp_path):
    """No stored ledger matches and the tree's own does not read: a registered reason code (it was a bare None,
    and the command's line had no code), naming every stored ledger and the file it differs on."""
    root, first, both = _two_commits(tmp_path)
    raw = _corrupt_ledger(root)
    (root / "vllm/a.py").write_bytes(b"# a.py edited by hand since\n")  # every ledger named a.py patched
    got = salvage_ledger(root)
    assert got.sha is None and got.problem is not None and got.problem.code == "no_ledger_matches"
    assert CODES["no_ledger_matches"].exit == 1
    assert sorted(got.rejected) == sorted((sha(x.model_dump_json(indent=1).encode()), "vllm/a.py") for x in (first, both))
    for s, _ in got.rejected:
        assert f"{s[:12]}: vllm/a.py differs" in got.problem.message
    assert "none of the 2 ledgers sndr kept" in got.problem.message and "(ledger_corrupt)" in got.problem.message
    assert (root / ".sndr/ledger.json").read_bytes() == raw


def test_salvage_with_a_ledger_that_reads_has_nothing_to_repair(tmp_path):
    """A readable ledger and a file changed since apply: nothing to salvage (the code, and apply --verify to name
    the file), not the corrupt ledger's advice to reinstall vLLM and delete .sndr/."""
    root, _, both = _two_commits(tmp_path)
    (root / "vllm/a.py").write_bytes(b"# a.py edited by hand since\n")
    got = salvage_ledger(root)
    assert got.sha is None and got.problem is not None and got.problem.code == "nothing_to_salvage"
    assert "its ledger reads" in got.problem.message and "apply --verify" in (got.problem.hint or "")
    assert TreeRoot(root).read_ledger() == both


def test_salvage_on_a_tree_sndr_never_wrote_to_creates_nothing(tmp_path):
    """A tree without .sndr/ has no stored ledger: the salvage returns None and leaves it byte-identical (its
    lock created .sndr/ and .sndr/lock)."""
    root = make_tree(tmp_path)
    before = _snapshot(root)
    got = salvage_ledger(root)
    assert got.sha is None and got.problem is not None and got.problem.code == "nothing_to_salvage"
    assert _snapshot(root) == before
    assert not (root / ".sndr").exists()


def _snapshot(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under root: its mode and, for a file, its bytes."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[p.relative_to(root).as_posix()] = (st.st_mode, p.read_bytes() if p.is_file() else None)
    return out
