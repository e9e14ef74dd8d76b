"""``python -m sndr gc TREE``: remove the stored copies in ``.sndr/objects`` that the tree's ledger no longer names."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import add_json_option, path_text

HELP = ("Remove the stored copies in a tree's .sndr/objects that nothing reads any more: every apply keeps the "
        "files' pristine and patched bytes, the bytes each commit replaced and a copy of each ledger, so the "
        "directory grows with every apply and bump. Kept: the current ledger's copy and the pristine and "
        "patched copies it names (revert, --verify, apply --force and salvage-ledger need them). An interrupted "
        "commit is rolled back first, as every writer does; a ledger that does not read stops it (run "
        "salvage-ledger first). --dry-run lists what would go and touches nothing.")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("tree", type=path_text, metavar="TREE", help="the directory containing vllm/ and .sndr/ (or vllm/ itself), "
                                                 "or installed[:PYTHON], as apply's --tree")
    ap.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    add_json_option(ap, "the kept and removed copies")


def run(args: argparse.Namespace) -> int:
    from ..cli import check_output
    from ..cli import run as boundary

    def body() -> int:
        if args.json:
            check_output(args.json, "--json")  # before any work
        return _body(args.tree, args.dry_run, args.json)

    return boundary("sndr gc", body, on_interrupt=lambda: "each stored copy is removed whole or not at all; "
                                                          "re-run gc to finish")


def _body(spec: str, dry_run: bool, json_dest: str | None) -> int:
    import json
    import sys

    from ..cli import write_output
    from ..commit import collect_garbage
    from ..state import STATE_DIR
    from ..tree import directory

    tree: Path = directory(spec, dry_run=dry_run)  # the one tree rule: vllm/ itself means its parent
    found = collect_garbage(tree, dry_run=dry_run)
    freed = sum(size for _, size in found.removed)
    verb = "would remove" if dry_run else "removed"
    out = sys.stderr if json_dest == "-" else sys.stdout
    for sha, what in found.kept:
        print(f"  kept     {sha[:12]}  {what}", file=out)
    for sha, size in found.removed:
        print(f"  {verb:<8} {sha[:12]}  {size:,d} bytes", file=out)
    print(f"sndr gc: {tree / STATE_DIR / 'objects'}: {verb} {len(found.removed)} stored cop"
          f"{'y' if len(found.removed) == 1 else 'ies'} ({freed:,d} bytes); kept {len(found.kept)} (the ledger's "
          f"copy and the pristine and patched copies it names)", file=out)
    if json_dest:
        doc = {"tree": str(tree), "dry_run": dry_run,
               "kept": [{"sha256": sha, "what": what} for sha, what in found.kept],
               "removed": [{"sha256": sha, "bytes": size} for sha, size in found.removed], "freed_bytes": freed}
        write_output(json_dest, json.dumps(doc, indent=1) + "\n", "--json")
    return 0
