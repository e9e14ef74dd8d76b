"""``sndr status`` says what the live processes run, compared with the tree as it is now (issue 32 HIGH 1,
issue 33 items 4, 5 and 8).

* A re-apply with another enabled set under a live process leaves a tree that matches its *new*
  ledger; the process attested the old set and the old file hashes, and every module it imports
  from now on is not what it attested. ``status --live`` (and ``sndr_status_ok``) must fail.
* Records are read bounded, never through a FIFO, a device or a link, and validated before any
  field is trusted: a bogus record is a finding, never "ok".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hook_fixtures import REPO, Box, box, out_of  # noqa: F401 (box is a fixture)
from sndr.__main__ import main as sndr_main
from sndr.startup.attest import FORMAT, MAX_RECORD_BYTES, validate_record
from sndr.state import proc_start_ticks

REGISTER = """
    import json, sys
    import vllm
    import sndr.startup.hook as h
    h.register()
    print("OUT" + json.dumps({"digest": h._STATE.digest, "missing": h._STATE.missing}), flush=True)
"""

#: A process that registers, says so, and stays alive until its stdin closes.
LIVE = REGISTER + """
    sys.stdin.read()
"""


class Live:
    """A registered process that keeps running (what a vLLM worker is while status probes it)."""

    def __init__(self, box, **env):
        self.proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LIVE)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(box.tmp),
                                     env=box.environ(**env))
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("OUT"), self.proc.stderr.read() if self.proc.stderr else line
        self.out = json.loads(line[3:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.communicate("", timeout=60)


@pytest.fixture
def live(box):
    started: list[Live] = []

    def start(**env) -> Live:
        p = Live(box, **env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def _status(box, capsys, *extra) -> tuple[int, str]:
    rc = sndr_main(["status", "--run-dir", str(box.run_dir), *extra])
    return rc, capsys.readouterr().out


def test_reapply_with_another_set_under_a_live_process_fails_status_live(box, live, capsys, tmp_path):
    """The issue's reproduction on the synthetic tree: apply, a live process, apply --only another set."""
    box.apply()
    proc = live()
    prom = tmp_path / "s.prom"
    rc, out = _status(box, capsys, "--live", "--prometheus", str(prom))
    assert rc == 0, out
    assert "sndr_status_ok 1.0" in prom.read_text()
    before = box.ledger()["patch_set_digest"]
    assert proc.out["digest"] == before
    box.apply(SNDR_ENABLE_F0002="0")  # vllm/sub/__init__.py goes back to pristine; a new ledger
    after = box.ledger()["patch_set_digest"]
    assert after != before
    rc, out = _status(box, capsys, "--live", "--prometheus", str(prom))
    assert rc == 1, out
    assert (f"pid {proc.proc.pid} (main): the tree no longer holds the patch set this process attested: the tree "
            f"was re-applied since it attested: it runs enabled set {before[:12]}, the tree held ledger "
            f"{before[:12]} then and holds {after[:12]} now") in out
    assert "1 file(s) do not hold the bytes it attested: vllm/sub/__init__.py" in out
    assert "restart it" in out and out.rstrip().endswith("finding(s)") and "\nok\n" not in out
    text = prom.read_text()
    assert "sndr_status_ok 0.0" in text and "sndr_status_findings 1.0" in text
    # A process started now attests what the tree holds: once the old one is gone, status is ok again.
    proc.stop()
    live(SNDR_ENABLE_F0002="0")
    rc, out = _status(box, capsys, "--live")
    assert rc == 0, out


def test_a_revert_and_reapply_of_the_same_set_is_still_the_attested_tree(box, live, capsys):
    """Same set, same bytes: not a finding (the comparison is by hash, not by the ledger's mtime)."""
    box.apply()
    live()
    box.apply()  # nothing to do
    rc, out = _status(box, capsys, "--live")
    assert rc == 0, out


def test_a_revert_then_a_reapply_under_a_live_process_is_a_finding(box, live, capsys):
    """The new-user review (stop 44): after a revert a live process imported pristine modules; the re-apply
    of the same set put the same bytes and the same ledger back, and status said ok. Every commit replaces
    the ledger file, whose identity the process attested: a commit since its start is a finding."""
    from sndr.apply import run_revert

    box.apply()
    proc = live()
    assert _status(box, capsys, "--live")[0] == 0
    assert run_revert(box.root).ok
    box.apply()
    rc, out = _status(box, capsys, "--live")
    assert rc == 1 and f"pid {proc.proc.pid} (main)" in out and "rewritten by a commit since it attested" in out, out
    assert "restart it" in out


