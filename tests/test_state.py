"""One ledger reader, one answer (sndr/state.py; issue 29, finding 1).

The same bad ledgers go to every place that reads a ledger: the startup hook's register path
(``hook._read_ledger``), ``sndr status`` (``status.tree_ledger`` / ``recheck_trees``), the ``--verify``
fast path (``verify.check``) and the full verifier behind it, and ``TreeRoot.read_ledger`` (apply,
revert, listing, preflight). Each must answer with the same code; a good ledger is read identically
by all of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from hook_fixtures import Box, applied, out_of, replace_file  # noqa: F401 (applied is a fixture)
from sndr import state
from sndr.__main__ import main as sndr_main
from sndr.commit import TreeRoot
from sndr.errors import SndrError
from sndr.startup import hook, status, verify


def _reseal(led: dict) -> str:
    body = {k: v for k, v in led.items() if k != "checksum"}
    led["checksum"] = hashlib.sha256(state.canonical_json(body).encode()).hexdigest()
    return json.dumps(led, indent=1)


def _wrong_checksum(box):
    path = box.root / ".sndr" / "ledger.json"
    led = json.loads(path.read_text())
    led["patch_set_digest"] = "0" * 64  # a hand edit that left the checksum as it was
    replace_file(path, json.dumps(led))


def _truncated(box):
    path = box.root / ".sndr" / "ledger.json"
    raw = path.read_text()
    replace_file(path, raw[: len(raw) // 2])


def _wrong_shape(box):  # the checksum is right, but an entry lacks a key sndr always writes
    path = box.root / ".sndr" / "ledger.json"
    led = json.loads(path.read_text())
    for entry in led["files"].values():
        del entry["created"]
    replace_file(path, _reseal(led))


def _not_an_object(box):
    replace_file(box.root / ".sndr" / "ledger.json", "[1, 2]")


def _nul_path(box):  # a valid checksum over a path no tree holds
    path = box.root / ".sndr" / "ledger.json"
    led = json.loads(path.read_text())
    led["files"]["vllm/a\x00b.py"] = next(iter(led["files"].values()))
    replace_file(path, _reseal(led))


def _symlinked_ledger(box):
    path = box.root / ".sndr" / "ledger.json"
    real = box.tmp / "elsewhere.json"
    shutil.copy(path, real)  # a good ledger, but reached through a link
    path.unlink()
    path.symlink_to(real)


def _symlinked_state_dir(box):
    state_dir = box.root / ".sndr"
    real = box.tmp / "elsewhere-state"
    shutil.move(str(state_dir), real)
    state_dir.symlink_to(real)


def _fifo_ledger(box):
    path = box.root / ".sndr" / "ledger.json"
    path.unlink()
    os.mkfifo(path)


def _oversized(box):
    path = box.root / ".sndr" / "ledger.json"
    with open(path, "r+b") as fh:
        fh.truncate(state.MAX_STATE_BYTES + 1)  # sparse: costs no disk


CASES = {
    "wrong_checksum": (_wrong_checksum, "ledger_corrupt"),
    "truncated_json": (_truncated, "ledger_corrupt"),
    "wrong_shape": (_wrong_shape, "ledger_corrupt"),
    "not_an_object": (_not_an_object, "ledger_corrupt"),
    "nul_path": (_nul_path, "ledger_corrupt"),
    "symlinked_ledger": (_symlinked_ledger, "symlink_refused"),
    "symlinked_state_dir": (_symlinked_state_dir, "symlink_refused"),
    "fifo_ledger": (_fifo_ledger, "state_unsafe"),
    "oversized": (_oversized, "file_too_large"),
}



def full_cli(argv: list[str]) -> int:
    """``python -m sndr apply ARGV`` answered by the full verifier (the warm path is told it has no answer)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verify, "answer", lambda *a, **k: None)
        return sndr_main(["apply", *argv])


def _warm_fast_path(box, capsys) -> None:
    argv = ["--verify", "--tree", str(box.root), "-q"]
    assert sndr_main(["apply", *argv]) == 0  # cold: the full verifier answers and primes the memos
    assert verify.check(str(box.root), None, os.environ) is not None  # warm: the fast path answers
    capsys.readouterr()


