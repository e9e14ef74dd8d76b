"""sndr/render.py: the one console every report is printed through, and its width rule (``make_console``)."""

from __future__ import annotations

import fcntl
import io
import os
import struct
import termios

import pytest
from rich.table import Table

from sndr.render import PIPE_WIDTH, console_width, make_console

WORDS = [f"PG{n:04d}/edit-number-{n}" for n in range(60)]  # a verdict's "which" cell, wrapped over many lines


def _verdict_table() -> Table:
    t = Table(show_header=True, box=None, pad_edge=False)
    t.add_column("verdict")
    t.add_column("edits", justify="right")
    t.add_column("which")
    t.add_row("applies", "40", ", ".join(WORDS))
    t.add_row("merged", "1", "PX0001/one")
    return t


def test_off_a_terminal_a_wrapped_table_is_not_padded(monkeypatch):
    """A pipe or a CI log: the table wraps at PIPE_WIDTH (fixed) and no line carries the spaces rich pads
    cells with (every wrapped row was padded to PIPE_WIDTH, 240 columns)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = make_console(file=out)
    assert console.width == PIPE_WIDTH
    console.print(_verdict_table())
    lines = out.getvalue().splitlines()
    assert len(lines) > 4, out.getvalue()  # the long cell wrapped
    assert all(len(ln) <= PIPE_WIDTH for ln in lines), [len(ln) for ln in lines]
    padded = [ln for ln in lines if ln != ln.rstrip()]
    assert not padded, padded
    assert " ".join(out.getvalue().split()).count("PG00") == len(WORDS)  # every name, none cut
    assert lines[0].split() == ["verdict", "edits", "which"]


def test_columns_is_respected(monkeypatch):
    """shutil.get_terminal_size's rule: COLUMNS wins, on a terminal or not."""
    monkeypatch.setenv("COLUMNS", "70")
    out = io.StringIO()
    console = make_console(file=out)
    assert console.width == 70
    console.print(_verdict_table())
    assert max(len(ln) for ln in out.getvalue().splitlines()) <= 70
    for bad in ("0", "wide", "-5", ""):
        monkeypatch.setenv("COLUMNS", bad)
        assert console_width(io.StringIO()) == PIPE_WIDTH


def test_a_terminal_gets_its_own_width(monkeypatch):
    """On a terminal (here a pty of 97 columns) the width is the terminal's, asked of the stream written to
    (a report on stderr asks stderr), and rich writes to it directly."""
    monkeypatch.delenv("COLUMNS", raising=False)
    master, slave = os.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 97, 0, 0))
        with open(slave, "w", closefd=False) as tty:
            assert console_width(tty) == 97
            console = make_console(file=tty)
            assert console.width == 97 and console.file is tty and console.is_terminal
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("stderr", [False, True])
def test_the_default_stream_is_stdout_or_stderr(stderr, monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    make_console(stderr=stderr).print("hello   ")
    out, err = capsys.readouterr()
    assert (err if stderr else out) == "hello\n" and (out if stderr else err) == ""
