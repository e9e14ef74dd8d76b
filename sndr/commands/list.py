"""``python -m sndr list``: the patch set at a glance (and each patch's verdict on a tree)."""

from __future__ import annotations

import argparse

from . import add_json_option, path_text

HELP = ("List the patch set: id, title, kind, default, upstream and files; with --tree, each patch's verdict on "
        "that tree.")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--patches", type=path_text, help="patch directory (default: the shipped set)")
    ap.add_argument("--tree", type=path_text, help="a vLLM tree: a directory containing vllm/, a wheel, or vllm==X.Y.Z")
    # The verdict names come from the models (pydantic): checked when the command runs, so --help stays light.
    ap.add_argument("--verdict", metavar="VERDICT",
                    help="with --tree: only patches with this plan status (applies, applied, merged, gated, failed, "
                         "partial, ...) or edit verdict (drifted, ambiguous, file_missing, ...); another name is "
                         "refused with the full list")
    ap.add_argument("--kind", choices=("text", "runtime", "plugin"), help="only patches of this kind")
    ap.add_argument("--profile", type=path_text, metavar="FILE",
                    help="a deployment profile (TOML/JSON, see python -m sndr schema profile): which patches it "
                         "gets (enabled) and why the others are gated; default: $SNDR_PROFILE with --tree")
    add_json_option(ap, "the rows")


def run(args: argparse.Namespace) -> int:
    from ..cli import check_output
    from ..cli import run as boundary

    def body() -> int:
        if args.json:
            check_output(args.json, "--json")  # before any work and any engine import
        from ..listing import run_list

        return run_list(args)

    return boundary("sndr list", body, on_interrupt=lambda: "nothing was written; run it again")
