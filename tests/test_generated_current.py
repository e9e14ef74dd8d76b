"""The committed manifest and bump report match the shipped patch set (CI fails when stale)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_manifest_and_preflight_report_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "regenerate.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_manifest_check_command_agrees():
    r = subprocess.run([sys.executable, "-m", "sndr", "manifest", "check"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
