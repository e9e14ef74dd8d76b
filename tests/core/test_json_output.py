"""``--json`` of ``sndr.apply`` at its edges (the new-user review of stop 44): a path inside the tree, a
directory that takes no new file, and a reader of stdout that leaves early."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .test_read_files import _tree

DRIFTED = '''id = "PT0200"
title = "anchor not there"
[[files]]
path = "vllm/x/a.py"
[[files.edits]]
name = "gone"
anchor = "    w = 9\\n"
replacement = "    w = 10\\n"
'''


def _apply(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sndr.apply", *args], capture_output=True, text=True)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("inside", ["vllm/x/a.py", "vllm/x/new-report.json", ".sndr/ledger.json"])
def test_a_report_path_inside_vllm_or_sndr_state_is_refused_before_any_work(tmp_path, inside):
    root, pdir = _tree(tmp_path)
    before = _snapshot(root)
    r = _apply("--tree", str(root), "--patches", str(pdir), "--json", str(root / inside))
    assert r.returncode == 2 and "output_refused" in r.stderr and "is inside" in r.stderr, r.stderr
    assert r.stdout == "" and _snapshot(root) == before  # no report, no error document, no ledger
    beside = _apply("--tree", str(root), "--patches", str(pdir), "--json", str(root / "report.json"))
    assert beside.returncode == 0 and (root / "report.json").is_file(), beside.stderr  # beside them: fine


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_a_directory_that_takes_no_new_file_is_refused_before_any_work(tmp_path):
    root, pdir = _tree(tmp_path)
    before = _snapshot(root)
    r = _apply("--tree", str(root), "--patches", str(pdir), "--json", "/proc/sndr-report.json")
    assert r.returncode == 2 and "output_refused" in r.stderr and "takes no new file" in r.stderr, r.stderr
    assert _snapshot(root) == before


def test_findings_keep_their_status_when_the_json_reader_leaves(tmp_path):
    root, pdir = _tree(tmp_path)
    (pdir / "PT0200-drifted.toml").write_text(DRIFTED)
    cmd = (f"{sys.executable} -m sndr.apply --tree {root} --patches {pdir} --json - 2>{tmp_path / 'err'} | true; "
           f"exit ${{PIPESTATUS[0]}}")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    err = (tmp_path / "err").read_text()
    assert r.returncode == 1, err  # was 0 with nothing on stderr: the findings and the status were dropped
    assert "PT0200" in err and "FAILED (exit 1)" in err, err


def test_an_error_leaves_its_document_in_the_json_file_too(tmp_path):
    """The README: bad input that ends a command "still leaves one document there", FILE or stdout. With FILE
    a stale report of an earlier run stayed in place (the new-user review of stop 44, `sndr preflight`)."""
    out = tmp_path / "report.json"
    out.write_text('{"old": 1}\n')
    r = subprocess.run([sys.executable, "-m", "sndr", "preflight", "--pin", str(tmp_path / "nope"), "--candidate",
                        str(tmp_path / "nope2"), "--json", str(out)], capture_output=True, text=True)
    import json

    doc = json.loads(out.read_text())
    assert r.returncode == 2 and (doc["ok"], doc["exit_code"]) == (False, 2), (r.stderr, doc)
    assert doc["problems"][0]["code"] == "tree_not_found" and r.stdout == ""
