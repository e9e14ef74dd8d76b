"""``python -m sndr salvage-ledger TREE``: the recovery path of ``ledger_corrupt`` (and ``journal_too_large``)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("Repair sndr's state in a tree: put back the last ledger sndr wrote (kept in .sndr/objects) that matches "
        "the tree's files. Exit 1 when none matches, or when there is nothing to salvage (no .sndr/, or no ledger "
        "and none kept matches, as after a revert): the tree is then left untouched.")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("tree", metavar="TREE", help="the directory containing vllm/ and .sndr/ (or vllm/ itself), "
                                                 "or installed[:PYTHON], as apply's --tree")


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    return boundary("sndr salvage-ledger", lambda: _body(args.tree))


def _body(spec: str) -> int:
    import os

    from ..commit import salvage_ledger
    from ..errors import EXIT_FINDINGS, registered_exit
    from ..state import STATE_DIR, read_ledger, state_path
    from ..tree import directory

    tree: Path = directory(spec, dry_run=False)  # the one tree rule: vllm/ itself means its parent
    if not os.path.lexists(state_path(tree)):  # a look, no more: the salvage's lock would create .sndr/
        print(f"sndr: nothing to salvage in {tree}: it has no {STATE_DIR}/ (sndr never applied there, so no "
              f"ledger is kept to put back); the tree is untouched (nothing_to_salvage)")
        return registered_exit("nothing_to_salvage", EXIT_FINDINGS)
    sha = salvage_ledger(tree)
    if sha is None and read_ledger(tree).kind == "absent":  # reverted (or an apply that never committed)
        print(f"sndr: nothing to salvage in {tree}: it has no ledger, and none sndr kept matches its files (a "
              f"reverted tree reads like this; `python -m sndr apply --dry-run --tree {tree}` shows its state); "
              f"no ledger was put back (nothing_to_salvage)")
        return registered_exit("nothing_to_salvage", EXIT_FINDINGS)
    if sha is None:
        print(f"sndr: no stored ledger matches the files of {tree}; reinstall vLLM and delete "
              f"{tree / STATE_DIR}/ to start from a pristine tree")
        return EXIT_FINDINGS
    print(f"sndr: restored the ledger {sha[:12]} from .sndr/objects; the tree verifies against it again")
    return 0
