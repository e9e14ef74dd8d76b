"""``python -m sndr sync plan|decide|deviation``: the upstream port queue and the decisions kept across plans."""

from __future__ import annotations

import argparse

from . import add_json_option, path_text

HELP = "Plan the port queue of an upstream range; record decisions and deviations."


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from ..upstream.defaults import DECISIONS_NAME, SYNC_CONFIG_NAME

    sub = ap.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("plan", help="list, judge and order the commits of an upstream range")
    pl.add_argument("--repo", type=path_text, required=True, help="a vLLM git checkout holding the range")
    pl.add_argument("--from", dest="from_ref", required=True, metavar="PIN",
                    help="the pin (tag or sha); the range is FROM..TO, as git log reads it")
    pl.add_argument("--to", dest="to_ref", required=True, metavar="TARGET")
    pl.add_argument("--tree", type=path_text, help="the pin's tree the commits are judged against (default: the repo's working "
                    "tree; required for a bare repository); a tree of another version than the pin is refused")
    pl.add_argument("--patches", type=path_text, metavar="DIR", help="patch set whose files are mirrored (default: shipped set)")
    pl.add_argument("--surface", action="append", default=[], metavar="GLOB",
                    help="extra mirrored files (fnmatch; '*' crosses '/'); repeatable")
    pl.add_argument("--config", type=path_text, metavar="FILE",
                    help=f"TOML with surface = [globs] (default: <patches>/{SYNC_CONFIG_NAME} if present)")
    pl.add_argument("--decisions", metavar="PATH", type=path_text, help=f"kept decisions and deviations (default: "
                    f"<patches>/{DECISIONS_NAME} if present)")
    pl.add_argument("--select", metavar="SHA,...",
                    help="queue only these commits (refused if it splits a revert pair or a series)")
    add_json_option(pl, "the queue report")
    pl.add_argument("--md", metavar="PATH", type=path_text, help="write the Markdown report here ('-' for stdout)")

    de = sub.add_parser("decide", help="record the decision on one queued commit (kept across re-plans)")
    de.add_argument("sha", nargs="?", help="the upstream commit (7 to 40 hex digits)")
    de.add_argument("--from-file", type=path_text, metavar="FILE", help="record many decisions at once: a YAML list of rows with "
                    "the decisions file's keys (sha, tier, resolution, note), checked first, written once")
    de.add_argument("--repo", type=path_text, metavar="REPO", help="without --queue: the vLLM git checkout that resolves the sha "
                    "(refused when it names no commit there)")
    de.add_argument("--tier", choices=("PORT-NOW", "INVENTORY", "IGNORE"))
    de.add_argument("--resolution", metavar="TEXT",
                    help="'ported-as PN0123', 'not-needed <reason>' or 'deferred'")
    de.add_argument("--note", metavar="TEXT")
    de.add_argument("--queue", type=path_text, metavar="QUEUE.json", help="resolve a short sha and take the subject from this "
                    "`sync plan --json` report; its recorded patch dir is the default --patches")
    de.add_argument("--patches", type=path_text, metavar="DIR", help="patch set the decisions belong to (default: the queue's "
                    "recorded patch dir, else $SNDR_PATCHES; never an installed sndr's shipped data)")
    de.add_argument("--decisions", metavar="PATH", type=path_text, help=f"default: <patches>/{DECISIONS_NAME}")
    de.add_argument("--allow-unknown", action="store_true", help="accept 'ported-as ID' for an id the patch set "
                    "does not have yet (pin advance still refuses it until the patch exists)")

    dv = sub.add_parser("deviation", help="record, review or drop a deviation from upstream")
    dv.add_argument("patch", help="the patch id that carries the deviation")
    dv.add_argument("--upstream", metavar="vllm#N", help="the upstream PR it deviates from")
    dv.add_argument("--why", metavar="TEXT")
    dv.add_argument("--discharge", metavar="SHA|vllm#N", help="the upstream commit that will discharge it")
    dv.add_argument("--paths", type=path_text, metavar="FILE,...", help="files it lives in (default: the patch's files)")
    dv.add_argument("--reviewed", metavar="TARGET", help="the target it was reviewed for (gates pin advance)")
    dv.add_argument("--drop", action="store_true", help="remove it (discharged upstream)")
    dv.add_argument("--patches", type=path_text, metavar="DIR", help="patch set the deviation belongs to (default: $SNDR_PATCHES; "
                    "never an installed sndr's shipped data)")
    dv.add_argument("--allow-unknown", action="store_true", help="accept a patch id the patch set does not have "
                    "(yet); give --paths, or the deviation lives in no file")
    dv.add_argument("--decisions", metavar="PATH", type=path_text, help=f"default: <patches>/{DECISIONS_NAME}")


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    def body() -> int:
        from ..upstream.sync import run_sync

        return run_sync(args)

    return boundary("sndr sync", body, on_interrupt=lambda: "nothing was written (reports and the decisions file are "
                                                            "written at the end, atomically); run the command again")
