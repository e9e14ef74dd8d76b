"""``python -m sndr <command>`` (and the ``sndr`` console script): one parser, built from a lazy table.

:data:`sndr.commands.COMMANDS` names each command's module and summary; only the
module of the command being run is imported, so ``sndr status`` never pays for
the planner and ``--help`` never imports the engine. ``python -m sndr.apply`` is
an alias of ``python -m sndr apply`` (:func:`alias`: the same parser and run).
"""

from __future__ import annotations

if __name__ == "__main__":  # until sndr.cli's early handler is in (main): Ctrl-C ends the process, never a traceback
    import _signal  # the builtin (always loaded): importing signal.py would itself be a window for a traceback

    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)

import argparse
import importlib
import sys
from types import ModuleType
from typing import Any

from .commands import COMMANDS

PROG = "python -m sndr"


def _summary(name: str) -> str:
    text = COMMANDS[name][1]
    if "{schemas}" in text:
        from .schema import schema_names  # a dict of names: no model is imported

        text = text.replace("{schemas}", "|".join(schema_names()))
    return text


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's, wide enough that a command's summary stays on its line."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=26, width=120)


class _CommandParser(argparse.ArgumentParser):
    """A command's parser (and its subcommands', which inherit the class): an argument it does not know is
    its own usage error. Plain argparse hands a subparser's leftovers back to the top parser, whose message
    (``usage: python -m sndr [-h] COMMAND ...``) names no command and none of its options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(
        self, args: Any = None, namespace: Any = None,
    ) -> tuple[Any, list[str]]:
        for action in self._actions:  # a missing subcommand names the choices, not the dest ("required: cmd")
            if isinstance(action, argparse._SubParsersAction) and action.metavar is None and action.choices:
                action.metavar = "{" + ",".join(action.choices) + "}"
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def _command(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name][0])


def _configure(parser: argparse.ArgumentParser, module: ModuleType) -> argparse.ArgumentParser:
    parser.description = module.HELP
    module.add_arguments(parser)
    parser.set_defaults(_run=module.run)
    return parser


def build_parser(argv: list[str], prog: str = PROG) -> argparse.ArgumentParser:
    """The one parser: every command is listed; only the one ``argv`` names gets its options (its module
    is the only one imported). ``prog``: how the user ran it (``sndr`` for the console script)."""
    ap = argparse.ArgumentParser(prog=prog, description="sndr: a transactional text-patch engine for a pinned "
                                 f"vLLM tree. `{prog} COMMAND --help` (or `{prog} help COMMAND`) for a command's "
                                 "options.",
                                 formatter_class=_Formatter)
    sub = ap.add_subparsers(title="commands", metavar="COMMAND", dest="command", required=True,
                            parser_class=_CommandParser)
    chosen = argv[0] if argv else None
    for name in COMMANDS:
        # The summaries show only in `python -m sndr --help`: a command run never fills them in.
        summary = COMMANDS[name][1] if chosen in COMMANDS else _summary(name)
        sp = sub.add_parser(name, help=summary)
        if name == chosen:
            _configure(sp, _command(name))
    return ap


def run(argv: list[str], parser: argparse.ArgumentParser) -> int:
    """Parse ``argv`` (a usage error exits 2, with one JSON document on stdout under ``--json -``) and run."""
    from .cli import expect_json, parse_args, pause_at

    try:
        args = parse_args(parser, argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, argparse's message on stderr): a status, not a raise
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    expect_json(getattr(args, "json", None))  # an error that ends the command still answers --json -
    pause_at("parsed")  # test-only (SNDR_TEST_PAUSE=parsed): a real Ctrl-C lands here, before the command's boundary
    code: int = args._run(args)
    return code


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """The entry point: ``python -m sndr``, the ``sndr`` console script, and in-process calls (``argv``)."""
    process = argv is None  # a process, not a library call: the early Ctrl-C handler is its own
    argv = list(sys.argv[1:] if argv is None else argv)
    if process:
        from .cli import catch_early_interrupt

        catch_early_interrupt(f"sndr {argv[0]}" if argv and argv[0] in COMMANDS else "sndr")
    if argv[:1] == ["help"]:  # `sndr help`, `sndr help COMMAND`, `sndr help COMMAND SUB ...`
        return _help(argv[1:], prog)
    return run(argv, build_parser(argv, prog))


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands a parser takes (name -> its parser); empty for a leaf."""
    return next((dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _help(path: list[str], prog: str = PROG) -> int:
    """``sndr help [COMMAND [SUB ...]]``: the help of the parser the whole path names (``sndr help sync plan``
    is ``sndr sync plan --help``, never ``sync``'s). A path that names no command is a usage error (exit 2)
    naming the commands valid at that point."""
    parser = build_parser(path, prog)
    for depth, name in enumerate(path):
        choices = _subcommands(parser)
        if name not in choices:
            where = " ".join([prog, *path[:depth]])
            valid = f"{where} takes {', '.join(choices)}" if choices else f"{where} takes no subcommand"
            print(f"{prog} help: no command {' '.join(path[:depth + 1])!r}: {valid} (usage)", file=sys.stderr)
            return 2
        parser = choices[name]
    parser.print_help()
    return 0


def console() -> None:
    """The ``sndr`` console script: :func:`main` under the same process boundary as ``python -m sndr``
    (:func:`sndr.cli.exit_with`: once the command returned, its last line and exit status stand)."""
    from .cli import exit_with

    exit_with(lambda: main(prog="sndr"))  # its usage lines name what the user typed: `sndr`, not `python -m sndr`


def alias(name: str) -> None:
    """``python -m sndr.<module>`` for a command: its own prog name, the command's parser and run."""
    from .cli import catch_early_interrupt, exit_with

    catch_early_interrupt(f"sndr {name}")
    parser = _CommandParser(prog=f"{PROG}.{name}")
    exit_with(lambda: run(sys.argv[1:], _configure(parser, _command(name))))


if __name__ == "__main__":
    from .cli import exit_with

    exit_with(main)
