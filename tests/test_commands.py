"""sndr/commands/: every subcommand module has the shape the one parser needs, and answers --help and usage
errors in process (the module files under sndr/commands/ are tested here as one family; what each command
does is tested with its engine: core/test_apply.py, test_listing.py, startup/test_hook.py, ...)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from sndr.__main__ import main
from sndr.commands import COMMANDS


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_module_has_help_options_and_run(name):
    module = importlib.import_module(COMMANDS[name][0])
    assert isinstance(module.HELP, str) and module.HELP.strip()
    assert callable(module.add_arguments) and callable(module.run)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_answers_in_process_with_status_0(name, capsys):
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and name in out.split("\n", 1)[0], out[:200]


def test_an_unknown_command_and_a_bad_option_are_usage_errors(capsys):
    assert main(["no-such-command"]) == 2
    assert main(["status", "--no-such-option"]) == 2
    err = capsys.readouterr().err
    assert "no-such-command" in err and "--no-such-option" in err


def test_top_level_help_names_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS), out


@pytest.mark.parametrize("argv, usage", [
    (["apply", "--no-such-option"], "usage: python -m sndr apply "),
    (["watchlist", "lint", "stray.yaml"], "usage: python -m sndr watchlist lint "),
    (["pin", "show", "--json", "-"], "usage: python -m sndr pin show "),
])
def test_a_commands_unknown_argument_is_that_commands_usage_error(argv, usage, capsys):
    # argparse hands a subparser's leftovers to the top parser, whose usage names no command: the
    # command's own parser reports them, with its usage line.
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and "unrecognized arguments" in err, err
    assert "COMMAND ..." not in err, err


def test_the_apply_alias_reports_its_own_usage(capsys, monkeypatch):
    from sndr.__main__ import alias

    monkeypatch.setattr("sys.argv", ["python -m sndr.apply", "--no-such-option"])
    with pytest.raises(SystemExit) as exc:
        alias("apply")
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("usage: python -m sndr.apply ")


@pytest.mark.parametrize("argv", [
    ["apply", "--tree", "{missing}"],
    ["list", "--tree", "{missing}"],
    ["status", "--tree", "{missing}"],
    ["preflight", "--pin", "{missing}", "--candidate", "{missing}"],
    ["watchlist", "check", "--preflight", "{missing}"],
    ["watchlist", "lint", "--watchlist", "{missing}"],
    ["sync", "plan", "--repo", "{missing}", "--from", "v0.32.0", "--to", "v0.33.0"],
    ["vendor", "--diff", "{missing}", "--id", "PX0001", "--title", "t", "--tree", "{missing}"],
    ["import", "quilt", "{missing}", "--to", "{out}"],
])
def test_an_error_under_json_dash_is_one_json_document_on_stdout(argv, tmp_path, capsys):
    """`--json -` means stdout holds one JSON document: also when bad input ends the command (only apply, and
    usage errors caught by the parser, wrote one before; the others left stdout empty)."""
    import json

    argv = [a.format(missing=tmp_path / "missing", out=tmp_path / "out") for a in argv]
    assert main([*argv, "--json", "-"]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)  # exactly one document: json.loads refuses trailing data
    assert doc["ok"] is False and doc["exit_code"] == 2 and doc["problems"], doc
    assert doc["problems"][0]["code"] in err, err  # the same problem, said on stderr too
    assert main([*argv]) == 2
    assert capsys.readouterr().out == ""  # without --json -, nothing of it on stdout


def test_salvage_ledger_takes_a_tree_as_apply_does(tmp_path, capsys):
    """salvage-ledger TREE reads TREE by the one tree rule: ``vllm/`` itself names its parent (apply --tree's
    rule; it was not_a_tree, exit 2)."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (tmp_path / ".sndr").mkdir()  # sndr's state: a damaged ledger, and no stored one to put back
    (tmp_path / ".sndr" / "ledger.json").write_text("{not json")
    assert main(["salvage-ledger", str(tmp_path / "vllm")]) == 1  # a tree, with no stored ledger to put back
    out = capsys.readouterr().out
    assert f"no stored ledger matches the files of {tmp_path}:" in out and "(no_ledger_matches)" in out, out
    assert main(["salvage-ledger", str(tmp_path / "missing")]) == 2
    assert "tree_not_found" in capsys.readouterr().err


