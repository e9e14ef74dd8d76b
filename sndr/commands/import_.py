"""``python -m sndr import quilt|mbox|genesis``: a patch series into sndr patch files, in series order."""

from __future__ import annotations

import argparse

from . import add_json_option, path_text, path_value

HELP = ("Turn a patch series (quilt, git format-patch) into sndr patch files, in series order with after "
        "chains.")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("kind", choices=["quilt", "mbox", "genesis"],
                    help="quilt: a directory with a series file; mbox: numbered format-patch files, or one mbox "
                         "file; genesis: a checkout of the seed system (its text patchers and registry, read "
                         "statically)")
    ap.add_argument("src", type=path_value, help="the series (genesis: the checkout's root)")
    ap.add_argument("--to", required=True, type=path_value, dest="out",
                    help="directory to write the patch files and _import.json into (made if missing, never a symlink)")
    ap.add_argument("--tree", type=path_text, help="the pin: a directory containing vllm/, a wheel, or vllm==X.Y.Z (quilt and mbox "
                                   "place each hunk on it; genesis converts without a tree)")
    ap.add_argument("--prefix", default=None, help="id prefix (default: Q for quilt, M for mbox): Q001, Q002, ...")
    ap.add_argument("--force", action="store_true", help="overwrite existing patch files")
    add_json_option(ap, "the import report")
    ap.add_argument("-q", "--quiet", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..cli import check_output
    from ..cli import run as boundary

    def body() -> int:
        if str(args.out) == "-":  # '-' is stdout for every output; an import writes several files
            from ..errors import bad_input

            raise bad_input("usage", "--to - : an import writes one patch file per member and its report, so it "
                            "needs a directory, not stdout", key="--to", hint="e.g. --to patches/")
        # before any work and any engine import: a refused output path changes nothing. --to DIR is the directory
        # the user named: never a symlink (to a directory elsewhere), a FIFO or a file, and one that takes a file
        check_output(args.out, "--to", directory=True)
        if args.json:
            check_output(args.json, "--json")
        from ..upstream.series import run_import

        return run_import(args)

    return boundary("sndr import", body,
                    on_interrupt=lambda: "each patch file is written atomically; the report may be missing")
