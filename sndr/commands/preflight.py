"""``python -m sndr preflight``: arguments, outputs, exit status (through :func:`sndr.cli.run`).

The engine (:mod:`sndr.preflight`: the models, the analysis, the renderers) is imported inside
:func:`run`, so ``--help`` and a usage error import none of it.
"""

from __future__ import annotations

import argparse

from . import add_json_option, path_text

HELP = "Classify the patch set on a pin and a candidate vLLM tree."


def _parse_fail_on(values: list[str] | None) -> list[str]:
    from ..errors import bad_input
    from ..preflight.models import FAIL_ON_CHOICES

    out: list[str] = []
    for v in values or ["drift"]:
        for part in v.split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part not in FAIL_ON_CHOICES:
                raise bad_input("bad_fail_on", f"--fail-on {part!r}: choose from {', '.join(FAIL_ON_CHOICES)}",
                                key="--fail-on")
            out.append(part)
    return out or ["drift"]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--patches", type=path_text, metavar="DIR", help="patch directory (default: the shipped set)")
    ap.add_argument("--pin", type=path_text, required=True, metavar="TREE", help="dir, wheel, vllm==X, git:REPO@REV or installed")
    ap.add_argument("--candidate", type=path_text, required=True, metavar="TREE",
                    help="the vLLM to move to, in the same forms; the pin's own tree is refused (same_tree, exit 2), "
                         "the pin's version with other files runs with a warning (same_version)")
    add_json_option(ap, "the preflight report")
    ap.add_argument("--markdown", metavar="OUT", type=path_text, help="write the Markdown report ('-' for stdout)")
    ap.add_argument("--sarif", metavar="OUT", type=path_text, help="write SARIF 2.1.0 ('-' for stdout)")
    ap.add_argument("--github", action="store_true", help="print GitHub workflow annotations")
    ap.add_argument("--fail-on", action="append", metavar="CLASS",
                    help="drift (default), ambiguous, any, config, none; repeat or comma-separate")
    ap.add_argument("--watch", type=path_text, metavar="FILE", help="watch config for the configuration-drift section (default: sndr.toml/pyproject.toml found upward)")
    ap.add_argument("--no-config", action="store_true", help="skip the configuration-drift section")
    ap.add_argument("--no-suggestions", action="store_true", help="skip relocation suggestions")
    ap.add_argument("--only", metavar="IDS", help="comma-separated patch ids (plus what they require)")
    ap.add_argument("--enable-all", action="store_true", help="classify default-off patches too (SNDR_ENABLE_<ID>=1 for all)")
    ap.add_argument("--check-compile", action="store_true", help="also compile every patched file of both plans")
    ap.add_argument("--via", metavar="V1,V2|auto",
                    help="follow drifted anchors release by release: the given releases (or tree specs) between pin "
                         "and candidate, or 'auto' for the published releases in between (last patch of each minor)")
    talk = ap.add_mutually_exclusive_group()  # -q -v together was read as -q, silently
    talk.add_argument("-q", "--quiet", action="store_true", help="no terminal report")
    talk.add_argument("-v", "--verbose", action="store_true")


def _stdout_outputs(args: argparse.Namespace) -> list[str]:
    named = [f"--{k} -" for k in ("json", "markdown", "sarif") if getattr(args, k) == "-"]
    return named + (["--github"] if args.github else [])


def _via(value: str | None) -> list[str] | str | None:
    """``--via auto`` or ``--via 0.27.0,0.30.0`` (versions or any tree specs)."""
    if value is None:
        return None
    from ..errors import bad_input

    if value.strip().lower() == "auto":
        return "auto"
    parts = [v.strip() for v in value.split(",") if v.strip()]
    if not parts:
        raise bad_input("bad_via", "--via needs 'auto' or a comma-separated list of releases", key="--via",
                        hint="e.g. --via 0.27.0,0.30.0 or --via auto")
    return parts


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    return boundary("sndr preflight", lambda: _body(args),
                    on_interrupt=lambda: "nothing was written to any tree; run the preflight again")


def _body(args: argparse.Namespace) -> int:
    import json
    import time

    from ..cli import check_output, write_output
    from ..errors import bad_input

    # The command line and the output paths first: a refused one stops before the engine is imported.
    to_stdout = _stdout_outputs(args)
    if len(to_stdout) > 1:
        raise bad_input("stdout_conflict", f"{' and '.join(to_stdout)} would both write to stdout",
                        hint="send all but one to a file")
    via = _via(args.via)
    for flag in ("json", "markdown", "sarif"):
        if getattr(args, flag):
            check_output(getattr(args, flag), f"--{flag}")  # before any work
    fail_on = _parse_fail_on(args.fail_on)  # its choices live with the report models

    from .. import caches
    from ..load import load_patch_set
    from ..preflight.analysis import run_preflight
    from ..preflight.annotations import github_annotations, render_sarif
    from ..preflight.render import render_markdown, render_terminal

    caches.enable()  # the shell turns on the planner's disk caches (qualname spans, compile memo)
    patch_set = load_patch_set(args.patches)
    only = [i.strip() for i in args.only.split(",") if i.strip()] if args.only else None
    t0 = time.perf_counter()
    report = run_preflight(patch_set, args.pin, args.candidate, only=only, suggestions=not args.no_suggestions,
                           config=not args.no_config, watch=args.watch, check_compile=args.check_compile,
                           enable_all=args.enable_all, fail_on=fail_on, via=via)
    elapsed = time.perf_counter() - t0
    from ..stderr import say

    for w in report.warnings:  # stderr, whatever owns stdout: a --json - document stays the only thing there
        say(f"preflight: warning: {w.render()}")
    if args.json:
        write_output(args.json, report.model_dump_json(indent=2) + "\n", "--json")
    if args.markdown:
        write_output(args.markdown, render_markdown(report, patch_set), "--markdown")
    if args.sarif:
        write_output(args.sarif, json.dumps(render_sarif(report), indent=2) + "\n", "--sarif")
    if args.github:
        for line in github_annotations(report):
            print(line)
    if not args.quiet:
        from ..render import make_console

        # The terminal report goes to stdout unless a machine output owns it.
        console = make_console(stderr=bool(to_stdout))
        render_terminal(report, console, verbose=args.verbose)
        if args.verbose:
            console.print(f"({elapsed:.2f}s)")
    return report.summary.exit_code