def test_salvage_ledger_on_a_tree_sndr_never_applied_to_writes_nothing(tmp_path, capsys):
    """A read-only-looking command on an untouched tree: "nothing to salvage" with its code, exit 1, and the
    tree byte-identical (it created .sndr/ and .sndr/lock, then said no stored ledger matched)."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("x = 1\n")

    def snapshot() -> dict[str, tuple[int, bytes | None]]:
        return {p.relative_to(tmp_path).as_posix(): (p.lstat().st_mode, p.read_bytes() if p.is_file() else None)
                for p in sorted(tmp_path.rglob("*"))}

    before = snapshot()
    assert main(["salvage-ledger", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"nothing to salvage in {tmp_path}" in out and "(nothing_to_salvage)" in out, out
    assert snapshot() == before


def test_salvage_ledger_on_a_reverted_tree_says_nothing_to_salvage(tmp_path, capsys):
    """After `apply --revert` the tree has no ledger and matches no stored one: it told the user to reinstall
    vLLM and delete .sndr/ (the advice for a corrupt ledger) about a healthy, pristine tree."""
    from hook_fixtures import make_patches, make_tree, tree_bytes

    site, patches = make_tree(tmp_path / "site"), make_patches(tmp_path / "patches", only=["F0001"])
    assert main(["apply", "--patches", str(patches), "--tree", str(site), "-q"]) == 0
    assert main(["apply", "--revert", "--patches", str(patches), "--tree", str(site), "-q"]) == 0
    capsys.readouterr()
    before = tree_bytes(site)
    assert main(["salvage-ledger", str(site)]) == 1
    out = capsys.readouterr().out
    assert "nothing to salvage" in out and "(nothing_to_salvage)" in out and "reinstall" not in out, out
    assert tree_bytes(site) == before


def test_salvage_ledger_names_a_reason_code_for_every_outcome_and_json_carries_it(tmp_path, capsys):
    """No stored ledger matching a tree whose ledger is damaged printed "no stored ledger matches ..." with no
    reason code (the other outcomes had theirs), and salvage-ledger had no --json. Each outcome now says its
    registered code with its exit status, on the terminal and in --json (stdout holds the document only)."""
    import json

    from hook_fixtures import make_patches, make_tree
    from sndr.errors import CODES

    site, patches = make_tree(tmp_path / "site"), make_patches(tmp_path / "patches", only=["F0001"])
    assert main(["apply", "--patches", str(patches), "--tree", str(site), "-q"]) == 0
    ledger = site / ".sndr" / "ledger.json"
    good = ledger.read_bytes()
    ledger.write_text("{not json")
    [rel] = json.loads(good)["files"]  # the one file F0001 patches
    patched = site / rel
    patched.write_text(patched.read_text() + "# changed by hand since\n")
    capsys.readouterr()

    def salvage(*extra: str) -> tuple[int, str, str]:
        rc = main(["salvage-ledger", str(site), *extra])
        out, err = capsys.readouterr()
        return rc, out, err

    rc, out, _ = salvage()  # the defect's path: damaged ledger, no stored one matches
    assert rc == CODES["no_ledger_matches"].exit == 1 and "(no_ledger_matches)" in out, out
    assert "none of the 1 ledger sndr kept in .sndr/objects matches its files (" in out and f": {rel} differs" in out
    assert "hint: reinstall vLLM and delete" in out
    rc, out, err = salvage("--json", "-")
    doc = json.loads(out)  # one document, the human line on stderr
    assert rc == 1 and doc["ok"] is False and doc["exit_code"] == 1 and doc["restored"] is None
    assert [p["code"] for p in doc["problems"]] == ["no_ledger_matches"] and "(no_ledger_matches)" in err
    assert [r["differs"] for r in doc["rejected"]] == [rel]
    patched.write_text(patched.read_text().replace("# changed by hand since\n", ""))
    rc, out, err = salvage("--json", "-")  # the stored ledger matches again: restored, exit 0
    doc = json.loads(out)
    assert rc == 0 and doc["ok"] is True and doc["problems"] == [] and doc["restored"] and ledger.read_bytes() == good
    assert f"restored the ledger {doc['restored'][:12]}" in err
    report = tmp_path / "salvage.json"
    patched.write_text(patched.read_text() + "# changed by hand since\n")
    rc, out, _ = salvage("--json", str(report))  # the intact ledger, a file changed: nothing to repair
    assert rc == CODES["nothing_to_salvage"].exit and "(nothing_to_salvage)" in out
    doc = json.loads(report.read_text())
    assert doc["ok"] is False and [p["code"] for p in doc["problems"]] == ["nothing_to_salvage"]


def test_the_old_salvage_spelling_is_not_a_silent_success():
    """`python -m sndr.commit --salvage-ledger TREE` was the recovery path every ledger_corrupt error named;
    after the move to `python -m sndr salvage-ledger` it ran the module, did nothing and exited 0."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "sndr.commit", "--salvage-ledger", "/nonexistent"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "python -m sndr salvage-ledger TREE" in proc.stderr, proc.stderr


