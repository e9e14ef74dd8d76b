"""``python -m sndr apply`` (alias ``python -m sndr.apply``): apply, dry-run, verify or revert the patch set.

``--verify`` with nothing but ``--tree DIR``, ``--patches DIR`` and ``-q`` first asks the warm
fast path (:mod:`sndr.startup.verify`: no pydantic, no planner); anything it cannot answer
goes to the full verifier, which then primes the memos the fast path reads.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from . import add_json_option, path_text, path_value

if TYPE_CHECKING:
    from ..model import Report

HELP = "Apply the sndr patch set to a vLLM tree, transactionally."


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--tree", type=path_text, metavar="TREE",
                    help="the directory containing vllm/, or installed[:PYTHON] for the vLLM that interpreter imports "
                         "(default: where `import vllm` finds it, without importing it); with --dry-run also "
                         "vllm==X.Y.Z (sndr's cached copy). Apply writes, so it needs a directory: wheels and git: "
                         "trees are for `python -m sndr list` and `python -m sndr preflight`")
    ap.add_argument("--patches", type=path_value, help="patch directory (default: $SNDR_PATCHES, else the shipped set)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="simulate only; never writes")
    mode.add_argument("--verify", action="store_true", help="check the tree holds exactly this patch set")
    mode.add_argument("--revert", action="store_true", help="restore every touched file to pristine, byte-exact")
    ap.add_argument("--only", nargs="+", metavar="ID", help="only these patches (and what they require)")
    ap.add_argument("--force", action="store_true", help="proceed over files changed by someone else")
    ap.add_argument("--keep-going", action="store_true",
                    help="leave out whole every patch that cannot apply (and what requires it), apply the rest, "
                         "listing what was left out and why; exit 1 when one has on_failure = fail")
    ap.add_argument("--profile", type=path_value, metavar="FILE",
                    help="deployment profile for `when` predicates (TOML/JSON; default: $SNDR_PROFILE; "
                         "python -m sndr schema profile)")
    ap.add_argument("--allow-empty", action="store_true",
                    help="accept an empty patch set (applying it reverts every file the ledger holds)")
    add_json_option(ap, "the report")
    talk = ap.add_mutually_exclusive_group()  # -q -v together was read as -q, silently
    talk.add_argument("-q", "--quiet", action="store_true")
    talk.add_argument("-v", "--verbose", action="store_true", help="list every edit")


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    return boundary("sndr apply", lambda: _body(args), on_interrupt=lambda: _interrupted(args))


def _fast_eligible(args: argparse.Namespace) -> bool:
    """Only the plain ``--verify [--tree DIR] [--patches DIR] [-q]``: every other option is the full report's."""
    return bool(args.verify) and not (args.only or args.force or args.keep_going or args.profile
                                      or args.allow_empty or args.json or args.verbose)


#: Options a mode never reads, and why: refused rather than silently ignored (``--revert --only X`` used to
#: revert every file of the set).
_UNUSED = {
    "revert": {"only": "revert restores every file the ledger holds; to drop some patches, apply the set without "
                       "them (SNDR_ENABLE_<ID>=0, or --only the others)",
               "keep_going": "revert reads no patch set", "profile": "revert reads no patch set",
               "allow_empty": "revert reads no patch set"},
    "verify": {"force": "verify never writes", "keep_going": "verify checks the set the ledger holds; what apply "
                                                             "left out is listed"},
}


def _refuse_unused(args: argparse.Namespace) -> None:
    for dest, why in _UNUSED.get(_mode(args), {}).items():
        if getattr(args, dest):
            from ..errors import bad_input

            flag = "--" + dest.replace("_", "-")
            raise bad_input("usage", f"{flag} has no effect with --{_mode(args)}", key=flag, hint=why)


def _body(args: argparse.Namespace) -> int:
    _refuse_unused(args)
    from ..startup.plugincheck import finding

    excluded = finding()  # this environment's VLLM_PLUGINS leaves sndr out: said in every mode, even --quiet
    if excluded is not None:
        from ..stderr import say

        say(f"warning: {excluded}")
    if not _fast_eligible(args):
        return _full(args)
    from ..startup import verify

    patches = str(args.patches) if args.patches is not None else None
    code = verify.answer(args.tree, patches, args.quiet)
    if code is not None:
        return code
    code = _full(args)
    verify.prime(args.tree, patches, os.environ)
    return code


def _mode(args: argparse.Namespace) -> str:
    return "revert" if args.revert else "verify" if args.verify else "dry-run" if args.dry_run else "apply"


def _interrupted(args: argparse.Namespace) -> str:
    """The line printed after Ctrl-C: what state the tree is in and what to run."""
    if _mode(args) in ("dry-run", "verify"):
        return "nothing was written; run the command again"
    return ("the tree is whole: a commit that was in flight is rolled back (now, or by the next apply, verify or "
            "revert from its journal); run `python -m sndr.apply --verify` to see which set it holds")


