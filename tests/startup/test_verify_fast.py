"""``apply --verify``'s warm fast path (sndr/startup/verify.py) never disagrees with the full verifier.

Each scenario runs ``python -m sndr apply --verify`` (in-process, :func:`sndr.__main__.main`) twice on
the same tree and environment, once as it runs (the warm path first) and once with the warm path
told it has no answer (the full verifier), and compares
exit status and verdict lines; the fast path must answer only the ordinary
case and hand everything else to the full verifier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hook_fixtures import REPO, applied, make_tree, replace_file  # noqa: F401 (applied is a fixture)
from sndr.__main__ import build_parser
from sndr.__main__ import main as sndr_main
from sndr.commands import apply as apply_command
from sndr.startup import verify


class Calls:
    """Counts the runs of the full command (sndr.commands.apply._full)."""

    def __init__(self):
        self.full = 0
        self.real = apply_command._full

    def __call__(self, args):
        self.full += 1
        return self.real(args)


def full_cli(argv: list[str]) -> int:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verify, "answer", lambda *a, **k: None)
        return sndr_main(["apply", *argv])



def run_both(box, capsys, *extra) -> tuple[tuple[int, list[str], int], tuple[int, list[str]]]:
    """(fast entry: exit, stdout lines, full-verifier calls), (full verifier: exit, stdout lines)."""
    argv = ["--verify", "--tree", str(box.root), *extra]
    capsys.readouterr()
    calls = Calls()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(apply_command, "_full", calls)
        code = sndr_main(["apply", *argv])
    fast_out = capsys.readouterr().out.splitlines()
    full_code = full_cli(argv)
    full_out = capsys.readouterr().out.splitlines()
    return (code, fast_out, calls.full), (full_code, full_out)


def test_cold_then_warm(applied, capsys):
    (code, out, calls), (full_code, full_out) = run_both(applied, capsys)
    assert calls == 1 and code == full_code == 0 and out == full_out  # cold memo: the full verifier answered
    (code, out, calls), (full_code, full_out) = run_both(applied, capsys)
    assert calls == 0 and code == full_code == 0  # warm: answered without the full verifier
    assert out == [full_out[0], full_out[-1]]  # the full report's head and verdict lines, verbatim
    assert out[-1].startswith("ok  enabled set ") and applied.ledger()["patch_set_digest"].startswith(out[-1][16:])
    (code, out, calls), _ = run_both(applied, capsys, "-q")
    assert (code, out, calls) == (0, [], 0)


def _warm(box, capsys):
    run_both(box, capsys)
    (code, _, calls), _ = run_both(box, capsys)
    assert (code, calls) == (0, 0)


def _edit_ledger(box, **changes):
    path = box.root / ".sndr" / "ledger.json"
    led = json.loads(path.read_text())
    led.update(changes)
    replace_file(path, json.dumps(led))


SCENARIOS = {
    # name: (change the tree/env, exit status the full verifier gives)
    "tampered_file": (lambda box, mp: replace_file(box.root / "vllm/engine.py",
                                                   (box.root / "vllm/engine.py").read_text() + "#\n"), 1),
    "deleted_file": (lambda box, mp: os.unlink(box.root / "vllm/engine.py"), 1),
    "other_enable": (lambda box, mp: mp.setenv("SNDR_ENABLE_F0001", "0"), 1),
    "other_patch_text": (lambda box, mp: (box.patches / "F0002-sub.toml").write_text(
        (box.patches / "F0002-sub.toml").read_text().replace("A package __init__", "Retitled")), 1),
    "ledger_hand_edit": (lambda box, mp: _edit_ledger(box, counts={"applied": 99}), 2),
    "ledger_left_out": (lambda box, mp: _edit_ledger(box, left_out={"F0002": {
        "id": "F0002", "reason": "x", "code": "edit_drifted", "by": "keep_going", "on_failure": "fail"}}), 2),
    "new_vllm_version": (lambda box, mp: replace_file(box.root / "vllm/_version.py", '__version__ = "0.32.1"\n'), 1),
    "pending_journal": (lambda box, mp: (box.root / ".sndr" / "journal.json").write_text("{}"), None),
    "stale_probe": (lambda box, mp: (box.root / "vllm" / ".sndr-probe-999999").write_text(""), 0),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_anything_unusual_goes_to_the_full_verifier(applied, capsys, monkeypatch, name):
    _warm(applied, capsys)
    change, want = SCENARIOS[name]
    change(applied, monkeypatch)
    (code, out, calls), (full_code, full_out) = run_both(applied, capsys)
    assert calls == 1, f"{name}: the fast path answered {out}"
    if want is not None:
        assert code == full_code == want, (code, full_code, out, full_out)
    else:  # the first full run recovers the journal; both then agree with each other
        assert code == full_code
    (code, out, calls), (full_code, full_out) = run_both(applied, capsys)
    assert code == full_code and (calls == 1 or code == 0)


@pytest.mark.parametrize("extra", [["--json", "-"], ["-v"], ["--only", "F0001"], ["--profile", "x.toml"]])
def test_options_other_than_tree_patches_quiet_go_to_the_full_verifier(applied, capsys, extra):
    _warm(applied, capsys)
    def eligible(*argv: str) -> bool:
        return apply_command._fast_eligible(build_parser(["apply", *argv]).parse_args(["apply", *argv]))

    assert not eligible("--verify", "--tree", str(applied.root), *extra)
    assert eligible("--verify")  # no --tree: the installed vLLM, found without importing it
    assert eligible("--verify", "--tree=" + str(applied.root), "--patches", str(applied.patches), "-q")
    (code, out, calls), (full_code, full_out) = run_both(applied, capsys, *extra)
    assert calls == 1 and code == full_code

def test_the_hook_and_the_fast_path_attest_the_same_digest(applied, capsys):
    _warm(applied, capsys)
    (_, out, _), _ = run_both(applied, capsys)
    proc = applied.py("""
        import json, vllm
        import sndr.startup.hook as h
        h.register()
        print("OUT" + json.dumps(h._STATE.digest))
    """)
    digest = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("OUT")][-1][3:])
    assert out[-1] == f"ok  enabled set {digest[:12]}"


def test_the_stdlib_ledger_reader_reads_what_the_model_dumps(applied):
    """The fast path reads the ledger with sndr.state (no pydantic): what it accepts is the model's dump, key
    for key, and the checksum it checks is the model's."""
    from sndr import state
    from sndr.model import Ledger

    raw = (applied.root / ".sndr" / "ledger.json").read_bytes()
    led = Ledger.model_validate_json(raw)
    found = state.check_ledger(raw, "ledger.json")
    assert found.kind == "ok" and found.ledger == led.model_dump(mode="json")
    assert led.checksum == led.compute_checksum() == found.ledger["checksum"]


