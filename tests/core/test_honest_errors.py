"""Bad input is an error that names the file (exit 2), never an empty or a silent result (issue 32
MEDIUM 3 and LOW items). Hermetic: the synthetic tree and patch set of ``tests/hook_fixtures.py``."""

from __future__ import annotations

import errno
import os

import pytest

from hook_fixtures import make_patches, make_tree, tree_bytes
from sndr.__main__ import main as sndr_main


@pytest.fixture
def site(tmp_path):
    return make_tree(tmp_path / "site")


@pytest.fixture
def patches(tmp_path):
    return make_patches(tmp_path / "patches", only=["F0001", "F0002"])


def _apply(capsys, *args) -> tuple[int, str, str]:
    rc = sndr_main(["apply", *(list(args))])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _deny_listing(monkeypatch, directory):
    """``scandir(directory)`` fails as it does for a user without r/x on it (root is never refused)."""
    import sndr.load as load

    real = os.scandir

    def scandir(path="."):
        if os.fspath(path) == os.fspath(directory):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(load.os, "scandir", scandir)


@pytest.mark.parametrize("extra", [[], ["--dry-run"], ["--allow-empty"], ["--verify"]])
def test_an_unreadable_patch_directory_is_an_error_naming_it(site, patches, monkeypatch, capsys, extra):
    """Was: "the patch set is empty ... pass --allow-empty", and --allow-empty then reverted every file."""
    assert _apply(capsys, "--patches", str(patches), "--tree", str(site))[0] == 0
    before = tree_bytes(site)
    _deny_listing(monkeypatch, patches)
    rc, out, err = _apply(capsys, "--patches", str(patches), "--tree", str(site), *extra)
    assert rc == 2, out + err
    assert f"{patches} [--patches]: cannot list the patch directory: Permission denied (unreadable)" in err
    assert "empty" not in err and "reverted" not in out
    assert tree_bytes(site) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root_reads_everything: root lists a mode-000 directory; the "
                                              "monkeypatched variant above covers it for root")
def test_an_unreadable_patch_directory_by_its_mode(site, patches, capsys):
    os.chmod(patches, 0)
    try:
        rc, _, err = _apply(capsys, "--patches", str(patches), "--tree", str(site))
    finally:
        os.chmod(patches, 0o755)
    assert rc == 2 and f"{patches}: cannot list the patch directory" in err


def test_patches_naming_a_file_says_so_and_names_its_directory(site, patches, capsys):
    one = patches / "F0001-answer.toml"
    rc, _, err = _apply(capsys, "--patches", str(one), "--tree", str(site))
    assert rc == 2
    assert f"{one} [--patches]: the patch directory is a file, not a directory (patches_not_a_dir)" in err
    assert f"--patches {patches}" in err and "does not exist" not in err