def _full(args: argparse.Namespace) -> int:
    """The full command: the engine (sndr.apply), its report, ``--json`` and the exit status."""
    import json

    from ..cli import check_output
    from ..errors import SndrError

    if args.json:
        check_output(args.json, "--json")  # before any work: a refused output path changes nothing
    try:
        report = _report(args)
    except SndrError as exc:
        refused = any(p.code == "output_refused" and p.file == args.json for p in exc.problems)
        if args.json and not refused:  # the JSON reader still gets one document; the problems also go to stderr
            _write_json(args.json, {"ok": False, "exit_code": exc.exit_code,
                                    "problems": [p.to_json() for p in exc.problems]})
        raise
    if args.json:
        try:
            _write_json(args.json, json.loads(report.model_dump_json()))
        except BrokenPipeError:
            # `--json - | reader` whose reader left: the findings and the exit status still count (the human
            # report goes to stderr below); stdout points at devnull so the final flush does not raise again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, SndrError) as exc:
            # Checked before any work (check_output probes the directory), yet the write failed: the command's
            # work is done (an apply committed), so its report still prints, and the status never reads
            # "bad input, tree untouched" (2).
            from ..render import make_console, print_report

            print_report(report, verbose=args.verbose, console=make_console(stderr=True))
            why = "; ".join(p.render() for p in exc.problems) if isinstance(exc, SndrError) else str(exc)
            print(f"sndr apply: --json {args.json}: the report above could not be written there ({why}); the "
                  f"{_mode(args)} itself finished as the report says", file=sys.stderr)
            return report.exit_code or 1
    if not args.quiet or report.exit_code:
        from ..render import make_console, print_report

        # JSON on stdout means nothing else on stdout: the human report goes to stderr.
        print_report(report, verbose=args.verbose, console=make_console(stderr=args.json == "-"))
    return report.exit_code


def _report(args: argparse.Namespace) -> Report:
    from .. import PIN_VERSION, env
    from ..apply import _default_root, resolve_tree, run_apply, run_revert, run_verify
    from ..errors import Problem, SndrError
    from ..load import load_patch_set

    if args.tree is not None:
        root = resolve_tree(args.tree, dry_run=args.dry_run)
    else:
        root, fallback = _default_root()
        if fallback:
            if args.verify or args.revert:
                raise SndrError(Problem("vllm_not_found", "no installed vLLM to verify or revert", key="--tree",
                                        hint="pass --tree DIR (the directory containing vllm/)"))
            print(f"sndr apply: no vLLM is installed for this interpreter; dry-run of the patch set against the "
                  f"pinned vLLM {PIN_VERSION} tree ({root})", file=sys.stderr)
            args.dry_run = True
    _refuse_output_in_tree(args.json, root)
    from .. import caches

    # The shell hands the core its caches (compile-ok memo, scopes); the tree is never one. A dry run (also
    # the fallback one just decided) reads them and writes nothing under the cache root either.
    caches.enable(readonly=args.dry_run)
    if args.revert:
        return run_revert(root, force=args.force)
    from ..cli import pause_at

    pause_at("load")  # test-only (SNDR_TEST_PAUSE=load): a real Ctrl-C while the set loads
    patch_set = load_patch_set(args.patches)
    from ..plan import unknown_enable_vars

    ignored = unknown_enable_vars(patch_set, os.environ)  # said in the report, never silently ignored
    ignored += [w.render() for w in patch_set.warnings]
    if not patch_set.patches and not args.allow_empty:
        where = args.patches if args.patches is not None else "the patch directory in effect"
        raise SndrError(Problem("empty_patch_set", f"the patch set is empty (no patch in {where}); applying it would "
                                "revert every file sndr patched", key="--patches",
                                hint="pass --allow-empty to do that on purpose (or --revert), or fix --patches / "
                                     "$SNDR_PATCHES"))
    from ..profile import load_profile, profile_from_environ

    # $SNDR_PROFILE is read now, as --profile is: a profile that cannot be read is an error
    # (exit 2) even when no patch of the set uses `when`, never silently ignored.
    profile = load_profile(args.profile) if args.profile else (
        profile_from_environ(os.environ) if os.environ.get(env.PROFILE) else None)
    if args.verify:
        report = run_verify(root, patch_set, only=args.only, profile=profile,
                            edits=args.verbose or args.json is not None)
    else:
        announce = None if args.quiet else (lambda line: print(f"sndr apply: {line}", file=sys.stderr))
        report = run_apply(root, patch_set, dry_run=args.dry_run, force=args.force, only=args.only,
                           keep_going=args.keep_going, profile=profile, announce=announce)
    from ..startup.plugincheck import finding

    report.notes[:0] = ignored + [f for f in [finding()] if f is not None]  # and in --json
    return report


def _refuse_output_in_tree(dest: str | None, root: str | os.PathLike[str]) -> None:
    """``--json FILE`` inside the tree's ``vllm/`` package or its ``.sndr/`` would overwrite a file sndr patches
    or its own state after the commit (a report over ``vllm/x.py`` left verify failing; over
    ``.sndr/ledger.json``, the ledger corrupt): refused before any work, as every other unwritable output is
    (``output_refused``). Beside them (``site-packages/report.json``) is fine."""
    if dest is None or dest == "-":
        return
    from ..errors import bad_input

    where = os.path.realpath(dest)
    for part, what in (("vllm", "the vLLM package sndr patches"), (".sndr", "sndr's state of the tree")):
        inside = os.path.realpath(os.path.join(root, part))
        if where == inside or where.startswith(inside.rstrip(os.sep) + os.sep):
            raise bad_input("output_refused", f"--json: {dest} is inside {what} ({inside}): the report would "
                            f"overwrite a file sndr verifies; nothing was written", file=dest,
                            hint="write the report elsewhere (outside vllm/ and .sndr/), or to - for stdout")


def _write_json(target: str, data: dict[str, object]) -> None:
    import json

    from ..cli import write_output

    write_output(target, json.dumps(data, indent=2, sort_keys=False) + "\n", "--json")