def test_a_reused_pid_is_not_the_process_that_attested(box, capsys):
    """vLLM is pid 1 in each container: a record of a container's pid 1 that exited read "running" in the
    next container (the new-user review, stop 44). The process's start time (/proc) is attested with it."""
    if proc_start_ticks(os.getpid()) is None:
        pytest.skip("no /proc/<pid>/stat here")
    box.apply()
    path = _own_record(box)
    rec = json.loads(path.read_text())
    assert _status(box, capsys, "--live")[0] == 0
    rec["proc_start"] += 1  # the same pid, another start: another process
    path.write_text(json.dumps(rec))
    rc, out = _status(box, capsys, "--live", "--prune")
    assert rc == 1 and "no attestation records" in out and not path.exists(), out


def test_what_a_process_found_at_startup_is_a_finding(box, capsys):
    box.apply()
    path = _own_record(box)
    rec = json.loads(path.read_text())
    rec["problems"] = ["SNDR_ENABLE_PK004 names no patch (did you mean PK0004?)"]
    path.write_text(json.dumps(rec))
    rc, out = _status(box, capsys, "--live")
    assert rc == 1 and f"pid {os.getpid()} (" in out and "SNDR_ENABLE_PK004 names no patch" in out, out


def _own_record(box) -> Path:
    """A record of an exited process rewritten for this (live) test process: a scripted live record."""
    box.py(REGISTER)
    [path] = sorted(box.run_dir.glob("*.json"))
    rec = json.loads(path.read_text())
    rec["pid"] = os.getpid()
    rec["proc_start"] = proc_start_ticks(os.getpid())  # this process's, or status takes it for a reused pid
    new = box.run_dir / f"{os.getpid()}-{time.time_ns()}.json"
    path.unlink()
    new.write_text(json.dumps(rec))
    return new


def test_scripted_record_whose_file_hashes_differ_from_the_tree(box, capsys):
    """Per-file hashes: a record that attested other bytes than the tree holds (same ledger) is a finding."""
    box.apply()
    path = _own_record(box)
    rc, out = _status(box, capsys, "--live")
    assert rc == 0, out
    rec = json.loads(path.read_text())
    rec["files"]["vllm/engine.py"] = "0" * 64
    path.write_text(json.dumps(rec))
    rc, out = _status(box, capsys, "--live")
    assert rc == 1 and "1 file(s) do not hold the bytes it attested: vllm/engine.py" in out, out
    rec["files"].pop("vllm/engine.py")  # a file the tree's ledger names that the process never verified
    path.write_text(json.dumps(rec))
    rc, out = _status(box, capsys, "--live")
    assert rc == 1 and "do not hold the bytes it attested: vllm/engine.py" in out, out


def test_scripted_record_after_a_revert_is_a_finding(box, capsys):
    from sndr.apply import run_revert

    box.apply()
    _own_record(box)
    assert run_revert(box.root).ok
    rc, out = _status(box, capsys, "--live")
    assert rc == 1 and "the tree has no ledger any more" in out, out


# ----------------------------------------------------------------------------- records that are not records