@pytest.mark.parametrize("mode", [[], ["--verify"], ["--revert"], ["--dry-run"]])
def test_a_tree_without_vllm_is_one_line_and_nothing_else(tmp_path, mode, capsys, monkeypatch):
    """Was: the right one-line error, then ``Exception ignored in: TreeRoot.__del__ ... AttributeError``.
    In process, the interpreter's unraisable hook is what prints "Exception ignored"; one mode also runs
    in a child, where interpreter shutdown is part of what is checked."""
    import gc
    import subprocess
    import sys

    empty = tmp_path / "novllm"
    empty.mkdir()
    first = f"sndr apply: {empty}: directory does not contain a vllm/ package (not_a_tree)"
    ignored: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    assert sndr_main(["apply", "--tree", str(empty), *mode]) == 2
    gc.collect()
    err = capsys.readouterr().err
    assert err.splitlines()[0] == first and "Traceback" not in err and not ignored, (err, ignored)
    if mode == []:
        proc = subprocess.run([sys.executable, "-m", "sndr.apply", "--tree", str(empty), *mode],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and proc.stderr.splitlines()[0] == first, proc.stderr
        assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_only_matches_ids_as_sndr_enable_does(site, patches, capsys, monkeypatch):
    """``--only f0001`` was refused while ``SNDR_ENABLE_f0001`` was accepted: both now match the id the way
    ``sndr.env.enable_var`` spells it."""
    import json

    rc, out, err = _apply(capsys, "--patches", str(patches), "--tree", str(site), "--dry-run", "--only", "f0001",
                          "--json", "-")
    assert rc == 0, err
    report = json.loads(out)
    assert [p["id"] for p in report["patches"]] == ["F0001"]
    rc, _, err = _apply(capsys, "--patches", str(patches), "--tree", str(site), "--dry-run", "--only", "F001")
    assert rc == 2 and "--only names unknown patch(es): F001 (did you mean F0001?)" in err
    monkeypatch.setenv("SNDR_ENABLE_f0002", "0")
    rc, out, _ = _apply(capsys, "--patches", str(patches), "--tree", str(site), "--dry-run", "--json", "-")
    gated = {p["id"]: p["reason"] for p in json.loads(out)["patches"] if p["status"] == "gated"}
    assert gated == {"F0002": "disabled by SNDR_ENABLE_F0002=0"}
    monkeypatch.setenv("SNDR_ENABLE_F0002", "1")  # two spellings, two values: which one holds is not guessed
    rc, _, err = _apply(capsys, "--patches", str(patches), "--tree", str(site), "--dry-run")
    assert rc == 2 and "SNDR_ENABLE_F0002=1, SNDR_ENABLE_f0002=0 name the same patch F0002" in err


@pytest.mark.parametrize("mode", [["--dry-run"], [], ["--verify"]])
def test_an_enable_variable_naming_no_patch_is_said(site, patches, capsys, monkeypatch, mode):
    if mode == ["--verify"]:
        assert _apply(capsys, "--patches", str(patches), "--tree", str(site))[0] == 0
    monkeypatch.setenv("SNDR_ENABLE_F001", "1")
    rc, out, err = _apply(capsys, "--patches", str(patches), "--tree", str(site), *mode)
    assert rc == 0, out + err
    assert "SNDR_ENABLE_F001 names no patch of the set; it is ignored (did you mean SNDR_ENABLE_F0001?)" in out


def test_register_says_an_enable_variable_naming_no_patch(tmp_path):
    from hook_fixtures import Box

    box = Box(tmp_path)
    box.apply()
    proc = box.py("import vllm, sndr.startup.hook as h; h.register()", SNDR_ENABLE_F001="1")
    assert "SNDR_ENABLE_F001 names no patch of the set; it is ignored (did you mean SNDR_ENABLE_F0001?)" in \
        proc.stderr
    [rec] = box.records()
    assert any("SNDR_ENABLE_F001 names no patch" in p for p in rec["problems"])


def test_the_verify_fast_path_does_not_hide_an_enable_variable_naming_no_patch(site, patches, tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SNDR_")}
    env["SNDR_CACHE_DIR"] = str(tmp_path / "cache")
    run = [sys.executable, "-m", "sndr.apply", "--patches", str(patches), "--tree", str(site)]
    assert subprocess.run(run, env=env, capture_output=True).returncode == 0
    for _ in range(2):  # the second run is the warm fast path when nothing is wrong
        proc = subprocess.run([*run, "--verify"], env=dict(env, SNDR_ENABLE_F001="1"), capture_output=True, text=True)
        assert proc.returncode == 0 and "SNDR_ENABLE_F001 names no patch" in proc.stdout, proc.stdout + proc.stderr


def test_a_path_typo_on_the_pin_is_bad_input_with_the_nearest_path(site, tmp_path, capsys):
    """``vllm/sampling_param.py`` read ``file_missing``, exit 1, "the target file is gone": on the pin, a path
    the pin never had is a typo in the patch (exit 2), named with the nearest path it has."""
    patches = make_patches(tmp_path / "typo", only=["F0001"], replace={'path = "vllm/engine.py"':
                                                                       'path = "vllm/engines.py"'})
    before = tree_bytes(site)
    for mode in (["--dry-run"], []):
        rc, out, err = _apply(capsys, "--patches", str(patches), "--tree", str(site), *mode)
        assert rc == 2, out + err
        assert (f"{patches / 'F0001-answer.toml'}:5: F0001: vllm/engines.py is not a file of vLLM 0.32.0 (the pin): "
                "a typo in the patch's path? (path_unknown)") in out
        assert "did you mean vllm/engine.py?" in out
    assert tree_bytes(site) == before


def test_a_path_typo_on_a_copy_of_the_real_pin(pin_subtree, tmp_path, capsys):
    """The issue's case on real files: ``vllm/sampling_param.py`` for ``vllm/sampling_params.py``; and a file the
    pin has but the tree lost is still drift (file_missing, exit 1), never called a typo."""
    rel = "vllm/sampling_params.py"
    site = pin_subtree([rel])
    patches = tmp_path / "p"
    patches.mkdir()
    (patches / "PX0001-typo.toml").write_text(
        'id = "PX0001"\ntitle = "t"\n\n[[files]]\npath = "vllm/sampling_param.py"\n\n[[files.edits]]\n'
        'name = "a"\nanchor = "class SamplingParams("\nreplacement = "class SamplingParams( "\n')
    rc, out, err = _apply(capsys, "--patches", str(patches), "--tree", str(site), "--dry-run")
    assert rc == 2 and "vllm/sampling_param.py is not a file of vLLM 0.32.0" in out, out + err
    assert f"did you mean {rel}?" in out and "PX0001-typo.toml:5" in out
    text = (patches / "PX0001-typo.toml").read_text().replace("sampling_param.py", "sampling_params.py")
    (patches / "PX0001-typo.toml").write_text(text)
    (site / rel).unlink()
    rc, out, err = _apply(capsys, "--patches", str(patches), "--tree", str(site), "--dry-run")
    assert rc == 1 and "edit_file_missing" in out and "path_unknown" not in out, out + err


def test_verify_names_the_patches_that_differ_and_the_variable(site, patches, capsys, monkeypatch):
    """Was two digests only; the startup hook already named them."""
    monkeypatch.setenv("SNDR_ENABLE_F0002", "0")
    assert _apply(capsys, "--patches", str(patches), "--tree", str(site))[0] == 0
    monkeypatch.delenv("SNDR_ENABLE_F0002")
    rc, out, _ = _apply(capsys, "--patches", str(patches), "--tree", str(site), "--verify")
    assert rc == 1 and "enabled here, not on disk: F0002 (SNDR_ENABLE_F0002=0 disables it)" in out, out
    assert "give this command the SNDR_ENABLE_* values" in out
    assert _apply(capsys, "--patches", str(patches), "--tree", str(site))[0] == 0  # now both are applied
    monkeypatch.setenv("SNDR_ENABLE_F0002", "0")
    rc, out, _ = _apply(capsys, "--patches", str(patches), "--tree", str(site), "--verify")
    assert rc == 1 and "on disk, not enabled here: F0002 (SNDR_ENABLE_F0002=1 enables it)" in out, out


def _verdicts(r) -> dict:
    return {"ok": r.ok, "exit": r.exit_code, "counts": r.counts, "digest": r.patch_set_digest,
            "edits": [(p.id, e.file, e.name, e.verdict.value) for p in r.patches for e in p.edits],
            "problems": [(p.code, p.patch, p.file) for p in r.problems], "files": sorted(r.files_written)}


#: Each operation killed at each fault point; the inner loop runs one point per operation (mid-replace for
#: apply, right after the journal for revert).
INTERRUPTED = [pytest.param(point, op, id=f"{point}-{op}",
                            marks=() if (op, point) in {("apply", "after_replace:1"), ("revert", "after_journal")}
                            else pytest.mark.full_only("apply at after_replace:1 and revert at after_journal"))
               for point in ("after_journal", "after_replace:0", "after_replace:1", "before_ledger")
               for op in ("apply", "revert")]


@pytest.mark.parametrize(("point", "op"), INTERRUPTED)
def test_dry_run_over_an_interrupted_commit_plans_what_apply_plans(site, patches, op, point):
    """apply rolls a pending journal back before it plans; the dry-run does the same in memory (no write)."""
    import signal
    import subprocess
    import sys

    from sndr.apply import run_apply
    from sndr.load import load_patch_set

    ps = load_patch_set(patches, packs=False)
    base = [sys.executable, "-m", "sndr.apply", "--tree", str(site), "--patches", str(patches), "-q"]
    if op == "revert":
        assert run_apply(site, ps, environ={}).ok
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNDR_")}
    killed = subprocess.run(base + (["--revert"] if op == "revert" else []), env=dict(env, SNDR_TEST_FAULT=point),
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (site / ".sndr" / "journal.json").exists()
    before = {p: p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()}
    dry = run_apply(site, ps, environ={}, dry_run=True)
    assert {p: p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()} == before, "the dry-run wrote"
    assert any(n.startswith("an interrupted commit is pending: apply would roll it back first") for n in dry.notes)
    real = run_apply(site, ps, environ={})
    assert _verdicts(dry) == _verdicts(real) and real.ok
    assert not (site / ".sndr" / "journal.json").exists()  # the real apply rolled it back


def test_list_says_an_enable_variable_naming_no_patch(patches, capsys, monkeypatch):

    monkeypatch.setenv("SNDR_ENABLE_F001", "1")
    assert sndr_main(["list", "--patches", str(patches), "--json", "-"]) == 0
    out = capsys.readouterr()
    assert "sndr list: note: SNDR_ENABLE_F001 names no patch of the set; it is ignored" in out.err
    import json

    json.loads(out.out)  # --json stays one document
