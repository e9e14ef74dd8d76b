"""sndr/startup/common.py: what every startup module shares (one-line errors, safe reads, sha256)."""

from __future__ import annotations

import hashlib
import os

from sndr.errors import Problem, SndrError
from sndr.startup.common import describe, read_bytes, sha256


def test_read_bytes_reads_a_regular_file_and_refuses_everything_else(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert read_bytes(str(tmp_path / "f")) == b"abc"
    assert read_bytes(str(tmp_path / "fifo")) is None  # refused without blocking on the FIFO
    assert read_bytes(str(tmp_path)) is None
    assert read_bytes(str(tmp_path / "loop")) is None
    assert read_bytes(str(tmp_path / "missing")) is None
    assert read_bytes(str(tmp_path / "bad\0name")) is None


def test_describe_is_one_line():
    err = SndrError([Problem("ledger_corrupt", "first line\nsecond line")])
    assert "\n" not in describe(err) and "ledger_corrupt" in describe(err)
    assert describe(ValueError("bad value")) == "ValueError: bad value"


def test_sha256_is_hex_sha256():
    assert sha256(b"sndr") == hashlib.sha256(b"sndr").hexdigest()