def test_a_commands_json_dash_does_not_outlive_it(tmp_path, capsys):
    """The error document answers the command's own --json -: an in-process run after it (tests, tools) that
    fails writes nothing to stdout."""
    from sndr import cli
    from sndr.errors import bad_input

    assert main(["list", "--tree", str(tmp_path / "missing"), "--json", "-"]) == 2
    assert capsys.readouterr().out.startswith("{")

    def fails() -> int:
        raise bad_input("usage", "no")

    assert cli.run("sndr x", fails) == 2
    assert capsys.readouterr().out == ""
    cli.expect_json("-")  # a command given --json - that ends without writing its document
    assert cli.run("sndr y", lambda: 0) == 0
    assert cli.run("sndr x", fails) == 2  # the next run was given no --json
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("path, usage", [
    ([], "usage: python -m sndr [-h] COMMAND"),
    (["status"], "usage: python -m sndr status "),
    (["sync", "plan"], "usage: python -m sndr sync plan "),
    (["manifest", "check"], "usage: python -m sndr manifest check "),
    (["watchlist", "set"], "usage: python -m sndr watchlist set "),
])
def test_help_shows_the_help_of_the_whole_path(path, usage, capsys):
    """`sndr help sync plan` is `sndr sync plan --help` (it printed sync's help: the path stopped at its
    first word)."""
    assert main(["help", *path]) == 0
    helped = capsys.readouterr().out
    assert helped.startswith(usage), helped[:200]
    assert main([*path, "--help"]) == 0
    assert capsys.readouterr().out == helped