def test_a_warm_verify_process_imports_no_pydantic(applied, capsys):
    _warm(applied, capsys)
    env = applied.environ()
    for cmd in (["-m", "sndr.apply"], ["-m", "sndr", "apply"]):
        proc = subprocess.run([sys.executable, "-X", "importtime", *cmd, "--verify", "--tree", str(applied.root)],
                              capture_output=True, text=True, env=env, cwd=str(REPO), timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.splitlines()[-1].startswith("ok  enabled set ")
        imported = {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
        assert "pydantic" not in imported and "sndr.model" not in imported and "sndr.plan" not in imported
        assert "rich" not in imported and "sndr.startup.verify" in imported


def _verify_process(box, *extra, **env):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "sndr", "apply", "--verify", *extra],
                          capture_output=True, text=True, env=box.environ(**env), cwd="/", timeout=300)
    imported = {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    return proc, "pydantic" in imported


def test_without_tree_the_installed_vllm_is_verified_on_the_warm_path(applied):
    """``apply --verify`` with no --tree (the deploy recipe's and operators' call): the vLLM this interpreter
    imports is found without importing it, and taken only when it is the root the last full verify found."""
    cold, cold_pydantic = _verify_process(applied)
    assert cold.returncode == 0 and cold_pydantic, cold.stderr[-2000:]  # the full verifier, which primes
    warm, warm_pydantic = _verify_process(applied)
    assert warm.returncode == 0 and not warm_pydantic, warm.stderr[-2000:]
    lines = cold.stdout.splitlines()
    assert warm.stdout.splitlines() == [lines[0], lines[-1]] and lines[0].startswith(f"sndr verify: {applied.root} ")
    # Another vLLM ahead of it on the path: not the root the memo holds -> the full verifier names the new one.
    other = make_tree(applied.tmp / "other")
    moved, moved_pydantic = _verify_process(applied, PYTHONPATH=f"{other}{os.pathsep}{applied.root}{os.pathsep}{REPO}")
    assert moved_pydantic and moved.returncode != 0 and f"sndr verify: {other} " in moved.stdout + moved.stderr
