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