@pytest.mark.parametrize("path, names", [
    (["nope"], "python -m sndr takes apply, schema,"),
    (["sync", "nope"], "python -m sndr sync takes plan, decide, deviation"),
    (["status", "extra"], "python -m sndr status takes no subcommand"),
])
def test_help_of_an_unknown_path_is_a_usage_error_naming_the_valid_ones(path, names, capsys):
    assert main(["help", *path]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"no command {' '.join(path)!r}" in err and names in err, err


@pytest.mark.parametrize("argv, engine", [
    (["manifest", "check"], "sndr.manifest"),
    (["hook", "install"], "sndr.startup.hook"),
    (["status"], "sndr.startup.hook"),
    (["list"], "sndr.listing"),
])
def test_an_engine_that_fails_to_import_is_the_boundarys_internal_error(argv, engine, monkeypatch, capsys):
    """The engine is imported inside the body sndr.cli.run calls: an import failure is exit 3 with the
    boundary's line (manifest, hook and status imported it before the boundary: the ImportError escaped main)."""
    monkeypatch.setitem(sys.modules, engine, None)  # `import` of it now raises ImportError
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert f"import of {engine} halted" in err and f"sndr {argv[0]}: internal error (exit 3)" in err, err[-500:]


def test_the_console_script_names_itself_sndr(monkeypatch, capsys):
    """`sndr --help` printed `usage: python -m sndr ...`: the console script's usage and help lines name the
    command the user typed."""
    import signal

    from sndr.__main__ import console

    # console() is a process's entry: it installs its own SIGINT handlers; give pytest's back afterwards
    monkeypatch.setattr(signal, "signal", _keeping(signal.signal, signal.getsignal(signal.SIGINT)))
    for argv, usage in ((["--help"], "usage: sndr [-h] COMMAND"), (["sync", "plan", "--help"], "usage: sndr sync plan "),
                        (["help", "pin", "show"], "usage: sndr pin show ")):
        monkeypatch.setattr("sys.argv", ["sndr", *argv])
        with pytest.raises(SystemExit) as exc:
            console()
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(usage) and "python -m sndr" not in out, out[:400]
    monkeypatch.setattr("sys.argv", ["sndr", "help", "nope"])
    with pytest.raises(SystemExit) as exc:
        console()
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("sndr help: no command 'nope': sndr takes ")


def _keeping(real, handler):
    """signal.signal that lets the process-entry code run but leaves the test process's SIGINT handler alone."""
    import signal

    def fake(signum, new):
        if signum == signal.SIGINT:
            return handler
        return real(signum, new)

    return fake


def test_hook_install_errors_carry_their_code(tmp_path, capsys):
    """`hook install --site FILE` and a --python that cannot import sndr printed their own line with no reason
    code; they are bad input (exit 2) with a registered code, naming the option and what to do."""
    not_dir = tmp_path / "file"
    not_dir.write_text("")
    assert main(["hook", "install", "--site", str(not_dir)]) == 2
    err = capsys.readouterr().err
    assert f"{not_dir} [--site]: --site is not a directory (site_not_a_dir)" in err, err
    site = tmp_path / "site"
    site.mkdir()
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 1\n")  # an interpreter that finds no sndr
    python.chmod(0o755)
    assert main(["hook", "install", "--site", str(site), "--python", str(python)]) == 2
    err = capsys.readouterr().err
    assert "cannot import sndr" in err and "(sndr_not_importable)" in err and "pip install sndr" in err, err
    assert list(site.iterdir()) == []  # no .pth written


@pytest.mark.parametrize("argv, choices", [
    (["watchlist"], "{lint,set,check,show,schema}"),
    (["sync"], "{plan,decide,deviation}"),
    (["manifest"], "{build,check}"),
    (["pin"], "{show,advance}"),
])
def test_a_missing_subcommand_names_the_choices(argv, choices, capsys):
    """`sndr watchlist` said "the following arguments are required: cmd" (the parser's dest)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"the following arguments are required: {choices}" in err and "required: cmd" not in err, err
    assert err.startswith(f"usage: python -m sndr {argv[0]} [-h]"), err


def _readme_block(title: str) -> list[list[str]]:
    """The commands of the first ```bash block after the README heading ``title``: continuations joined,
    comments dropped, each split as a shell would."""
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = text.split(title, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if shlex.split(line, comments=True)]


def test_the_readme_pin_bump_runs_from_an_installed_sndr():
    """Walked on a fresh venv: the block began with `python tools/bump_preflight.py` (a checkout's file, not
    in a pip install), built no manifest for the target (pin advance's manifest gate then pointed into the
    installed package) and gave pin advance no --patches (it refuses to write the shipped set). Every line is
    `python -m sndr ...` and parses; every file pin advance reads is written by an earlier line; every
    command that takes --patches names the same set."""
    from sndr.__main__ import build_parser

    commands = _readme_block("## A pin bump")
    written: set[str] = set()
    patches = set()
    for argv in commands:
        assert argv[:3] == ["python", "-m", "sndr"], argv
        args = build_parser(argv[3:]).parse_args(argv[3:])
        if getattr(args, "patches", None) is not None:
            patches.add(str(args.patches))
        if argv[3] == "watchlist":  # the set's own watchlist, not the shipped one
            assert args.watchlist is not None, argv
            patches.add(str(Path(args.watchlist).parent))
        if argv[3:5] == ["pin", "advance"]:
            for read in (args.preflight, args.queue, args.manifest):
                assert str(read) in written, f"pin advance reads {read}, which no earlier line writes"
        for flag in ("json", "out", "md"):
            if isinstance(getattr(args, flag, None), (str, Path)):
                written.add(str(getattr(args, flag)))
    assert patches == {"patches"}, patches
    assert any(a[3:5] == ["pin", "advance"] for a in commands)


def _objects(site: Path) -> dict[str, bytes]:
    d = site / ".sndr" / "objects"
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())} if d.is_dir() else {}


def test_gc_removes_only_what_the_ledger_does_not_name_and_every_reader_still_works(tmp_path, capsys):
    """Two applies (the whole set, then F0001 alone) leave the first set's copies behind; gc --dry-run lists them
    and changes nothing; gc removes exactly them and keeps the ledger's copy and the pristine and patched copies
    it names, each listed with what it is. After it: --verify passes, a damaged ledger still salvages (its copy
    was kept), and --revert gives back the pristine tree byte for byte. After the revert nothing is kept."""
    import json

    from hook_fixtures import make_patches, make_tree, tree_bytes
    from sndr.commit import TreeRoot, live_objects

    site = make_tree(tmp_path / "site")
    pristine = tree_bytes(site)
    every, one = make_patches(tmp_path / "all"), make_patches(tmp_path / "one", only=["F0001"])
    assert main(["apply", "--patches", str(every), "--tree", str(site), "-q"]) == 0
    assert main(["apply", "--patches", str(one), "--tree", str(site), "-q"]) == 0
    tree = TreeRoot(site)
    live = live_objects(tree.read_state("ledger.json"), tree.read_ledger())
    before = _objects(site)
    stale = sorted(set(before) - set(live))
    assert stale and set(live) <= set(before)
    capsys.readouterr()

    assert main(["gc", "--dry-run", str(site)]) == 0
    out = capsys.readouterr().out
    assert _objects(site) == before  # pure
    assert f"would remove {len(stale)} stored copies" in out and all(f"would remove {s[:12]}" in out for s in stale)
    assert "kept" in out and "ledger" in out and "pristine vllm/" in out and "patched vllm/" in out, out

    assert main(["gc", str(site), "--json", str(tmp_path / "gc.json")]) == 0
    doc = json.loads((tmp_path / "gc.json").read_text())
    assert sorted(r["sha256"] for r in doc["removed"]) == stale
    assert {k["sha256"]: k["what"] for k in doc["kept"]} == live
    assert doc["freed_bytes"] == sum(len(before[s]) for s in stale)
    assert _objects(site) == {s: before[s] for s in live}
    capsys.readouterr()

    assert main(["apply", "--verify", "--patches", str(one), "--tree", str(site)]) == 0
    (site / ".sndr" / "ledger.json").write_text("{damaged")
    assert main(["gc", str(site)]) == 2  # a ledger no reader accepts: nothing removed
    assert "ledger_corrupt" in capsys.readouterr().err
    assert _objects(site) == {s: before[s] for s in live}
    assert main(["salvage-ledger", str(site)]) == 0
    assert main(["apply", "--revert", "--patches", str(one), "--tree", str(site), "-q"]) == 0
    assert tree_bytes(site) == pristine
    capsys.readouterr()
    assert main(["gc", str(site)]) == 0
    assert "kept 0" in capsys.readouterr().out and _objects(site) == {}


def test_gc_dry_run_with_a_pending_journal_says_so_and_touches_nothing(tmp_path, capsys):
    """What a pending journal's commit keeps depends on how it resolves: the dry-run stops with journal_pending
    (exit 1) instead of guessing; files in objects/ that are not sha256 names are never gc's."""
    from hook_fixtures import make_patches, make_tree

    site = make_tree(tmp_path / "site")
    assert main(["apply", "--patches", str(make_patches(tmp_path / "p")), "--tree", str(site), "-q"]) == 0
    (site / ".sndr" / "objects" / "not-a-sha.tmp").write_bytes(b"x")
    (site / ".sndr" / "journal.json").write_text("{}")
    before = _objects(site)
    capsys.readouterr()
    assert main(["gc", "--dry-run", str(site)]) == 1
    assert "journal_pending" in capsys.readouterr().err
    assert _objects(site) == before
    (site / ".sndr" / "journal.json").unlink()
    assert main(["gc", str(site)]) == 0
    assert (site / ".sndr" / "objects" / "not-a-sha.tmp").read_bytes() == b"x"


def test_gc_on_a_tree_sndr_never_applied_to_creates_nothing(tmp_path, capsys):
    from hook_fixtures import make_tree

    site = make_tree(tmp_path / "site")
    assert main(["gc", str(site / "vllm")]) == 0  # vllm/ itself names its parent, as apply's --tree
    assert "removed 0 stored copies" in capsys.readouterr().out
    assert not (site / ".sndr").exists()
