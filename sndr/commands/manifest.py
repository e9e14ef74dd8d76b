"""``python -m sndr manifest build|check``: anchors/vllm-<version>.json."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "Build or check anchors/vllm-<version>.json."


def add_arguments(ap: argparse.ArgumentParser) -> None:
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write anchors/vllm-<version>.json for a pristine tree (a tree sndr patched is "
                                     "read through its pristine copies in .sndr/objects)")
    b.add_argument("--tree", help="vllm==X, a directory, a .whl, git:REPO@REV (default: the pin of the one committed "
                                  "manifest)")
    b.add_argument("--patches", type=Path, help="patch directory (default: the shipped set)")
    b.add_argument("--out", type=Path, help="output directory (vllm-<version>.json is written into it; made if "
                                            "missing, never a symlink), a FILE.json, or - for stdout (default: "
                                            "the shipped anchors/)")
    c = sub.add_parser("check", help="exit 1 when a committed manifest does not match the patch set and pin")
    c.add_argument("--tree", help="tree to check against (default: the pin of every committed manifest)")
    c.add_argument("--patches", type=Path, help="patch directory (default: the shipped set)")
    c.add_argument("--anchors", type=Path, help="the directory that holds the manifests, each named "
                                                "vllm-<version>.json (a manifest file itself is refused; default: "
                                                "the shipped anchors/)")


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    def body() -> int:
        from ..manifest import run_manifest  # inside the boundary: an import failure is its exit 3 and line

        return run_manifest(args)

    return boundary("sndr manifest", body,
                    on_interrupt=lambda: "a manifest is written atomically: the old one or the new one is in place")
