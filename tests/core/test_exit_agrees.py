"""The final line and the exit status agree (issue 32 LOW): a Ctrl-C that lands after a command printed
its result (at the interpreter's shutdown) must not turn "ok reverted ... restored" into exit 130 or a
traceback. README's exit-code list names 130."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

LATE_SIGINT = textwrap.dedent("""
    import atexit, os, signal, sys, time
    from sndr.cli import exit_with, run

    def body():
        print("ok  reverted enabled set abc: 3 file(s) restored", flush=True)
        # the Ctrl-C arrives while the interpreter shuts down (atexit runs, then finalisation)
        atexit.register(lambda: time.sleep(0.5))
        signal.signal(signal.SIGALRM, lambda *a: os.kill(os.getpid(), signal.SIGINT))
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        return 0

    exit_with(lambda: run("sndr apply", body))
""")


def test_a_ctrl_c_after_the_last_line_does_not_change_the_exit_status():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", LATE_SIGINT], capture_output=True, text=True, env=env, timeout=60)
    assert proc.stdout.strip().splitlines()[-1].startswith("ok")
    assert proc.returncode == 0, proc.stderr
    assert "KeyboardInterrupt" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_an_interrupt_inside_the_command_is_its_last_line_and_130():
    code = textwrap.dedent("""
        from sndr.cli import exit_with, run

        def body():
            raise KeyboardInterrupt

        exit_with(lambda: run("sndr apply", body, on_interrupt=lambda: "nothing was written"))
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 130
    assert proc.stderr.strip().splitlines()[-1] == "sndr apply: interrupted; nothing was written"


def test_the_readme_lists_exit_130():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert re.search(r"`130`[^\n]*(Ctrl-C|interrupt)", readme), "README's exit codes must name 130 (Ctrl-C)"


def test_under_json_dash_an_interrupt_or_an_internal_error_still_leaves_one_document():
    """``apply --json -`` interrupted (Ctrl-C, exit 130) or stopped by a bug (exit 3) left stdout empty, so
    a JSON reader got nothing to parse where bad input gives it one document. Both now leave one
    (``ok`` false, ``exit_code``, ``problems`` with code ``interrupted`` / ``internal``); a command that
    already wrote its own document is not followed by a second."""
    import json

    def run_body(body: str) -> subprocess.CompletedProcess:
        code = textwrap.dedent("""
            import json, sys
            from sndr.cli import exit_with, expect_json, run, write_output

            def body():
                BODY

            expect_json("-")
            exit_with(lambda: run("sndr apply", body, on_interrupt=lambda: "nothing was written"))
        """).replace("BODY", body)
        env = dict(os.environ, PYTHONPATH=str(REPO))
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)

    for body, rc, want in (("raise KeyboardInterrupt", 130, "interrupted"),
                           ("raise RuntimeError('boom')", 3, "internal")):
        proc = run_body(body)
        assert proc.returncode == rc, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["ok"] is False and doc["exit_code"] == rc and doc["problems"][0]["code"] == want, doc
    proc = run_body("write_output('-', json.dumps({'ok': True}) + '\\n'); raise KeyboardInterrupt")
    assert proc.returncode == 130 and json.loads(proc.stdout) == {"ok": True}
