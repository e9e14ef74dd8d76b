"""Files the set reads and writes nothing to, and the stored pristine copies: the new-user review of stop 44.

A patch whose edit is ``merged`` (its marker present) or an optional edit whose anchor is absent writes
nothing, so the ledger used to record nothing about that file: after someone changed it (the marker gone),
verify still said ok ("merged") and apply took its "already applied" shortcut, never applying the now
needed edit. The ledger now records such a file with its bytes (``state.read_only_entry``); verify says
``read_changed``, apply plans it again, revert leaves it alone. And a stored pristine copy that is missing
made verify and the "already applied" path say ok while revert then failed: both now say ``object_missing``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sndr.apply import run_apply, run_revert, run_verify
from sndr.load import load_patch_set

A = "def f():\n    y = 2\n    return y\n"
DUP = "def a():\n    v = 0\n    return v\n\n\ndef b():\n    return 1\n"
OPT = "def g():\n    return 3\n"

PATCHES = {
    "PT0001-edit-a.toml": '''id = "PT0001"
title = "edit a"
[[files]]
path = "vllm/x/a.py"
[[files.edits]]
name = "y"
anchor = "    y = 2\\n"
replacement = "    y = 2  # patched\\n"
''',
    "PT0095-merged-upstream.toml": '''id = "PT0095"
title = "merged upstream"
merged_markers = ["def b():"]
[[files]]
path = "vllm/x/dup.py"
[[files.edits]]
name = "e"
anchor = "def a():\\n"
replacement = "def a():  # fixed\\n"
''',
    "PT0090-optional.toml": '''id = "PT0090"
title = "optional edit, anchor absent"
[[files]]
path = "vllm/x/opt.py"
[[files.edits]]
name = "o"
required = false
anchor = "    return 4\\n"
replacement = "    return 5\\n"
''',
}


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "site"
    (root / "vllm" / "x").mkdir(parents=True)
    dist = root / "vllm-0.32.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "x" / "a.py").write_text(A)
    (root / "vllm" / "x" / "dup.py").write_text(DUP)
    (root / "vllm" / "x" / "opt.py").write_text(OPT)
    pdir = tmp_path / "patches"
    pdir.mkdir()
    for name, text in PATCHES.items():
        (pdir / name).write_text(text)
    return root, pdir


def _verdicts(report) -> dict[str, str]:
    return {p.id: p.status for p in report.patches}


def test_a_changed_file_the_set_only_read_is_never_verified_ok(tmp_path):
    root, pdir = _tree(tmp_path)
    ps = load_patch_set(pdir, packs=False)
    assert run_apply(root, ps, environ={}).ok
    ledger = json.loads((root / ".sndr" / "ledger.json").read_text())
    read = {rel for rel, e in ledger["files"].items() if not e["patches"]}
    assert read == {"vllm/x/dup.py", "vllm/x/opt.py"} and set(ledger["files"]) - read == {"vllm/x/a.py"}
    assert run_verify(root, ps, environ={}).ok

    # the marker goes: PT0095's edit is needed now; verify must not say ok, the warm CLI path neither
    (root / "vllm" / "x" / "dup.py").write_text(DUP.replace("def b():", "def bb():"))
    ver = run_verify(root, ps, environ={})
    assert (ver.ok, ver.exit_code) == (False, 1)
    assert [(p.code, p.file, p.patch) for p in ver.problems] == [("read_changed", "vllm/x/dup.py", "PT0095")]
    for _ in range(2):  # the second run would answer from the warm memo the first one primed
        cli = subprocess.run([sys.executable, "-m", "sndr.apply", "--verify", "--tree", str(root), "--patches",
                              str(pdir), "-q"], capture_output=True, text=True)
        assert cli.returncode == 1 and "read_changed" in cli.stdout + cli.stderr, cli.stdout + cli.stderr

    # apply plans the file again from its bytes now and applies the edit (no "already applied")
    again = run_apply(root, ps, environ={})
    assert again.ok and again.files_written == ["vllm/x/dup.py"], again
    assert any(n.startswith("read_changed: 1 file(s)") and "vllm/x/dup.py" in n for n in again.notes), again.notes
    assert (root / "vllm" / "x" / "dup.py").read_text().startswith("def a():  # fixed\n")
    assert run_verify(root, ps, environ={}).ok

    # the optional anchor appears by hand: the optional edit's "absent" no longer holds
    (root / "vllm" / "x" / "opt.py").write_text(OPT.replace("return 3", "return 4"))
    assert [p.code for p in run_verify(root, ps, environ={}).problems] == ["read_changed"]
    assert run_apply(root, ps, environ={}).ok
    assert (root / "vllm" / "x" / "opt.py").read_text() == OPT.replace("return 3", "return 5")

    # revert restores what sndr wrote and leaves a file it only read as it is, changed since or not
    root, _ = _tree(tmp_path / "second")
    assert run_apply(root, ps, environ={}).ok
    (root / "vllm" / "x" / "dup.py").write_text("# someone's own file now\n")
    rev = run_revert(root)
    assert rev.ok and "vllm/x/dup.py" not in rev.files_written, rev
    assert (root / "vllm" / "x" / "dup.py").read_text() == "# someone's own file now\n"
    assert (root / "vllm" / "x" / "a.py").read_text() == A


def test_a_set_that_only_reads_leaves_no_ledger(tmp_path):
    root, pdir = _tree(tmp_path)
    for name in ("PT0001-edit-a.toml",):
        (pdir / name).unlink()
    ps = load_patch_set(pdir, packs=False)
    done = run_apply(root, ps, environ={})
    assert done.ok and done.files_written == [] and not (root / ".sndr" / "ledger.json").exists()
    assert run_verify(root, ps, environ={}).ok


def test_a_missing_stored_copy_is_not_ok(tmp_path):
    root, pdir = _tree(tmp_path)
    ps = load_patch_set(pdir, packs=False)
    assert run_apply(root, ps, environ={}).ok
    ledger = json.loads((root / ".sndr" / "ledger.json").read_text())
    obj = root / ".sndr" / "objects" / ledger["files"]["vllm/x/a.py"]["pristine_sha256"]
    obj.unlink()
    ver = run_verify(root, ps, environ={})
    assert (ver.ok, ver.exit_code, [p.code for p in ver.problems]) == (False, 2, ["object_missing"])
    assert "vllm/x/a.py" in ver.problems[0].message
    for _ in range(2):
        cli = subprocess.run([sys.executable, "-m", "sndr.apply", "--verify", "--tree", str(root), "--patches",
                              str(pdir), "-q"], capture_output=True, text=True)
        assert cli.returncode == 2 and "object_missing" in cli.stdout + cli.stderr, cli.stdout + cli.stderr
    again = run_apply(root, ps, environ={})  # the "already applied" path
    assert (again.ok, again.exit_code, [p.code for p in again.problems]) == (False, 2, ["object_missing"])
    obj.write_text(A + "# damaged\n")
    assert [p.code for p in run_verify(root, ps, environ={}).problems] == ["object_corrupt"]
