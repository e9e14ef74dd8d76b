"""sndr/stderr.py: the one stderr warning line (startup's log and the caches' notices)."""

from __future__ import annotations

import io
import sys

from sndr import stderr
from sndr.startup import common


def test_a_keyed_line_is_said_once(monkeypatch, capsys):
    monkeypatch.setattr(stderr, "_SAID", set())
    stderr.say("cache refused", once_key="cache")
    stderr.say("cache refused", once_key="cache")
    stderr.say("unkeyed")
    stderr.say("unkeyed")
    assert capsys.readouterr().err == "sndr: cache refused\nsndr: unkeyed\nsndr: unkeyed\n"


def test_startup_log_is_the_same_line():
    assert common.log is stderr.say


def test_a_closed_stderr_never_raises(monkeypatch):
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stderr", closed)
    stderr.say("nobody hears this")  # must not raise out of an import hook
