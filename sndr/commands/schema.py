"""``python -m sndr schema NAME``: the JSON Schema of a model; ``schema codes``: every reason code."""

from __future__ import annotations

import argparse

from . import add_json_option

HELP = ("Print the JSON Schema of a file sndr reads or writes; `codes`: every reason code, its exit status and "
        "meaning (a table, or JSON with --json).")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from ..schema import schema_names  # a dict of names: no model is imported

    ap.add_argument("name", choices=schema_names(), metavar="NAME", help="|".join(schema_names()))
    add_json_option(ap, "the codes (codes only; a schema is always JSON)")


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    return boundary("sndr schema", lambda: _body(args))


def _body(args: argparse.Namespace) -> int:
    import json

    from ..cli import write_output
    from ..errors import bad_input
    from ..schema import codes_table, schema_of

    if args.name == "codes":
        write_output(args.json or "-", codes_table(as_json=args.json is not None) + "\n", "--json")
        return 0
    if args.json is not None:
        raise bad_input("usage", f"--json is for `schema codes`; `schema {args.name}` prints JSON already",
                        key="--json")
    write_output("-", json.dumps(schema_of(args.name), indent=2, sort_keys=True) + "\n")
    return 0
