"""``python -m sndr salvage-ledger TREE``: the recovery path of ``ledger_corrupt`` (and ``journal_too_large``)."""

from __future__ import annotations

import argparse

from . import add_json_option, path_text

HELP = ("Repair sndr's state in a tree: put back the last ledger sndr wrote (kept in .sndr/objects) that matches "
        "the tree's files. Exit 1 when none is put back, with its reason code: nothing_to_salvage (no .sndr/; no "
        "ledger and none kept matches, as after a revert; or a ledger that reads, so nothing to repair) or "
        "no_ledger_matches (the ledger does not read and none kept matches the files); the tree is then left "
        "untouched.")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("tree", type=path_text, metavar="TREE", help="the directory containing vllm/ and .sndr/ (or vllm/ itself), "
                                                 "or installed[:PYTHON], as apply's --tree")
    add_json_option(ap, "the outcome (ok, exit_code, the ledger restored, the stored ledgers that do not match, "
                        "problems with their reason codes)")


def run(args: argparse.Namespace) -> int:
    from ..cli import check_output
    from ..cli import run as boundary

    def body() -> int:
        if args.json:
            check_output(args.json, "--json")  # before any work
        return _body(args.tree, args.json)

    return boundary("sndr salvage-ledger", body)


def _body(spec: str, json_dest: str | None) -> int:
    import json
    import sys

    from ..cli import write_output
    from ..commit import salvage_ledger
    from ..errors import EXIT_OK, registered_exit
    from ..tree import directory

    tree = directory(spec, dry_run=False)  # the one tree rule: vllm/ itself means its parent
    done = salvage_ledger(tree)
    out = sys.stderr if json_dest == "-" else sys.stdout  # --json -: stdout holds the document only
    if done.problem is not None:
        print(f"sndr: {done.problem.render()}", file=out)
        status = registered_exit(done.problem.code)
    else:
        print(f"sndr: restored the ledger {str(done.sha)[:12]} from .sndr/objects; the tree verifies "
              f"against it again", file=out)
        status = EXIT_OK
    if json_dest:
        doc = {"ok": status == EXIT_OK, "exit_code": status, "tree": str(tree), "restored": done.sha,
               "rejected": [{"sha256": sha, "differs": rel} for sha, rel in done.rejected],
               "problems": [done.problem.to_json()] if done.problem is not None else []}
        write_output(json_dest, json.dumps(doc, indent=2) + "\n", "--json")
    return status
