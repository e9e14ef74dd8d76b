"""sndr/commands/: every subcommand module has the shape the one parser needs, and answers --help and usage
errors in process (the module files under sndr/commands/ are tested here as one family; what each command
does is tested with its engine: core/test_apply.py, test_listing.py, startup/test_hook.py, ...)."""

from __future__ import annotations

import importlib

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