def answers(box, capsys) -> dict[str, object]:
    """What each reader says about the tree's ledger now: a code, or ``ok``."""
    root = str(box.root)
    out: dict[str, object] = {}

    found = state.read_ledger(root)
    out["state.read_ledger"] = found.code if found.kind == "corrupt" else found.kind

    proc = hook._Process(False)
    led = hook._read_ledger(root, proc)  # what register() runs on a tree patched on disk
    if led is None:
        assert len(proc.problems) == 1 and proc.missing and proc.missing[0].startswith("ledger:"), proc.problems
        out["hook register"] = proc.problems[0].rsplit("(", 1)[1].split(")")[0]
    else:
        assert not proc.problems
        out["hook register"] = "ok"

    led2, problem = status.tree_ledger(root)  # sndr status
    out["status"] = "ok" if led2 is not None else problem.rsplit("(", 1)[1].rstrip(")") if problem else "absent"
    findings = status.recheck_trees([{"mode": "disk", "tree": root}])
    if out["status"] != "ok":
        assert findings == [problem]

    try:
        out["TreeRoot.read_ledger"] = "ok" if TreeRoot(root).read_ledger() is not None else "absent"
    except SndrError as exc:
        out["TreeRoot.read_ledger"] = exc.problems[0].code

    fast = verify.check(root, None, os.environ)
    capsys.readouterr()
    code = full_cli(["--verify", "--tree", root])
    text = capsys.readouterr()
    text = text.out + text.err
    if code == 0:
        assert fast is not None, "the fast path declined a tree the full verifier finds ok"
        out["verify"] = "ok"
    else:
        assert fast is None, "the fast path said ok where the full verifier does not"
        assert code == 2 and "Traceback" not in text, text
        out["verify"] = next((c for c in CODES if f"({c})" in text or f"[{c}]" in text or f"{c}:" in text), text)
    return out


CODES = sorted({c for _, c in CASES.values()})


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_reader_gives_one_answer_for_a_bad_ledger(applied, capsys, case):
    _warm_fast_path(applied, capsys)
    damage, code = CASES[case]
    damage(applied)
    got = answers(applied, capsys)
    assert got == {k: code for k in got}, got


def test_a_good_ledger_is_read_identically_by_every_reader(applied, capsys):
    _warm_fast_path(applied, capsys)
    got = answers(applied, capsys)
    assert got == {k: "ok" for k in got}, got
    root = str(applied.root)
    raw = json.loads((applied.root / ".sndr" / "ledger.json").read_text())
    found = state.read_ledger(root)
    assert found.ledger == raw
    assert hook._read_ledger(root, hook._Process(False)) == raw
    assert status.tree_ledger(root) == (raw, None)
    assert status.recheck_trees([{"mode": "disk", "tree": root}]) == []
    model = TreeRoot(root).read_ledger()
    assert model is not None and model.model_dump(mode="json") == raw


def test_no_ledger_is_absent_for_every_reader(tmp_path):
    box = Box(tmp_path)
    root = str(box.root)
    assert state.read_ledger(root).kind == "absent"
    proc = hook._Process(False)
    assert hook._read_ledger(root, proc) is None and not proc.problems
    assert status.tree_ledger(root) == (None, None)
    assert TreeRoot(root).read_ledger() is None


def test_the_hook_refuses_a_wrong_checksum_in_a_vllm_process(applied):
    """The defect this module fixed: register() used to accept a hand-edited ledger. Now it names it (the
    code, the file) and, under SNDR_STRICT=1, aborts startup, as ``--verify`` refuses it."""
    _wrong_checksum(applied)
    code = """
        import json
        import sndr.startup.hook as h
        try:
            h.register()
            print("OUT" + json.dumps({"mode": h._STATE.mode, "problems": h._STATE.problems}))
        except Exception as exc:
            print("OUT" + json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
    """
    out = out_of(applied.py(code))
    assert out["mode"] != "disk", out
    assert any("ledger_corrupt" in p and "ledger.json" in p and "checksum" in p for p in out["problems"]), out
    out = out_of(applied.py(code, SNDR_STRICT="1"))
    assert out.get("raised") == "StrictError" and "ledger_corrupt" in out["message"], out


def test_probes_are_found_where_apply_and_verify_look_and_pid_alive_is_one_rule(tmp_path):
    """One probe finder for apply's sweep and the fast path's fallback: the root, .sndr and every directory
    of a named file, never a sibling directory; a name without a pid is found (verify falls back) but
    carries no pid (apply never removes it)."""
    import subprocess
    import sys

    root = Box(tmp_path).root
    (root / ".sndr").mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    made = {root / f".sndr-probe-{dead.pid}": dead.pid, root / ".sndr" / f".sndr-probe-{os.getpid()}": os.getpid(),
            root / "vllm" / ".sndr-probe-x": None}
    for p in made:
        p.write_bytes(b"")
    (root / "other").mkdir()
    (root / "other" / ".sndr-probe-1").write_bytes(b"")  # not a directory of a named file
    found = dict(state.find_probes(str(root), ["vllm/engine.py"]))
    assert found == {str(p): pid for p, pid in made.items()}
    assert state.pid_alive(os.getpid()) and not state.pid_alive(dead.pid)
    from sndr.apply import stale_probes

    assert stale_probes(TreeRoot(root), {"vllm/engine.py"}) == [root / f".sndr-probe-{dead.pid}"]
