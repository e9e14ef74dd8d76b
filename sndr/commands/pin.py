"""``python -m sndr pin show|advance``: the pin record, and advancing it when every gate passes."""

from __future__ import annotations

import argparse

from . import path_text

HELP = "Show the pin, or advance it when the preflight, manifest, queue, deviation and benchmark gates pass."


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from ..env import PIN_FILE_NAME

    sub = ap.add_subparsers(dest="cmd", required=True)
    sh = sub.add_parser("show", help="print the recorded pin")
    sh.add_argument("--pin-file", metavar="PATH", type=path_text)
    sh.add_argument("--patches", type=path_text, metavar="DIR", help=f"patch set whose {PIN_FILE_NAME} to read (default: "
                    "$SNDR_PATCHES, else the shipped set)")
    ad = sub.add_parser("advance", help="record a new pin when the preflight, manifest, queue, deviation and benchmark gates pass")
    ad.add_argument("--to", required=True, metavar="VERSION|SHA")
    ad.add_argument("--preflight", type=path_text, metavar="REPORT.json", help="preflight of the patch set on the target")
    ad.add_argument("--queue", type=path_text, metavar="QUEUE.json", help="`sync plan --json` of the range up to the target")
    ad.add_argument("--manifest", type=path_text, metavar="PATH", help="manifest of the target (default: anchors/<to>.json)")
    ad.add_argument("--patches", type=path_text, metavar="DIR", help="patch set being advanced: the preflight, manifest and queue "
                    "must be of it (default: the queue's recorded patch dir, else $SNDR_PATCHES, else the shipped "
                    "set)")
    ad.add_argument("--pin-file", metavar="PATH", type=path_text, help=f"pin record to write (default: <patches>/{PIN_FILE_NAME}; "
                    "never an installed sndr's shipped data)")
    ad.add_argument("--version", help="vLLM version to record when --to is a commit")
    ad.add_argument("--tree", type=path_text, help="target tree to take the digest from (any tree spec)")
    ad.add_argument("--decisions", metavar="PATH", type=path_text, help="kept decisions and deviations (default: "
                    "<patches>/sync-decisions.yaml)")
    bench = ad.add_mutually_exclusive_group()  # a reference and a waiver of it cannot both hold
    bench.add_argument("--benchmark-ref", type=path_text, metavar="FILE", help="benchmark reference re-measured on the target "
                    "(required; must be newer than the preflight)")
    bench.add_argument("--no-benchmark-ref", metavar="REASON", help="advance without a benchmark reference; the "
                    "reason is recorded in the pin")
    ad.add_argument("--perf-ref", type=path_text, metavar="FILE", action="append", default=[],
                    help="a performance plugin's benchmark JSON ({\"plugin\": ID, \"vllm\": X, ...}) measured "
                         "against the target's kernels, newer than the preflight; needed for each plugin the "
                         "preflight marks re-measure (repeatable)")
    ad.add_argument("--no-perf-ref", metavar="ID=REASON", action="append", default=[],
                    help="advance without re-measuring plugin ID; the reason is recorded in the pin (repeatable)")
    ad.add_argument("--dry-run", action="store_true", help="check the gates, write nothing")


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    def body() -> int:
        from ..upstream.pin import run_pin

        return run_pin(args)

    return boundary("sndr pin", body, on_interrupt=lambda: "the pin file is unchanged (written atomically)")