def _valid_record(box) -> dict:
    box.apply()
    box.py(REGISTER)
    [path] = sorted(box.run_dir.glob("*.json"))
    rec = json.loads(path.read_text())
    path.unlink()
    return rec


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One applied box and the valid record of a registered process, shared by the record-shape cases
    (each writes its own bad record and removes it): one apply and one child for the nine, not nine."""
    box = Box(tmp_path_factory.mktemp("recorded"))
    return box, _valid_record(box)


@pytest.mark.parametrize(("change", "why"), [
    ({"pid": -1, "start": 0}, "pid: Input should be greater than 0"),
    ({"pid": "12"}, "pid: Input should be a valid integer"),
    ({"pid": 12.5}, "pid: Input should be a valid integer"),
    ({"pid": True}, "pid: Input should be a valid integer"),
    ({"pid": 10 ** 30}, "its pid"),  # an int, but not the one the name says (and no process has it)
    ({"mode": "bogus"}, "mode: Input should be"),
    ({"missing_required": "F0001"}, "missing_required: Input should be a valid list"),
    ({"files": None}, "files: Input should be a valid dictionary"),
    ({"format": 1}, "format 1, this sndr reads format 2"),
])
def test_a_record_of_the_wrong_shape_is_a_finding_never_ok(recorded, capsys, change, why):
    box, valid = recorded
    rec = dict(valid)
    rec.update(change)
    path = box.run_dir / f"{os.getpid()}-1.json"
    path.write_text(json.dumps(rec))
    try:
        assert [p.name for p in box.run_dir.iterdir()] == [path.name]  # the only record status reads
        for extra in ([], ["--live"], ["--json", "-"]):
            rc, out = _status(box, capsys, *extra)
            assert rc == 1, out
            assert "not a valid attestation record" in out and why in out, out
            if extra == ["--json", "-"]:
                data = json.loads(out)
                assert data["ok"] is False and data["processes"] == []
    finally:
        path.unlink()


def test_the_bogus_record_of_the_issue_is_a_finding(box, capsys):
    """``{"format":1,"pid":-1,"start":0}`` (and the same in this format): never ok, never kill(-1, 0)."""
    box.run_dir.mkdir(mode=0o700)
    for fmt in (1, FORMAT):
        (box.run_dir / "1-1.json").write_text(json.dumps({"format": fmt, "pid": -1, "start": 0}))
        rc, out = _status(box, capsys, "--live")
        assert rc == 1 and "not a valid attestation record" in out and "\nok\n" not in out, out
        assert validate_record({"format": fmt, "pid": -1, "start": 0}) is not None


def _status_subprocess(run_dir: Path, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNDR_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "sndr", "status", "--run-dir", str(run_dir), *extra],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd="/")


def test_a_fifo_record_does_not_hang_status(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    os.mkfifo(run / "123-1.json", 0o600)
    t0 = time.monotonic()
    proc = _status_subprocess(run, "--live")  # a blocking open() would wait for a writer forever (timeout raises)
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 1, proc.stderr
    assert "123-1.json: unreadable attestation (attestation record is not a regular file (FIFO, socket or " \
           "device), not_regular)" in proc.stdout


def test_a_record_linked_to_dev_zero_is_read_with_a_bound(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    os.symlink("/dev/zero", run / "123-1.json")
    big = run / "124-1.json"
    with open(big, "wb") as fh:  # a regular file past the bound: refused by its size, never read whole
        fh.truncate(MAX_RECORD_BYTES + 1)
    t0 = time.monotonic()
    proc = _status_subprocess(run, "--live")
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 1, proc.stderr
    assert "123-1.json: unreadable attestation (attestation record is a symlink, which sndr does not follow, " \
           "symlink_refused)" in proc.stdout
    assert f"over the {MAX_RECORD_BYTES}-byte limit, file_too_large" in proc.stdout


def test_a_fifo_in_the_tree_does_not_hang_status(box):
    """status re-hashes the tree: a target or the ledger replaced by a FIFO is a finding, not a hang."""
    box.apply()
    box.py(REGISTER)
    eng = box.root / "vllm" / "engine.py"
    eng.unlink()
    os.mkfifo(eng, 0o600)
    proc = _status_subprocess(box.run_dir)
    assert proc.returncode == 1 and "engine.py: cannot be re-hashed" in proc.stdout, proc.stdout + proc.stderr
    os.unlink(eng)
    ledger = box.root / ".sndr" / "ledger.json"
    ledger.unlink()
    os.mkfifo(ledger, 0o600)
    proc = _status_subprocess(box.run_dir)
    # the one ledger reader (sndr.state) names the file, what it is, and its code
    assert proc.returncode == 1 and "ledger.json is not a regular file (FIFO, socket or device) (state_unsafe)" \
        in proc.stdout, proc.stdout


def test_status_never_signals_a_process_group(box, capsys, monkeypatch):
    """A validated pid is > 0: ``kill(0 or -1, 0)`` (every process of the group, or every process) is never
    asked whether a bogus record's process is alive."""
    asked: list[int] = []
    real = os.kill

    def spy(pid, sig):
        asked.append(pid)
        return real(pid, sig)

    monkeypatch.setattr(os, "kill", spy)
    box.run_dir.mkdir(mode=0o700)
    for pid in (-1, 0):
        (box.run_dir / f"{pid}-1.json").write_text(json.dumps({"format": FORMAT, "pid": pid, "start": 1}))
    rc, _ = _status(box, capsys, "--live")
    assert rc == 1 and asked == []  # neither record is trusted, so no pid of theirs is probed


