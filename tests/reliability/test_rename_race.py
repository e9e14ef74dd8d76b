"""Issue 33: a writer that replaces a target by rename() (editors, pip, git) during sndr's commit.

The replace window of one file is: temp written (``staged``), [fallback only: hard link of
the old file (``kept``)], swap (``swapped``), every displaced file compared, ledger written
(``compared``), final check of every path (``checked``). ``sndr.commit._window`` is a no-op
seam called at each point; these tests land a foreign write exactly there, for apply and for
revert, by rename and by an in-place append, with renameat2(RENAME_EXCHANGE) and with the
fallback (hard link + rename()). Every case ends one of two ways:

* exit 1 ``foreign_write_lost`` naming the file, the foreign bytes at the path (or in the
  aside copy the message names), the rest of the set rolled back, no journal, no temp file;
* exit 0 with the foreign write landed after the commit was complete (``checked``): the bytes
  are at the path, and ``--verify`` reports the file (exit 1): never "ok" over them.

Then a racing renamer (a thread that renames edited copies over the file in a tight loop)
against applies and reverts, bounded in time: no foreign line is ever lost, and an "ok"
always means the file holds sndr's bytes at the final check.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from sndr import commit as commit_mod
from sndr.__main__ import main as sndr_main
from sndr.apply import run_apply, run_revert, run_verify
from sndr.load import load_patch_set

from .test_bad_input import ANCHOR, FILE, FILES, REPL
from .test_hardening import SECOND, SECOND_ANCHOR, SECOND_NEW, _patches, _two_files

POINTS = ["staged", "kept", "swapped", "compared", "checked"]


def _asides(tree: Path) -> list[Path]:
    return sorted((tree / SECOND).parent.glob(f".{Path(SECOND).name}.sndr-foreign-*"))


def _rename_over(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.editor-save")
    tmp.write_bytes(data)
    os.rename(tmp, path)


@pytest.fixture(params=["exchange", "fallback"])
def swap_mode(request, monkeypatch):
    if request.param == "fallback":
        monkeypatch.setattr(commit_mod, "_renameat2_fn", [None])
    elif commit_mod._renameat2() is None:
        pytest.skip("renameat2 is not available here")
    return request.param


@pytest.mark.parametrize("how", ["rename", "append"])
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("op", ["apply", "revert"])
def test_a_foreign_write_at_each_point_of_the_window_is_never_lost(tmp_path, pin_subtree, monkeypatch, capsys,
                                                                   swap_mode, op, point, how):
    if point == "kept" and swap_mode == "exchange":
        pytest.skip("no hard link step with RENAME_EXCHANGE: the swap itself returns the old file")
    tree = pin_subtree(FILES)
    pdir = _patches(tmp_path, _two_files())
    args = ["--tree", str(tree), "--patches", str(pdir)]
    if op == "revert":
        assert sndr_main(["apply", *(args + ["-q"])]) == 0
        args.append("--revert")
    capsys.readouterr()
    start = {rel: (tree / rel).read_bytes() for rel in (FILE, SECOND)}
    line = f"# {how} by another process at {point}\n".encode()
    fired: list[bytes] = []

    def land(p: str, path: Path | None) -> None:
        if p != point or fired or (path is not None and path != tree / SECOND):
            return
        target = tree / SECOND
        data = target.read_bytes() + line
        if how == "rename":
            _rename_over(target, data)
        else:
            with open(target, "ab") as fh:
                fh.write(line)
        fired.append(data)

    monkeypatch.setattr(commit_mod, "_window", land)
    rc = sndr_main(["apply", *args])
    monkeypatch.undo()
    out = capsys.readouterr()
    text = out.out + out.err
    assert fired, f"the seam {point} was never reached"
    assert "Traceback" not in text, text
    now = (tree / SECOND).read_bytes()
    asides = _asides(tree)
    assert not (tree / ".sndr/journal.json").exists()
    assert not list(tree.rglob("*sndr-tmp*"))
    if point == "checked":
        # Landed after the commit was complete: sndr's "ok" stands, the bytes are at the path
        # (not lost), and verify does not agree with the ledger about that file.
        assert rc == 0, text
        assert now == fired[0] and not asides
        report = run_verify(tree, load_patch_set(pdir, packs=False))
        if op == "apply":
            assert report.exit_code == 1 and any(p.code == "hash_mismatch" and p.file == SECOND
                                                 for p in report.problems), report.problems
        return
    assert rc == 1, text
    assert "foreign_write_lost" in text and SECOND in text, text
    kept = [now] + [a.read_bytes() for a in asides]
    assert fired[0] in kept, "the foreign write was lost"
    for a in asides:
        assert a.name in text  # every aside copy is named
    assert (tree / FILE).read_bytes() == start[FILE]  # the rest of the set was rolled back
    ledger = tree / ".sndr/ledger.json"
    assert ledger.exists() == (op == "revert")
    if op == "revert":  # the ledger is the one before the revert: verify names exactly SECOND
        report = run_verify(tree, load_patch_set(pdir, packs=False))
        assert {p.file for p in report.problems if p.code == "hash_mismatch"} == {SECOND}, report.problems


@pytest.mark.parametrize("point", ["staged", "swapped", "compared"])
@pytest.mark.parametrize("op", ["apply", "revert"])
def test_a_foreign_rename_on_a_created_or_removed_file_is_never_lost(tmp_path, pin_subtree, monkeypatch, capsys,
                                                                     swap_mode, op, point):
    tree = pin_subtree(FILES)
    rel = "vllm/newpkg/mod.py"
    text = f'id = "PB0001"\ntitle = "new module"\n\n[[files]]\npath = "{rel}"\ncreate = """\nX = 1\n"""\n'
    pdir = _patches(tmp_path, {"PB0001-x.toml": text})
    args = ["--tree", str(tree), "--patches", str(pdir)]
    if op == "revert":
        assert sndr_main(["apply", *(args + ["-q"])]) == 0
        args.append("--revert")
    capsys.readouterr()
    data = b"Y = 2  # another process's file\n"

    def land(p: str, path: Path | None) -> None:
        if p == point and not (tree / rel).with_name("done").exists():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            _rename_over(tree / rel, data)
            (tree / rel).with_name("done").touch()

    monkeypatch.setattr(commit_mod, "_window", land)
    rc = sndr_main(["apply", *args])
    monkeypatch.undo()
    out = capsys.readouterr()
    assert rc == 1 and "Traceback" not in out.err, out.out + out.err
    assert rel in out.err and ("foreign_write_lost" in out.err or "changed_during_apply" in out.err), out.err
    kept = [(tree / rel).read_bytes()] + [a.read_bytes() for a in (tree / rel).parent.glob(".mod.py.sndr-foreign-*")]
    assert data in kept
    assert not (tree / ".sndr/journal.json").exists() and not list(tree.rglob("*sndr-tmp*"))


@pytest.mark.parametrize("op", ["apply", "revert"])
def test_racing_renamer_never_loses_a_write_and_never_says_ok_over_it(tmp_path, pin_subtree, monkeypatch, request,
                                                                       op):
    """Each run, a thread waits a random time within the length of one run, then puts new versions
    of the file in place in a tight loop (write a temp file, swap it in), so they land before the
    plan, between plan and commit and at every point of the commit window. It pauses at sndr's
    final check, the end of sndr's window. Bounded: 6 s of racing per op.

    The renamer swaps with RENAME_EXCHANGE itself, so it knows which of its versions it replaced
    itself: every other version was taken off the path by sndr and must be at the path or in an
    aside copy at the end. (A renamer that reads the path, edits and renames can lose its own
    lines: if it reads sndr's file mid-commit and renames over the version sndr just put back, it
    replaced that version itself. The deterministic tests above cover each point instead.)"""
    import random
    import shutil

    if commit_mod._renameat2() is None:
        pytest.skip("renameat2 is not available: the fallback's remaining window is documented")
    from .test_hardening import LIBC

    tree = pin_subtree(FILES)
    pdir = _patches(tmp_path, _two_files())
    patch_set = load_patch_set(pdir, packs=False)
    target = tree / SECOND
    gate = threading.Lock()  # held by the renamer around each swap; taken at sndr's final check
    paused = threading.Event()
    stop = threading.Event()
    versions: list[bytes] = []  # every version the renamer put in place, this run
    replaced_by_me: set[bytes] = set()
    renames = [0]
    rng = random.Random(33)

    def renamer(delay: float, n: int) -> None:
        if delay < 0:  # inotify-like: start the moment sndr's temp file for the target appears
            mark = f".{target.name}.sndr-tmp-"
            while not stop.is_set() and not any(e.startswith(mark) for e in os.listdir(target.parent)):
                pass
        else:
            time.sleep(delay)
        body = target.read_bytes()
        tmp = target.with_name(f".{target.name}.pip-new")
        k = 0
        while not stop.is_set() and not paused.is_set():
            with gate:
                if paused.is_set():
                    break
                body += f"# version {n}.{k}\n".encode()
                k += 1
                tmp.write_bytes(body)
                assert LIBC.renameat2(-100, bytes(tmp), -100, bytes(target), 2) == 0
                versions.append(body)
                out = tmp.read_bytes()  # what this swap took off the path
                if out in versions:
                    replaced_by_me.add(out)
                tmp.unlink()
            renames[0] += 1
            time.sleep(0.0001)

    def window(point: str, path: Path | None) -> None:
        if point == "compared":  # the final check comes next: no rename lands during it
            with gate:
                paused.set()

    def unpatch() -> None:
        for rel, new, old in ((FILE, REPL, ANCHOR), (SECOND, SECOND_NEW, SECOND_ANCHOR)):
            (tree / rel).write_bytes((tree / rel).read_bytes().replace(new.encode(), old.encode()))
        shutil.rmtree(tree / ".sndr", ignore_errors=True)

    t0 = time.perf_counter()
    run_apply(tree, patch_set)
    span = max(0.02, time.perf_counter() - t0)
    run_revert(tree)
    unpatch()
    monkeypatch.setattr(commit_mod, "_window", window)
    request.addfinalizer(lambda old=sys.getswitchinterval(): sys.setswitchinterval(old))
    sys.setswitchinterval(1e-5)  # interleave the two threads finely, not every 5 ms
    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + 6
    runs = 0
    while time.monotonic() < deadline:
        runs += 1
        if op == "revert":
            assert run_apply(tree, patch_set).ok
        paused.clear()
        stop.clear()
        delay = -1.0 if runs % 2 else rng.uniform(0, span * 1.2)
        t = threading.Thread(target=renamer, args=(delay, runs))
        t.start()
        try:
            report = run_apply(tree, patch_set) if op == "apply" else run_revert(tree)
            outcome = "ok" if report.ok else "+".join(sorted({p.code for p in report.problems}))
        except commit_mod.SndrError as exc:
            outcome = "+".join(sorted({p.code for p in exc.problems}))
        with gate:  # the renamer stops; what sndr said must hold now
            stop.set()
        t.join()
        text = target.read_bytes()
        if outcome == "ok":
            if op == "apply":
                entry = json.loads((tree / ".sndr/ledger.json").read_text())["files"][SECOND]
                assert commit_mod.sha256_bytes(text) == entry["patched_sha256"], f"run {runs}: ok over foreign bytes"
                assert run_verify(tree, patch_set).ok
            else:
                assert not (tree / ".sndr/ledger.json").exists() and SECOND_NEW.encode() not in text
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        kept = [text] + [a.read_bytes() for a in _asides(tree)]
        lost = [v for v in versions if v not in replaced_by_me and v not in kept]
        assert not lost, f"run {runs} ({outcome}): {len(lost)} version(s) of the renamer lost"
        assert not (tree / ".sndr/journal.json").exists()
        assert not list(tree.rglob("*sndr-tmp*"))
        for a in _asides(tree):
            a.unlink()
        versions.clear()
        replaced_by_me.clear()
        unpatch()  # the next run starts from an unpatched tree without sndr's state
    print(f"\n{op} x{runs} with a racing renamer ({renames[0]} renames): {outcomes}")
    assert set(outcomes) <= {"ok", "foreign_write_lost", "changed_during_apply", "modified_since_apply"}, outcomes
    assert outcomes.get("foreign_write_lost"), outcomes  # the race really was run (how many "ok": load decides)


@pytest.mark.parametrize("late", [False, True], ids=["writes-within-the-lease-wait", "writes-after-sndr-returns"])
@pytest.mark.parametrize("op", ["apply", "revert"])
def test_a_writer_holding_the_old_file_open_never_loses_its_write(tmp_path, pin_subtree, monkeypatch, capsys,
                                                                  op, late):
    """The old documented limit (a writer that opened the file before the swap and writes after
    sndr compared it): the displaced file is read under a read lease, granted only when no
    process holds it open for writing. A writer that writes and closes within the wait is seen;
    one that holds it open longer counts as a foreign write, and the old file goes back in place,
    where its late write lands. The revert case is what made
    test_racing_appender_never_loses_a_line[revert-20] fail once under load."""
    import fcntl

    if getattr(fcntl, "F_SETLEASE", None) is None:
        pytest.skip("no file leases on this system: the documented limit stands")
    tree = pin_subtree(FILES)
    pdir = _patches(tmp_path, _two_files())
    args = ["--tree", str(tree), "--patches", str(pdir)]
    if op == "revert":
        assert sndr_main(["apply", *(args + ["-q"])]) == 0
        args.append("--revert")
    capsys.readouterr()
    line = b"# written through a file descriptor opened before sndr's swap\n"
    held: list = []

    def seam(point: str, path: Path | None) -> None:
        if point == "staged" and path == tree / SECOND and not held:
            fh = open(tree / SECOND, "ab")  # noqa: SIM115 - held across the swap on purpose
            held.append(fh)
            if not late:
                def write_soon() -> None:
                    time.sleep(0.03)
                    fh.write(line)
                    fh.close()
                threading.Thread(target=write_soon).start()

    monkeypatch.setattr(commit_mod, "_window", seam)
    rc = sndr_main(["apply", *args])
    monkeypatch.undo()
    if late:
        held[0].write(line)
        held[0].close()
    out = capsys.readouterr()
    assert rc == 1 and "foreign_write_lost" in out.err and SECOND in out.err, out.out + out.err
    assert (tree / SECOND).read_bytes().endswith(line)  # at the path: nothing lost
    assert not _asides(tree)


def test_a_foreign_write_found_mid_swap_still_checks_the_files_swapped_before(tmp_path, pin_subtree, monkeypatch,
                                                                               capsys):
    """Fallback mode: an append lands on the first file before its swap, then a rename on the
    second file before its rename() stops the commit mid-way. The first file's displaced copy
    holds the append: it goes back too, and both files are named."""
    monkeypatch.setattr(commit_mod, "_renameat2_fn", [None])
    tree = pin_subtree(FILES)
    pdir = _patches(tmp_path, _two_files())
    pristine = {rel: (tree / rel).read_bytes() for rel in (FILE, SECOND)}
    order: list[Path] = []
    line = b"# appended to the first file\n"
    foreign = b"# the second file, renamed over it\n"

    def seam(point: str, path: Path | None) -> None:
        if point == "staged" and path is not None and path not in order:
            order.append(path)
            if len(order) == 1:
                with open(path, "ab") as fh:
                    fh.write(line)
        elif point == "kept" and len(order) == 2 and path == order[1]:
            _rename_over(path, foreign)

    monkeypatch.setattr(commit_mod, "_window", seam)
    rc = sndr_main(["apply", "--tree", str(tree), "--patches", str(pdir)])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert rc == 1, err
    first, second = (str(p.relative_to(tree)) for p in order)
    assert err.count("(foreign_write_lost)") == 2 and first in err and second in err, err
    assert (tree / first).read_bytes() == pristine[first] + line
    assert (tree / second).read_bytes() == foreign
    assert not (tree / ".sndr/journal.json").exists() and not list(tree.rglob("*sndr-tmp*"))


@pytest.mark.parametrize("how", ["rename", "append"])
def test_a_foreign_write_during_recovery_is_put_back_and_named(tmp_path, pin_subtree, monkeypatch, capsys,
                                                                swap_mode, how):
    """An apply is killed after both swaps (the journal stays); the next command rolls it back,
    and a writer lands on one file just before its restore: that file keeps the foreign bytes,
    the other is restored, the journal goes, and the command exits 1 naming the file."""
    import signal
    import subprocess
    import sys

    tree = pin_subtree(FILES)
    pdir = _patches(tmp_path, _two_files())
    pristine = {rel: (tree / rel).read_bytes() for rel in (FILE, SECOND)}
    env = dict(os.environ, SNDR_TEST_FAULT="after_replace:1")
    killed = subprocess.run([sys.executable, "-m", "sndr.apply", "--tree", str(tree), "--patches", str(pdir), "-q"],
                            env=env, capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL and (tree / ".sndr/journal.json").exists()
    assert REPL in (tree / FILE).read_text()  # both files hold the patched bytes
    line = b"# written while sndr rolled back\n"
    landed: list[bytes] = []

    def seam(point: str, path: Path | None) -> None:
        if point == "restore" and path == tree / SECOND and not landed:
            data = (tree / SECOND).read_bytes() + line
            if how == "rename":
                _rename_over(tree / SECOND, data)
            else:
                with open(tree / SECOND, "ab") as fh:
                    fh.write(line)
            landed.append(data)

    monkeypatch.setattr(commit_mod, "_window", seam)
    rc = sndr_main(["apply", "--tree", str(tree), "--patches", str(pdir), "--verify"])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert landed and rc == 1 and "foreign_write_lost" in err and SECOND in err and "Traceback" not in err, err
    assert (tree / SECOND).read_bytes() == landed[0]
    assert (tree / FILE).read_bytes() == pristine[FILE]  # restored
    assert not (tree / ".sndr/journal.json").exists() and not list(tree.rglob("*sndr-tmp*"))


LEASE_BREAKER = """
import subprocess, sys, time
from pathlib import Path
from sndr import commit
p = Path(sys.argv[1])
p.write_bytes(b"x" * 4_000_000)
opener = subprocess.Popen([sys.executable, "-c",
    "import time\\nt = time.time()\\nwhile time.time() - t < 1.5:\\n    open(%r, 'ab').close()" % str(p)])
