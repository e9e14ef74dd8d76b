"""``python -m sndr status``: one line per vLLM process, the patch set it attested."""

from __future__ import annotations

import argparse

from . import add_json_option, path_text

HELP = ("One line per vLLM process: the patch set it attested. Exit 1 if processes disagree, one misses a required "
        "patch, a record is not valid, or the tree no longer holds the set and the file hashes a live process "
        "attested (re-applied, reverted or changed under it).")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--run-dir", type=path_text, help="attestation directory (default: $SNDR_RUN_DIR, or the default for --tree)")
    ap.add_argument("--tree", type=path_text, help="directory containing vllm/ (or vllm/ itself), or installed[:PYTHON] "
                                   "(default: where `import vllm` finds it)")
    ap.add_argument("--live", action="store_true", help="only processes that are still running")
    ap.add_argument("--prune", action="store_true", help="delete the records of processes that have exited")
    add_json_option(ap, "the records and the verdict")
    ap.add_argument("--prometheus", metavar="FILE", type=path_text,
                    help="also write the live processes' patch-set gauges to FILE in the Prometheus text format, "
                         "atomically (for node_exporter's textfile collector; see docs/deploy.md)")


def run(args: argparse.Namespace) -> int:
    from ..cli import check_output
    from ..cli import run as boundary

    def body() -> int:
        if args.json == "-" and args.prometheus == "-":
            from ..errors import bad_input

            raise bad_input("stdout_conflict", "--json - and --prometheus - would both write to stdout",
                            key="--prometheus", hint="send one of them to a file")
        for flag in ("json", "prometheus"):  # before any work (--prune deletes records) and any engine import
            if getattr(args, flag):
                check_output(getattr(args, flag), f"--{flag}")
        if args.prometheus:
            try:
                import prometheus_client  # noqa: F401 - the textfile's writer; its absence is bad input, said now
            except ImportError:
                from ..errors import bad_input

                raise bad_input("extra_missing", "--prometheus needs prometheus_client", key="--prometheus",
                                hint="pip install prometheus-client") from None
        from ..startup.hook import run_status

        return run_status(args)

    return boundary("sndr status", body, on_interrupt=lambda: "nothing was changed (status only reads attestation "
                                                               "records)")
