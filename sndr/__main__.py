"""``python -m sndr <command>``: a thin dispatcher.

Each command lives in its own module and exposes ``cli_main(argv) -> int``;
modules are imported lazily so ``sndr status`` never pays for the planner.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "apply": ("sndr.apply", "apply, dry-run, verify or revert the patch set on a tree"),
    "schema": ("sndr.schema", "print the JSON Schema of {schemas}"),  # names filled in from sndr.schema
    "list": ("sndr.listing", "list the patch set (id, title, kind, default, upstream, files)"),
    "manifest": ("sndr.manifest", "build or check anchors/<pin>.json"),
    "preflight": ("sndr.preflight.cli", "classify the patch set on a pin and a candidate tree"),
    "vendor": ("sndr.upstream.vendor", "turn a unified diff into a patch file"),
    "import": ("sndr.upstream.series", "turn a quilt or git format-patch series into patch files"),
    "watchlist": ("sndr.upstream.watchlist", "lint, edit and evaluate the upstream watchlist"),
    "sync": ("sndr.upstream.sync", "plan the port queue of an upstream range"),
    "pin": ("sndr.upstream.pin", "advance the pin when every gate passes"),
    "status": ("sndr.startup.hook", "per-process attestations of the active patch set"),
    "hook": ("sndr.startup.hook", "install or remove the in-memory import hook (.pth)"),
}


def _usage() -> str:
    lines = ["usage: python -m sndr <command> [options]", "", "commands:"]
    from .schema import schema_names  # a dict of names: no model is imported

    names = "|".join(schema_names())
    lines += [f"  {name:<10} {doc.replace('{schemas}', names)}" for name, (_, doc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    process = argv is None  # a process (python -m sndr, the console script), not a library call
    argv = list(sys.argv[1:] if argv is None else argv)
    if process:  # Ctrl-C while the command imports: one line, exit 130
        from .cli import catch_early_interrupt

        catch_early_interrupt(f"sndr {argv[0]}" if argv else "sndr")
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"sndr: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if name == "apply" and "--verify" in rest:  # the warm fast path: no pydantic, no planner
        from .startup.verify import verify_main

        if process:
            from .cli import _restore_interrupt

            _restore_interrupt()
        return verify_main(rest, lambda argv: importlib.import_module("sndr.apply").cli_main(argv))
    module = importlib.import_module(COMMANDS[name][0])
    if process:
        from .cli import _restore_interrupt

        _restore_interrupt()  # the command's own boundary (cli.run) handles Ctrl-C from here on
    if name == "pin":
        return module.pin_main(rest)
    if name == "status":
        return module.status_main(rest)
    return module.cli_main(rest)


if __name__ == "__main__":
    from .cli import exit_with

    exit_with(main)