def test_status_tree_follows_the_one_tree_rule(tmp_path, monkeypatch, capsys):
    """``status --tree`` finds the run directory the hook keys by the directory holding vllm/: naming
    ``vllm/`` itself reads the same records; a path that is no tree is exit 2 naming it, not "no
    attestation records" in a run directory nobody writes to."""
    from sndr.errors import SndrError
    from sndr.startup import attest, status

    monkeypatch.delenv("SNDR_RUN_DIR", raising=False)
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    site = tmp_path / "site"
    expected = attest.run_dir(str(site))
    assert status.run_dir_for(None, str(site)) == expected
    assert status.run_dir_for(None, str(site / "vllm")) == expected
    for tree, code in [(str(tmp_path / "missing"), "tree_not_found"), (str(tmp_path), "not_a_tree"),
                       ("vllm==0.32.0", "bad_tree_spec")]:
        with pytest.raises(SndrError) as exc:
            status.run_dir_for(None, tree)
        assert exc.value.problems[0].code == code, (tree, exc.value.problems)
    assert sndr_main(["status", "--tree", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "tree_not_found" in err and str(tmp_path / "missing") in err, err


def test_an_untrusted_run_directory_is_refused_with_one_json_document(box, capsys):
    """A run directory another user could write: exit 2 naming it (state_unsafe), and under --json - stdout
    holds one document saying so (it printed its own line and left stdout empty before)."""
    box.run_dir.mkdir(mode=0o700)
    os.chmod(box.run_dir, 0o777)
    rc, out = _status(box, capsys, "--json", "-")
    assert rc == 2
    data = json.loads(out)
    assert data["ok"] is False and [p["code"] for p in data["problems"]] == ["state_unsafe"]
    assert str(box.run_dir) in data["problems"][0]["file"] and "cannot be trusted" in data["problems"][0]["message"]


def test_a_run_dir_that_cannot_be_trusted_leaves_no_old_ok_gauge(tmp_path):
    """`status --prometheus FILE` exited 2 on a symlinked run dir and left an earlier run's sndr_status_ok 1 in
    FILE (the documented cron line drops stderr): the new-user review, stop 44."""
    pytest.importorskip("prometheus_client")
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    prom = tmp_path / "s.prom"
    prom.write_text("sndr_status_ok 1.0\n")
    proc = _status_subprocess(link, "--prometheus", str(prom))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = prom.read_text()
    assert "sndr_status_ok 0.0" in text and "sndr_status_ok 1.0" not in text, text


def test_status_names_who_disagrees_and_on_what(box, capsys):
    """Two digests only ("processes disagree on the patch set: 074dcb7247a8, 0d8ea41e82e1") named neither
    the processes nor the patches (the new-user review, stop 44)."""
    box.apply()
    path = _own_record(box)
    rec = json.loads(path.read_text())
    other = dict(rec, patch_set_digest="f" * 64, enabled=[*rec["enabled"], "PX0099"])
    twin = box.run_dir / f"{os.getpid()}-{time.time_ns() + 1}.json"
    twin.write_text(json.dumps(other))
    rc, out = _status(box, capsys, "--live")
    assert rc == 1 and f"{'f' * 12} (pid {os.getpid()})" in out and "enabled in some, not all: PX0099" in out, out


def test_an_old_format_record_of_a_gone_process_does_not_fail_live_status_forever(box, capsys):
    box.apply()
    own = _own_record(box)
    dead = box.run_dir / "999999-1.json"  # pid 999999: no such process here
    dead.write_text(json.dumps({"format": 1, "pid": 999999}))
    rc, out = _status(box, capsys, "--live")
    assert rc == 0 and "999999" not in out, out
    rc, out = _status(box, capsys)
    assert rc == 1 and "999999-1.json: not a valid attestation record" in out, out  # without --live: named
    assert _status(box, capsys, "--live", "--prune")[0] == 0 and not dead.exists() and own.exists()


def test_tree_narrows_a_shared_run_dir_to_its_processes(box, capsys, tmp_path):
    box.apply()
    path = _own_record(box)
    rec = json.loads(path.read_text())
    rec["tree"] = str(tmp_path / "another-tree")
    path.write_text(json.dumps(rec))
    rc, out = _status(box, capsys, "--live", "--tree", str(box.root))
    assert rc == 1 and "no attestation records" in out and f"of processes of {os.path.realpath(box.root)}" in out, out


def test_hook_install_never_replaces_a_symlink_or_fifo(tmp_path, capsys):
    site = tmp_path / "site"
    site.mkdir()
    pth = site / "_sndr_hook.pth"
    pth.symlink_to(tmp_path / "elsewhere")
    assert sndr_main(["hook", "install", "--site", str(site)]) == 2
    assert pth.is_symlink() and not (tmp_path / "elsewhere").exists()
    pth.unlink()
    os.mkfifo(pth)
    assert sndr_main(["hook", "install", "--site", str(site)]) == 2
    assert "output_refused" in capsys.readouterr().err
