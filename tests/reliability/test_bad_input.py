"""Hostile and broken input: a clear message naming the file and key or line, exit 2, tree untouched."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sndr.__main__ import main as sndr_main

BASE = '''id = "{id}"
title = "bad input case"
{top}
[[files]]
path = "{path}"

[[files.edits]]
name = "clamp"
anchor = \'\'\'
{anchor}\'\'\'
replacement = \'\'\'
{replacement}\'\'\'
'''
FILE = "vllm/v1/core/block_pool.py"
ANCHOR = "        return self.free_block_queue.num_free_blocks\n"
REPL = "        return max(0, self.free_block_queue.num_free_blocks)\n"
FILES = [FILE, "vllm/v1/core/kv_cache_coordinator.py"]


def patch_text(id="PB0001", top="", path=FILE, anchor=ANCHOR, replacement=REPL) -> str:
    return BASE.format(id=id, top=top, path=path, anchor=anchor, replacement=replacement)


@dataclass
class Case:
    name: str
    patches: dict[str, str | bytes]
    expect: list[str]  # substrings the error output must contain (file, key/line, what to do)
    setup: Callable[[Path], None] | None = None
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    needs_root: bool = False
    prepatch: bool = False  # apply the good set first, then break something
    teardown: Callable[[Path], None] | None = None


def _good():
    return {"PB0001-good.toml": patch_text()}


def _symlink_out(tree: Path) -> None:
    outside = tree.parent / "outside.py"
    outside.write_text(ANCHOR)
    (tree / "vllm/v1/core/evil.py").symlink_to(outside)


def _symlink_dir_out(tree: Path) -> None:
    outside = tree.parent / "outside_dir"
    outside.mkdir(exist_ok=True)
    (outside / "x.py").write_text(ANCHOR)
    (tree / "vllm/v1/evil").symlink_to(outside, target_is_directory=True)


def _non_utf8(tree: Path) -> None:
    p = tree / FILE
    p.write_bytes(p.read_bytes().replace(b"Get the number of free blocks", b"Get the n\xffmber of free blocks"))


def _crlf(tree: Path) -> None:
    p = tree / FILE
    p.write_bytes(p.read_bytes().replace(b"\n", b"\r\n"))


def _huge(tree: Path) -> None:
    with open(tree / "vllm/huge.py", "wb") as fh:
        fh.write(b"# filler line of a generated module\n" * (50 * 2**20 // 36))


def _immutable(tree: Path) -> None:
    if subprocess.run(["chattr", "+i", str(tree / FILE)], capture_output=True).returncode:
        pytest.skip("chattr +i not supported here")


def _mutable(tree: Path) -> None:
    subprocess.run(["chattr", "-i", str(tree / FILE)], capture_output=True)


def _ro_mount(tree: Path) -> None:
    if subprocess.run(["mount", "--bind", str(tree), str(tree)], capture_output=True).returncode or \
       subprocess.run(["mount", "-o", "remount,bind,ro", str(tree)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount read-only here")


def _umount(tree: Path) -> None:
    subprocess.run(["umount", str(tree)], capture_output=True)


def _corrupt_ledger(tree: Path) -> None:
    (tree / ".sndr/ledger.json").write_text('{"format": 1, "patch_set_digest": ')


def _hand_edit_ledger(tree: Path) -> None:
    p = tree / ".sndr/ledger.json"
    data = json.loads(p.read_text())
    data["files"][FILE]["patched_sha256"] = "0" * 64
    p.write_text(json.dumps(data))


def _foreign_journal(tree: Path) -> None:
    (tree / ".sndr/journal.json").write_text(json.dumps({"format": 1, "digest": "f" * 64, "ledger_before": None,
                                                         "files": [{"path": FILE, "before": "a" * 64, "after": "b" * 64}]}))


CASES = [
    Case("malformed_toml", {"PB0001-x.toml": 'id = "PB0001\ntitle = "x"\n'}, ["PB0001-x.toml:1", "malformed TOML"]),
    Case("unknown_top_key", {"PB0001-x.toml": patch_text(top="colour = 'red'")}, ["PB0001-x.toml:3", "[colour]", "unknown key"]),
    Case("unknown_edit_key", {"PB0001-x.toml": patch_text().replace('name = "clamp"', 'name = "clamp"\nrequierd = true')},
         ["[files[0].edits[0].requierd]", "unknown key"]),
    Case("wrong_type_bool", {"PB0001-x.toml": patch_text(top='default = "yes"')}, ["PB0001-x.toml:3", "[default]", "boolean"]),
    Case("wrong_type_files", {"PB0001-x.toml": 'id = "PB0001"\ntitle = "x"\nfiles = "vllm/x.py"\n'}, ["[files]", "list"]),
    Case("empty_anchor", {"PB0001-x.toml": patch_text(anchor="")}, ["[files[0].edits[0].anchor]", "anchor is empty"]),
    Case("blank_anchor", {"PB0001-x.toml": patch_text(anchor="   \n")}, ["anchor is empty or whitespace"]),
    Case("anchor_equals_replacement", {"PB0001-x.toml": patch_text(replacement=ANCHOR)}, ["anchor equals replacement"]),
    Case("empty_replacement", {"PB0001-x.toml": patch_text(replacement="")}, ["replacement is empty", "context"]),
    Case("bad_id", {"PB0001-x.toml": patch_text(id="1-bad")}, ["[id]", "PB0001-x.toml:1"]),
    Case("bad_specifier", {"PB0001-x.toml": patch_text(top='vllm = "newer than 0.30"')}, ["[vllm]", "not a PEP 440 specifier"]),
    Case("bad_lifecycle", {"PB0001-x.toml": patch_text(top='lifecycle = "dead"')}, ["[lifecycle]", "active"]),
    Case("duplicate_id", {"PB0001-a.toml": patch_text(), "PB0001-b.toml": patch_text()}, ["PB0001-b.toml:1 [id]", "PB0001-a.toml", "duplicate_id"]),
    Case("duplicate_edit_name", {"PB0001-x.toml": patch_text() + '\n[[files.edits]]\nname = "clamp"\nanchor = "a"\nreplacement = "b"\n'},
         ["used twice", "[files[0].edits[1].name]"]),
    Case("requires_unknown", {"PB0001-x.toml": patch_text(top='requires = ["PB9999"]')}, ["[requires]", "PB9999"]),
    Case("requires_cycle", {"PB0001-x.toml": patch_text(top='requires = ["PB0002"]'),
                            "PB0002-x.toml": patch_text(id="PB0002", top='requires = ["PB0001"]', path="vllm/v1/core/kv_cache_coordinator.py",
                                                        anchor="            curr_hit_length = hit_length\n",
                                                        replacement="            curr_hit_length = int(hit_length)\n")},
         ["requires cycle", "PB0001 -> PB0002 -> PB0001"]),
    Case("dotdot_path", {"PB0001-x.toml": patch_text(path="vllm/../../etc/passwd")}, ["[files[0].path]", "'..'"]),
    Case("absolute_path", {"PB0001-x.toml": patch_text(path="/etc/passwd")}, ["[files[0].path]", "absolute"]),
    Case("symlink_file_outside", {"PB0001-x.toml": patch_text(path="vllm/v1/core/evil.py")}, ["vllm/v1/core/evil.py", "outside the tree"],
         setup=_symlink_out),
    Case("symlink_dir_outside", {"PB0001-x.toml": patch_text(path="vllm/v1/evil/x.py")}, ["vllm/v1/evil/x.py", "outside the tree"],
         setup=_symlink_dir_out),
    Case("non_utf8_target", _good(), [f"{FILE}:", "not valid UTF-8"], setup=_non_utf8),
    Case("non_utf8_patch", {"PB0001-x.toml": patch_text().encode().replace(b"bad input case", b"bad \xff case")},
         ["PB0001-x.toml:2", "not UTF-8"]),
    Case("crlf_target", _good(), [FILE, "CRLF"], setup=_crlf),
    Case("target_is_directory", {"PB0001-x.toml": patch_text(path="vllm/v1/core")}, ["vllm/v1/core", "directory"]),
    Case("huge_target", {"PB0001-x.toml": patch_text(path="vllm/huge.py")}, ["vllm/huge.py", "MiB"], setup=_huge),
    Case("anchor_twice", {"PB0001-x.toml": patch_text(anchor="        return None\n", replacement="        return None  # x\n")},
         [FILE, "occurs 6 times", "widen the anchor"]),
    Case("does_not_compile", {"PB0001-x.toml": patch_text(replacement="        return max(0, self.free_block_queue.num_free_blocks\n")},
         [FILE, "does not compile", "PB0001"]),
    Case("bad_env_override", _good(), ["SNDR_ENABLE_PB0001", "1/0 (also true/false, yes/no, on/off)"], env={"SNDR_ENABLE_PB0001": "perhaps"}),
    Case("only_unknown_id", _good(), ["--only", "PB7777"], args=["--only", "PB7777"]),
    Case("undeclared_group", {"PB0001-x.toml": patch_text().replace('name = "clamp"', 'name = "clamp"\ngroup = "variants"')},
         ["group 'variants'", "not declared", "[files[0].edits[0].group]"]),
    Case("file_listed_twice", {"PB0001-x.toml": patch_text() + f'\n[[files]]\npath = "{FILE}"\n[[files.edits]]\nname = "b"\nanchor = "a"\nreplacement = "b"\n'},
         ["listed twice", "[files[1].path]"]),
    Case("requires_itself", {"PB0001-x.toml": patch_text(top='requires = ["PB0001"]')},
         ["PB0001-x.toml:3 [requires]", "cannot require, follow or conflict with itself"]),
    Case("immutable_target", _good(), [FILE, "cannot write"], setup=_immutable, teardown=_mutable, needs_root=True),
    Case("read_only_tree", _good(), [FILE, "Read-only file system", "in-memory hook"], setup=_ro_mount, teardown=_umount, needs_root=True),
    Case("corrupt_ledger", _good(), [".sndr/ledger.json", "corrupt"], prepatch=True, setup=_corrupt_ledger),
    Case("ledger_hand_edited", _good(), [".sndr/ledger.json", "edited by hand"], prepatch=True, setup=_hand_edit_ledger),
    Case("foreign_journal", _good(), [FILE, "journal does not match the tree"], prepatch=True, setup=_foreign_journal),
]


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.stat().st_size < 2**20:
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_file():
            out[str(p.relative_to(root))] = f"size:{p.stat().st_size}"
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, pin_subtree, tmp_path, capsys, monkeypatch):
    if case.needs_root and os.geteuid() != 0:
        pytest.skip("needs root (chattr/mount)")
    tree = pin_subtree(FILES)
    pdir = tmp_path / "patches"
    pdir.mkdir()
    for name, text in case.patches.items():
        (pdir / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    if case.prepatch:
        assert sndr_main(["apply", "--tree", str(tree), "--patches", str(pdir), "-q"]) == 0
    if case.setup:
        case.setup(tree)
    for k, v in case.env.items():
        monkeypatch.setenv(k, v)
    before = snapshot(tree)
    capsys.readouterr()
    try:
        rc = sndr_main(["apply", "--tree", str(tree), "--patches", str(pdir), *case.args])
        out = capsys.readouterr()
        text = out.out + out.err
    finally:
        if case.teardown:
            case.teardown(tree)
    assert rc == 2, f"{case.name}: exit {rc}\n{text}"
    for needle in case.expect:
        assert needle in text, f"{case.name}: {needle!r} missing from:\n{text}"
    assert snapshot(tree) == before, f"{case.name}: the tree changed"


def test_target_deleted_between_plan_and_commit(pin_subtree, tmp_path, capsys, monkeypatch):
    import sndr.commit as commit_mod  # apply imports its engine at call time: patch the home module

    tree = pin_subtree(FILES)
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "PB0001-x.toml").write_text(patch_text())
    real_commit = commit_mod.commit

    def racing_commit(t, writes, ledger, digest):
        (tree / FILE).unlink()  # someone deletes the target after the plan was made
        return real_commit(t, writes, ledger, digest)

    monkeypatch.setattr(commit_mod, "commit", racing_commit)
    before = {k: v for k, v in snapshot(tree).items() if k != FILE and not k.startswith(".sndr")}
    rc = sndr_main(["apply", "--tree", str(tree), "--patches", str(pdir)])
    text = capsys.readouterr().err
    assert rc == 2 and FILE in text and "between plan and commit" in text
    after = {k: v for k, v in snapshot(tree).items() if k != FILE and not k.startswith(".sndr")}
    assert after == before and not (tree / FILE).exists()
    assert not (tree / ".sndr/journal.json").exists()


def test_catalogue_size():
    assert len(CASES) + 1 >= 30


def test_overlapping_patches_are_a_finding_not_bad_input(pin_subtree, tmp_path, capsys):
    """Two patches, each valid alone, rewriting the same bytes: exit 1 (a finding), both named, tree untouched."""
    tree = pin_subtree(FILES)
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "PB0001-x.toml").write_text(patch_text())
    (pdir / "PB0002-x.toml").write_text(patch_text(id="PB0002", anchor=REPL, replacement="        return 0\n"))
    before = snapshot(tree)
    capsys.readouterr()
    rc = sndr_main(["apply", "--tree", str(tree), "--patches", str(pdir)])
    out = capsys.readouterr()
    text = out.out + out.err
    assert rc == 1, f"exit {rc}\n{text}"
    assert "PB0001" in text and "PB0002" in text and "Traceback" not in text, text
    assert "after = " in text or "requires" in text, text  # the fix is ordering, and the message says so
    assert snapshot(tree) == before


def test_declared_conflicts_both_enabled_are_a_finding_as_in_the_preflight(pin_subtree, tmp_path, capsys):
    """Issue 31: apply and preflight give `conflicts_enabled` one meaning, a finding (exit 1), tree untouched;
    --keep-going leaves out the later patch of the pair, named, and applies the rest (exit 1: its on_failure is fail)."""
    tree = pin_subtree(FILES)
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "PB0001-x.toml").write_text(patch_text(top='conflicts = ["PB0002"]'))
    (pdir / "PB0002-x.toml").write_text(patch_text(id="PB0002", path="vllm/v1/core/kv_cache_coordinator.py",
                                                   anchor="            curr_hit_length = hit_length\n",
                                                   replacement="            curr_hit_length = int(hit_length)\n"))
    before = snapshot(tree)
    capsys.readouterr()
    rc = sndr_main(["apply", "--tree", str(tree), "--patches", str(pdir)])
    out = capsys.readouterr()
    text = out.out + out.err
    assert rc == 1, f"exit {rc}\n{text}"
    assert "PB0001 conflicts with PB0002" in text and "SNDR_ENABLE_PB0002=0" in text
    assert snapshot(tree) == before
    rc = sndr_main(["apply", "--tree", str(tree), "--patches", str(pdir), "--keep-going"])
    text = capsys.readouterr().out
    assert rc == 1 and "left out 1 patch(es) whole: PB0002 (conflicts_enabled, keep_going: " in text, text
    after = snapshot(tree)
    assert after[FILE] != before[FILE] and after["vllm/v1/core/kv_cache_coordinator.py"] == before[
        "vllm/v1/core/kv_cache_coordinator.py"]
