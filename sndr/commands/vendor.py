"""``python -m sndr vendor``: turn a unified diff into a patch file for a pinned vLLM tree."""

from __future__ import annotations

import argparse

from . import add_json_option, path_text

HELP = "Turn a unified diff (git format-patch, git diff, diff -u) into a patch file for a pinned vLLM tree."


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from ..upstream.defaults import DEFAULT_FUZZ, DEFAULT_MAX_CONTEXT

    ap.add_argument("--diff", type=path_text, required=True, help="the diff file ('-' for stdin)")
    ap.add_argument("--id", required=True, dest="patch_id", help="patch id, e.g. PN0101")
    ap.add_argument("--title", help="patch title (default: the Subject: of a format-patch mail)")
    ap.add_argument("--upstream", action="append", metavar="REF",
                    help="upstream reference, e.g. vllm#12345 (repeatable; default: the (#N) of the Subject)")
    ap.add_argument("--tree", type=path_text, required=True, help="the pin: a directory containing vllm/, a wheel, or vllm==X.Y.Z")
    ap.add_argument("--out", default=None, type=path_text,
                    help="directory to write <ID>-<slug>.toml into (made if missing, never a symlink), or a .toml "
                         "path (- : stdout, as --stdout); "
                         "default: the patch set in effect ($SNDR_PATCHES, else the shipped set of a checkout), "
                         "never the working directory; an installed sndr's shipped data is refused")
    ap.add_argument("--marker", action="append", default=[], metavar="EDIT=TEXT",
                    help="merged marker for an edit (by name, or by hunk number across the diff); repeatable")
    ap.add_argument("--vllm", default="", metavar="SPEC", help="PEP 440 specifier for the patch's vllm key")
    ap.add_argument("--max-context", type=int, default=DEFAULT_MAX_CONTEXT,
                    help=f"lines of context an anchor may take on each side (default {DEFAULT_MAX_CONTEXT})")
    ap.add_argument("--fuzz", type=int, default=DEFAULT_FUZZ,
                    help=f"diff context lines that may be dropped to place a hunk (default {DEFAULT_FUZZ})")
    ap.add_argument("-p", "--strip", type=int, default=None, metavar="N",
                    help="strip N leading path components (default: git's a/ b/, then from the first vllm/)")
    ap.add_argument("--include", action="append", default=[], metavar="GLOB", help="only files matching (repeatable)")
    ap.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="drop files matching (repeatable)")
    ap.add_argument("--stdout", action="store_true", help="print the patch file instead of writing it")
    ap.add_argument("--force", action="store_true", help="overwrite an existing patch file")
    add_json_option(ap, "the vendor report")
    ap.add_argument("-q", "--quiet", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    def body() -> int:
        from ..upstream.vendor import run_vendor

        return run_vendor(args)

    return boundary("sndr vendor", body,
                    on_interrupt=lambda: "no patch file was written (it is written atomically at the end)")
