"""Every ``python -m sndr`` subcommand, one module each.

A command module ``sndr/commands/<name>.py`` has

* ``HELP``: the description ``python -m sndr <name> --help`` prints;
* ``add_arguments(parser)``: its options, on an :class:`argparse.ArgumentParser`;
* ``run(args) -> int``: the command, which imports its engine inside the function, so
  ``--help`` and a usage error cost no engine import (pip's ``commands_dict``, LibCST's
  ``CodemodCommand``).

:data:`COMMANDS` is the lazy table ``sndr/__main__.py`` builds its one parser from:
name -> (module, one-line summary). Only the module of the command being run is
imported. Adding a subcommand is one file here and one line in the table.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

#: name -> (module, the one line ``python -m sndr --help`` shows). ``{schemas}`` is filled in from sndr.schema.
COMMANDS: dict[str, tuple[str, str]] = {
    "apply": ("sndr.commands.apply", "apply, dry-run, verify or revert the patch set on a tree"),
    "schema": ("sndr.commands.schema", "print the JSON Schema of {schemas}"),
    "list": ("sndr.commands.list", "list the patch set (id, title, kind, default, upstream, files)"),
    "manifest": ("sndr.commands.manifest", "build or check anchors/<pin>.json"),
    "preflight": ("sndr.commands.preflight", "classify the patch set on a pin and a candidate tree"),
    "vendor": ("sndr.commands.vendor", "turn a unified diff into a patch file"),
    "import": ("sndr.commands.import_", "turn a quilt or git format-patch series, or the seed system's patchers, into patch files"),
    "watchlist": ("sndr.commands.watchlist", "lint, edit and evaluate the upstream watchlist"),
    "sync": ("sndr.commands.sync", "plan the port queue of an upstream range; record decisions and deviations"),
    "pin": ("sndr.commands.pin", "show the pin, or advance it when every gate passes"),
    "status": ("sndr.commands.status", "per-process attestations of the active patch set"),
    "hook": ("sndr.commands.hook", "install or remove the in-memory import hook (.pth)"),
    "salvage-ledger": ("sndr.commands.salvage_ledger",
                       "put back the last ledger sndr wrote that matches a tree's files (ledger_corrupt)"),
    "gc": ("sndr.commands.gc", "remove the stored copies in a tree's .sndr/objects its ledger no longer names"),
}


#: What an empty path option is told (argparse puts ``argument --json: `` before it; exit 2, usage).
EMPTY_PATH = "an empty path names nothing (an unset variable?)"


def path_text(text: str) -> str:
    """The ``type`` of every path option, the one rule for an empty value: a usage error (exit 2) naming the
    option. Options sndr writes to (an output: ``--json``, ``--md``, ``--markdown``, ``--sarif``,
    ``--prometheus``, ``--out``, ``--to``; a file it edits: ``--decisions``, ``--pin-file``, ``--watchlist``;
    where it writes: ``--site``): ``--json "$REPORT"`` with the variable unset wrote no report and exited 0;
    ``--to ""`` and ``--out ""`` wrote into the working directory; ``--decisions ""`` edited the default file.
    Options sndr reads (``--patches``, ``--profile``, ``--config``, ``--preflight``, ``--queue``, ``--diff``,
    a ``--tree`` or ``TREE``, ``--repo``, ``--python``, ...): ``list --patches ""`` listed the shipped set,
    ``pin advance --preflight ""`` read no report, ``gc ""`` worked on the working directory. ``-`` (stdout,
    or stdin where an option reads it, ``vendor --diff -``) and every other path are the command's to check
    (:func:`sndr.cli.check_output` for an output)."""
    if not text:
        raise argparse.ArgumentTypeError(EMPTY_PATH)
    return text


def path_value(text: str) -> Path:
    """:func:`path_text` as a :class:`~pathlib.Path`: the ``type`` of a path option the command reads as one
    (never ``type=Path``: ``Path("")`` is ``.``, the working directory, and the empty value would be lost)."""
    from pathlib import Path  # here: a command's --help imports no more than it needs

    return Path(path_text(text))


def add_json_option(parser: argparse.ArgumentParser, what: str = "the report") -> None:
    """``--json FILE|-``, the one meaning of ``--json`` in every command: write ``what`` as JSON to FILE
    (atomically, :func:`sndr.cli.write_output`) or to stdout for ``-`` (the human text then goes to stderr
    or is left out, so stdout holds one JSON document); an empty FILE is a usage error (:func:`path_text`)."""
    parser.add_argument("--json", metavar="FILE|-", type=path_text,
                        help=f"write {what} as JSON to FILE, or to stdout for '-' (stdout then holds the JSON only)")

