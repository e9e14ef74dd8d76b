"""``python -m sndr watchlist lint|set|check|show|schema``: the upstream watchlist."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from . import add_json_option, path_text

if TYPE_CHECKING:
    from ..errors import Problem

HELP = "Lint, edit and evaluate the upstream watchlist."


def add_arguments(ap: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand that is not given --watchlist leaves the one given before it (`watchlist --watchlist
    # X lint`) in place; a default of None there overwrote it, and the default watchlist was linted instead.
    where = "watchlist file (default: watchlist.yaml of the patch directory: $SNDR_PATCHES, else the shipped set)"
    common.add_argument("--watchlist", metavar="PATH", type=path_text, default=argparse.SUPPRESS, help=where)
    ap.add_argument("--watchlist", metavar="PATH", type=path_text, help=where)
    sub = ap.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("lint", parents=[common],
                        help="flag unknown patches, contradictions, duplicates, retired patches")
    lp.add_argument("--patches", type=path_text, metavar="DIR", help="patch directory for the registry checks (default: shipped set)")
    lp.add_argument("--no-registry", action="store_true", help="skip the checks that need the patch set")
    add_json_option(lp, "the findings")
    sp = sub.add_parser("set", parents=[common], help="set one key of one row, keeping every comment")
    sp.add_argument("row", help="vllm#N (watch row) or #N (sweep row)")
    sp.add_argument("key")
    sp.add_argument("value", help="lists are comma-separated; '' is an empty list")
    sp.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    cp = sub.add_parser("check", parents=[common], help="which triggers fired on a preflight's candidate")
    cp.add_argument("--preflight", type=path_text, required=True, metavar="REPORT.json")
    add_json_option(cp, "the fired triggers")
    sh = sub.add_parser("show", parents=[common], help="print the watchlist (or one row) as JSON")
    sh.add_argument("row", nargs="?")
    sub.add_parser("schema", parents=[common], help="print the JSON Schema of the watchlist")


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    return boundary("sndr watchlist", lambda: _body(args),
                    on_interrupt=lambda: "the watchlist is unchanged (edits are written atomically)")


def _print_problems(problems: list[Problem]) -> None:
    for p in problems:
        print(p.render())


def _unified(old: str, new: str, name: str) -> str:
    import difflib

    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{name}", f"b/{name}"))


def _body(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from ..cli import check_output, write_output

    if getattr(args, "json", None):
        check_output(args.json, "--json")  # before any work and any engine import
    from ..errors import EXIT_FINDINGS, EXIT_OK
    from ..upstream.watchlist import (
        default_watchlist_path,
        edit_field,
        find_row,
        json_schema,
        load_watchlist,
        parse_cli_value,
        parse_watchlist,
        read_text_file,
        write_atomic,
    )

    if args.cmd == "schema":
        print(json.dumps(json_schema(), indent=2))
        return EXIT_OK
    path = Path(args.watchlist) if args.watchlist else default_watchlist_path()
    if args.cmd == "set":
        if not args.dry_run:  # an installed sndr's shipped watchlist: a reinstall would lose the edit
            from ..env import refuse_shipped_write

            refuse_shipped_write(path, flag="--watchlist PATH")
        text = read_text_file(path, "watchlist")
        loaded = parse_watchlist(text, str(path))
        section, _ = find_row(loaded.model, args.row, str(path))
        value = parse_cli_value(section, args.key, args.value)
        new = edit_field(loaded, args.row, args.key, value)  # on the one parse above (set_field parsed again)
        if new == text:
            print(f"{path}: {args.row} [{args.key}] already {args.value!r}; nothing to do")
            return EXIT_OK
        if args.dry_run:
            sys.stdout.write(_unified(text, new, path.name))
            return EXIT_OK
        write_atomic(path, new)
        print(f"{path}: {args.row} [{args.key}] = {args.value!r}")
        return EXIT_OK
    loaded = load_watchlist(path)
    if args.cmd == "show":
        data = loaded.model.to_data()
        if args.row:
            section, index = find_row(loaded.model, args.row, str(path))
            data = data[section][index]
        print(json.dumps(data, indent=2, default=str, ensure_ascii=False))
        return EXIT_OK
    if args.cmd == "lint":
        from ..upstream.watchlist_lint import lint, load_registry

        registry = None if args.no_registry else load_registry(args.patches)
        problems = lint(loaded, registry)
        if args.json:
            write_output(args.json, json.dumps({"watchlist": str(path), "registry": registry is not None,
                                                "findings": [p.to_json() for p in problems]},
                                               indent=2, ensure_ascii=False) + "\n", "--json")
        if args.json != "-":  # --json - : stdout holds the JSON document only
            _print_problems(problems)
            counts: dict[str, int] = {}
            for p in problems:
                counts[p.code] = counts.get(p.code, 0) + 1
            summary = ", ".join(f"{n} {c}" for c, n in sorted(counts.items())) or "no findings"
            print(f"{path}: {len(loaded.model.watch)} watch rows, {len(loaded.model.sweep)} sweep rows: {summary}")
        return EXIT_FINDINGS if problems else EXIT_OK
    # check
    from ..upstream.triggers import check, load_preflight

    facts = load_preflight(args.preflight)
    report = check(loaded, facts, str(args.preflight))
    if args.json:
        write_output(args.json, report.model_dump_json(indent=2) + "\n", "--json")
    if args.json != "-":
        for f in report.fired:
            print(f"{path}:{f.line}: {f.where()}: {f.trigger} fired: {f.reason}")
        for n in report.notes:
            print(f"note: {n}")
        print(f"{len(report.fired)} trigger(s) fired on {report.candidate or 'the candidate'}")
    return EXIT_FINDINGS if report.fired else EXIT_OK
