"""``python -m sndr schema NAME``: the JSON Schema of a model; ``schema codes``: every reason code."""

from __future__ import annotations

import argparse

from . import add_json_option

HELP = ("Print the JSON Schema of a file sndr reads or writes (or write it to --json FILE); `codes`: every reason "
        "code, its exit status and meaning (a table, or JSON with --json).")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from ..schema import schema_names  # a dict of names: no model is imported

    ap.add_argument("name", choices=schema_names(), metavar="NAME", help="|".join(schema_names()))
    add_json_option(ap, "the schema (codes: the table as JSON)")


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    return boundary("sndr schema", lambda: _body(args))


def _body(args: argparse.Namespace) -> int:
    import json

    from ..cli import check_output, write_output
    from ..schema import codes_table, schema_of

    dest = args.json or "-"  # --json FILE|- as in every command; a schema is JSON either way
    check_output(dest, "--json")
    if args.name == "codes":
        write_output(dest, codes_table(as_json=args.json is not None) + "\n", "--json")
        return 0
    write_output(dest, json.dumps(schema_of(args.name), indent=2, sort_keys=True) + "\n", "--json")
    return 0