reads, t = 0, time.time()
while time.time() - t < 1.5:
    commit._read_settled(p)
    reads += 1
opener.wait()
print("alive", reads)
"""


def test_a_lease_break_never_kills_sndr(tmp_path):
    """Another process opening the file for writing while sndr holds its read lease breaks the
    lease with SIGIO, whose default action ends the process ("I/O possible"): sndr ignores it
    for the lease's few syscalls. Run in a child, so a failure is an exit status, not a dead run."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", LEASE_BREAKER, str(tmp_path / "f")], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])))
    assert proc.returncode == 0 and "alive" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr)


def test_a_foreign_write_and_an_os_error_in_one_commit_keep_the_foreign_bytes_and_name_them(
        tmp_path, pin_subtree, monkeypatch, capsys):
    """A double fault: an append lands on the first file before its swap, then the second swap
    fails with EIO. The commit is rolled back (exit 2, os_error naming the file); the first
    file's displaced copy, with the foreign line, is kept beside it and named, not swept."""
    if commit_mod._renameat2() is None:
        pytest.skip("renameat2 is not available here")
    tree = pin_subtree(FILES)
    pdir = _patches(tmp_path, _two_files())
    line = b"# appended just before the first swap\n"
    order: list[Path] = []
    real = commit_mod._exchange

    def seam(point: str, path: Path | None) -> None:
        if point == "staged" and path is not None and path not in order:
            order.append(path)
            if len(order) == 1:
                with open(path, "ab") as fh:
                    fh.write(line)

    failed: list[bool] = []

    def failing_second(a: Path, b: Path) -> bool:
        if len(order) == 2 and not failed:  # once: the rollback's own swaps work
            failed.append(True)
            raise OSError(5, os.strerror(5))
        return real(a, b)

    monkeypatch.setattr(commit_mod, "_window", seam)
    monkeypatch.setattr(commit_mod, "_exchange", failing_second)
    rc = sndr_main(["apply", "--tree", str(tree), "--patches", str(pdir)])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert rc == 2 and "(os_error)" in err and "Traceback" not in err, err
    first = order[0]
    asides = list(first.parent.glob(f".{first.name}.sndr-foreign-*"))
    assert len(asides) == 1 and asides[0].read_bytes().endswith(line) and asides[0].name in err, err
    assert not (tree / ".sndr/journal.json").exists() and not list(tree.rglob("*sndr-tmp*")), err
